"""Alerts, silences and notifications: `alerts`, `accept`, `silence create|list|expire`, `notify drain`."""

from __future__ import annotations

from typing import Annotated

import pandas as pd
import typer
from rich.markup import escape
from rich.text import Text

from monitor import config as config_mod
from monitor.cli.common import (
    Format,
    Service,
    Services,
    err,
    fail,
    load_config,
    one_service,
    open_store,
    out,
    parse_now,
    render,
    some_services,
)
from monitor.investigate.output import table

silence_app = typer.Typer(no_args_is_help=True, help="Silences: mute notifications of matching alerts for a while.")
notify_app = typer.Typer(no_args_is_help=True, help="Notifications: send what the outbox holds.")


def alerts_list(
    show_all: Annotated[bool, typer.Option("--all", help="Also inactive and resolved alerts.")] = False,
    now: Annotated[str | None, typer.Option(help="The clock for silences (RFC 3339); default: now.")] = None,
    service: Services = None,
    fmt: Format = "table",
) -> None:
    """List active (pending and firing) alerts with their verdict, since when, what mutes them, and whether
    their notifications went out; the table most severe first (firing, then pages), then newest."""
    from monitor.alerts.alert import Alert
    from monitor.alerts.silence import muted_by
    from monitor.notify import undeliverable
    from monitor.notify.outbox import UNDELIVERABLE

    cfg = load_config()
    names = {s.name for s in some_services(cfg, service)}
    store = open_store(cfg)
    clock = parse_now(now)
    here = undeliverable(cfg)  # this process's environment: a note, never what the daemon did
    with store.transaction() as session:
        rows = store.alerts.load(session, by_name=True)
        silences = store.silences.load(session, clock)
        incidents = store.incidents.load(session, service=service, status="open")
        # Each group's newest incident, open or resolved: a resolved alert's resolve notice is shown too.
        by_group: dict[str, dict] = {}
        for i in store.incidents.load(session, service=service):
            by_group.setdefault(i["fingerprint"], i)
        items = store.outbox.of_incidents(session, [i["id"] for i in by_group.values()])
    outbox: dict[int, list] = {}
    for item in items:
        outbox.setdefault(item["incident_id"], []).append(item)
    stored_why = sorted({i["last_error"].removeprefix(UNDELIVERABLE) for i in items
                         if i["status"] == "pending" and (i["last_error"] or "").startswith(UNDELIVERABLE)})
    alerts = [Alert(r.fingerprint, dict(r.labels or {}), r.state, r.active_since, r.fired_at, r.resolved_at,
                    r.last_active_at, r.last_eval_at, dict(r.annotations or {})) for r in rows]
    firing = [a for a in alerts if a.state == "firing"]
    # An alert of no one service (the daemon's own) is shown with every service.
    shown = [a for a in alerts if (show_all or a.state in ("pending", "firing"))
             and a.labels.get("service", next(iter(names))) in names]
    groups = {r.fingerprint: r.group_fingerprint for r in rows}
    records = [{"fingerprint": a.fingerprint, "state": a.state, "labels": a.labels,
                "since": (a.fired_at or a.active_since or a.resolved_at),
                # A resolved alert says why: fixed, rolled back, or no traffic.
                "summary": (f"resolved ({a.annotations['resolution']}): " if a.state == "resolved"
                            and a.annotations.get("resolution") else "") + a.annotations.get("summary", ""),
                "muted": muted_by(a, firing, silences, cfg.alerts, clock),
                **_delivery(cfg, by_group.get(groups.get(a.fingerprint)), outbox)}
               for a in shown]
    if fmt != "table":
        render(records, fmt, lambda: None, document={
            "alerts": records, "open_incidents": incidents,
            "notifications_undeliverable": "; ".join(stored_why) or None,
            "undeliverable_from_here": here or None})
        return
    rows_shown = [{"state": r["state"], "alert": r["labels"].get("alertname", ""),
                   "labels": {k: v for k, v in r["labels"].items() if k != "alertname"}, "since": r["since"],
                   "notified": r["delivery"], "summary": r["summary"], "muted": r["muted"]}
                  for r in sorted(records, key=_severity)]
    if rows_shown:
        # Columns most telling first: at 80 columns the last are left out and named, none is cut.
        out.print(table(pd.DataFrame(rows_shown), f"alerts ({len(shown)} shown, {len(incidents)} open incident(s))",
                        width=out.width, keep=("notified", "summary")))
    if stored_why:
        err.print(f"[red]error:[/] notifications undeliverable: {escape('; '.join(stored_why))}", highlight=False)
    if here and here not in stored_why:
        err.print(f"[yellow]note:[/] this shell could not send notifications itself ({escape(here)}); the "
                  "notified column is what the daemon stored", highlight=False)
    if not shown:
        out.print("[green]no active alerts[/]")


STATE_RANK = {"firing": 0, "pending": 1, "resolved": 2, "inactive": 3}


def _severity(record: dict) -> tuple:
    """Most severe first: firing before pending before the rest, pages before warnings, then the newest."""
    from monitor.alerts.alert import SEVERITY_RANK

    since = record["since"].timestamp() if record["since"] else 0.0
    return (STATE_RANK.get(record["state"], 4), SEVERITY_RANK.get(record["labels"].get("severity"), 3), -since)


def _delivery(cfg, incident: dict | None, outbox: dict[int, list[dict]]) -> dict:
    """What became of an alert's notifications, from its incident's outbox items as the daemon stored them
    (never from this process's environment): `delivery`, one line, and `notifications`, each item."""
    from monitor.notify.outbox import AMBIGUOUS, UNDELIVERABLE

    items = outbox.get(incident["id"], []) if incident is not None else []
    shown = [{"kind": i["kind"], "to": _destination(i, incident), "status": i["status"], "attempts": i["attempts"],
              "created_at": i["created_at"], "sent_at": i["sent_at"],
              "next_attempt_at": i["next_attempt_at"] if i["status"] == "pending" else None,
              "error": i["last_error"]} for i in items]
    if not items:
        none = cfg.alerts.slack is None and cfg.alerts.alertmanager is None
        return {"delivery": "not configured" if none else "-", "notifications": []}
    pending = [i for i in items if i["status"] == "pending"]
    failed = [i for i in items if i["status"] == "failed"]
    undeliverable = [i for i in pending if (i["last_error"] or "").startswith(UNDELIVERABLE)]
    to = ", ".join(dict.fromkeys(n["to"] for n in shown))
    if undeliverable:
        text = (f"UNDELIVERABLE ({len(pending)} waiting): "
                + undeliverable[-1]["last_error"].removeprefix(UNDELIVERABLE))
    elif failed:
        text = f"failed to {_destination(failed[-1], incident)}: {failed[-1]['last_error'] or 'error'}"
    elif any(i["attempts"] for i in pending):
        retry = next(i for i in reversed(pending) if i["attempts"])
        text = (f"retrying ({len(pending)} waiting, {retry['attempts']} attempts) to {to}: "
                f"{(retry['last_error'] or 'error').removeprefix(AMBIGUOUS)}")
    elif pending:
        text = f"pending ({len(pending)}) to {to}"
    else:
        text = f"sent to {to}" + (f" ({len(items)} messages)" if len(items) > 1 else "")
    return {"delivery": text, "notifications": shown}


def _destination(item: dict, incident: dict | None) -> str:
    """Where an outbox item goes: Alertmanager, or the Slack channel it was routed to."""
    from monitor.alerts.group import ALERT

    if item["kind"] == ALERT:
        return "Alertmanager"
    return item["channel"] or (incident or {}).get("channel") or "Slack"


@silence_app.command("create")
def silence_create(
    matcher: Annotated[list[str] | None, typer.Option("--matcher", "-m", help="label=value, label!=value, "
                                                       "label=~regex or label!~regex; repeat for several (all must "
                                                       "match).")] = None,
    service: Annotated[str | None, typer.Option("--service", "-s", help="Only alerts of this service (the "
                                                "matcher service=NAME).")] = None,
    duration: Annotated[str, typer.Option(help="How long, e.g. 2h, 30m, 1d.")] = "2h",
    comment: Annotated[str, typer.Option(help="Why (shown in `silence list`).")] = "",
    created_by: Annotated[str | None, typer.Option("--by", help="Who (default: $USER).")] = None,
    now: Annotated[str | None, typer.Option(help="Start (RFC 3339); default: now.")] = None,
    fmt: Format = "table",
) -> None:
    """Mute notifications of every alert matching all the matchers (and of `--service`), for `duration`."""
    import getpass

    from monitor.alerts.silence import parse_matcher

    if not matcher and service is None:
        fail("give at least one --matcher or --service")
    try:
        matchers = [parse_matcher(m) for m in matcher or []]
        length = config_mod.parse_duration(duration)
    except ValueError as exc:
        fail(str(exc))
    if length.total_seconds() <= 0:
        fail(f"--duration: must be positive, got {duration!r}")
    cfg = load_config()
    if service is not None:
        matchers.append({"name": "service", "op": "=", "value": one_service(cfg, service).name})
    store = open_store(cfg)
    start = parse_now(now)
    with store.transaction() as session:
        sid = store.silences.add(session, matchers, created_by or getpass.getuser(), comment, start, start + length)
    record = {"id": sid, "matchers": matchers, "starts_at": start, "ends_at": start + length}
    render([record], fmt, lambda: out.print(
        f"silence {sid} until {start + length:%Y-%m-%d %H:%M} UTC: "
        + ", ".join(f"{m['name']}{m['op']}{m['value']}" for m in matchers), highlight=False, soft_wrap=True),
        document=record)


def accept(
    version: Annotated[str, typer.Argument(help="The version value: a model_version, preprocess_version or config_hash.")],
    service: Service = None,
    comment: Annotated[str, typer.Option(help="Why it is good.")] = "",
    accepted_by: Annotated[str | None, typer.Option("--by", help="Who (default: $USER).")] = None,
    now: Annotated[str | None, typer.Option(help="When (RFC 3339); default: now.")] = None,
    fmt: Format = "table",
) -> None:
    """Accept a version as good: its windows are then compared with its own history, not with the last
    accepted version before it (see docs/alerts.md, Baselines)."""
    import getpass

    cfg = load_config()
    name = one_service(cfg, service).name
    store = open_store(cfg)
    with store.transaction() as session:
        seen = [v for v in store.versions.load(session, name) if v["value"] == version]
        new = store.versions.accept(session, name, version, parse_now(now), accepted_by or getpass.getuser(), comment)
    what = ", ".join(f"{v['kind']} first seen {v['first_seen']:%Y-%m-%d %H:%M} UTC" for v in seen) or "not seen yet"
    record = {"service": name, "version": version, "accepted": new, "seen": seen}
    render([record], fmt, lambda: out.print(
        f"{escape(name)}: {escape(version)} {'accepted' if new else 'was already accepted'} ({what})",
        highlight=False), document=record)


@silence_app.command("list")
def silence_list(
    show_all: Annotated[bool, typer.Option("--all", help="Also expired silences.")] = False,
    now: Annotated[str | None, typer.Option(help="The clock (RFC 3339); default: now.")] = None,
    service: Annotated[str | None, typer.Option("--service", "-s", help="Only silences that can mute alerts of "
                                                "this service.")] = None,
    fmt: Format = "table",
) -> None:
    """List silences in force (or all of them)."""
    from monitor.alerts.silence import matches

    cfg = load_config()
    names = [s.name for s in some_services(cfg, service)]
    store = open_store(cfg)
    clock = parse_now(now)
    with store.transaction() as session:
        rows = store.silences.load(session, None if show_all else clock)
    if service is not None:  # its matchers on `service` hold for this one (no such matcher: every service)
        rows = [r for r in rows if matches({"service": names[0]}, [m for m in r["matchers"] if m["name"] == "service"])]
    records = [{**r, "state": "active" if r["starts_at"] <= clock < r["ends_at"]
                else ("expired" if r["ends_at"] <= clock else "pending")} for r in rows]
    if fmt != "table":
        render(records, fmt, lambda: None)
        return
    frame = pd.DataFrame([{"id": r["id"], "state": r["state"], "matchers": ", ".join(
        f"{m['name']}{m['op']}{m['value']}" for m in r["matchers"]), "starts_at": r["starts_at"], "ends_at": r["ends_at"],
        "comment": r["comment"], "created_by": r["created_by"]} for r in records])
    if len(frame):
        out.print(table(frame, "silences", width=out.width))
    else:
        out.print("[dim]no silences[/]")


@silence_app.command("expire")
def silence_expire(
    silence_id: Annotated[int, typer.Argument(help="The silence id (see `tailwatch silence list`).")],
    now: Annotated[str | None, typer.Option(help="The clock (RFC 3339); default: now.")] = None,
    fmt: Format = "table",
) -> None:
    """End a silence now."""
    cfg = load_config()
    store = open_store(cfg)
    clock = parse_now(now)
    with store.transaction() as session:
        done = store.silences.expire(session, silence_id, clock)
    if not done:
        fail(f"no silence {silence_id} in force")
    record = {"id": silence_id, "expired_at": clock}
    render([record], fmt, lambda: out.print(f"silence {silence_id} expired"), document=record)


@notify_app.command("drain")
def notify_drain(
    now: Annotated[str | None, typer.Option(help="The clock (RFC 3339); default: now.")] = None,
    fmt: Format = "table",
) -> None:
    """Send the notifications due in the outbox (retries wait for their backoff)."""
    from monitor.notify import drain

    cfg = load_config()
    store = open_store(cfg)
    report = drain(cfg, store, parse_now(now))
    if fmt != "table":
        record = {"sent": report.sent, "retried": report.retried, "failed": report.failed, "waiting": report.waiting,
                  "note": report.note or None, "undeliverable": report.undeliverable or None, "errors": report.errors}
        render([record], fmt, lambda: None, document=record)
    else:
        out.print(f"sent {report.sent}, retrying {report.retried}, failed {report.failed}, waiting {report.waiting}"
                  + (f" ({report.note})" if report.note and not report.undeliverable else ""), highlight=False)
    for line in report.errors if fmt == "table" else []:
        err.print(Text("- ", style="yellow") + Text(line), highlight=False)
    if report.undeliverable:
        fail(f"notifications undeliverable: {report.undeliverable}")
    if report.failed:
        raise typer.Exit(1)
