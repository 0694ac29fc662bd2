"""The `tailwatch` command line."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from monitor import config as config_mod
from monitor.config import ConfigError
from monitor.durations import duration_text

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="tailwatch: tells 'the service got slower' apart from 'the predictions got worse'.")
db_app = typer.Typer(no_args_is_help=True, help="Database schema: upgrade, current.")
app.add_typer(db_app, name="db")
reference_app = typer.Typer(no_args_is_help=True, help="The reference profile windows are compared with.")
app.add_typer(reference_app, name="reference")
out = Console()
err = Console(stderr=True)


class State:
    config_path: str | None = None


def fail(message: str, code: int = 2) -> None:
    """Print a one-line error (no traceback) and exit non-zero."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    raise typer.Exit(code)


@app.callback()
def main_options(
    config: Annotated[str | None, typer.Option("--config", "-c", help="Config file (default $TAILWATCH_CONFIG, then ./tailwatch.yaml).")] = None,
) -> None:
    State.config_path = config


def load_config() -> config_mod.Config:
    try:
        cfg = config_mod.load(State.config_path)
    except ConfigError as exc:
        fail(str(exc))
    for warning in cfg.warnings():
        err.print(f"[yellow]warning:[/] {warning}")
    return cfg


def open_store(cfg: config_mod.Config, *, check_schema: bool = True):
    from storage.store import SchemaError, Store

    try:
        password = cfg.storage.password.resolve() if cfg.storage.password else None
        store = Store(cfg.storage.url, password=password)
        if check_schema:
            store.ensure_current()
    except (ConfigError, SchemaError) as exc:
        fail(str(exc))
    except Exception as exc:  # driver errors: say which database, never the password
        fail(f"cannot open the database: {type(exc).__name__}: {_safe(exc)}")
    return store


def _safe(exc: Exception) -> str:
    return str(exc).splitlines()[0][:300] if str(exc) else ""


def parse_now(value: str | None) -> datetime:
    if value is None:
        return datetime.now(UTC)
    try:
        ts = pd.Timestamp(value)
    except ValueError:
        fail(f"--now: not a timestamp: {value!r} (use RFC 3339, e.g. 2026-11-02T12:00:00Z)")
    return (ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")).to_pydatetime()


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the example config.")] = Path(config_mod.DEFAULT_PATH),
    force: Annotated[bool, typer.Option(help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented example config."""
    if path.exists() and not force:
        fail(f"{path} exists; use --force to overwrite")
    path.write_text(config_mod.example(), encoding="utf-8")
    out.print(f"wrote {path}; edit its sources and schema, then run `tailwatch db upgrade` and `tailwatch tick`")


@app.command()
def tick(
    now: Annotated[str | None, typer.Option(help="The clock for this tick (RFC 3339, UTC); default: now.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
) -> None:
    """Run one tick: ingest new rows, quarantine bad ones, join timings, store bucket counts."""
    from monitor.daemon.runner import tick as run_tick

    if fmt not in ("table", "json"):
        fail(f"--format: must be table or json, got {fmt!r}")
    cfg = load_config()
    store = open_store(cfg)
    reports = run_tick(cfg, store, parse_now(now))
    if fmt == "json":
        print(json.dumps([r.as_dict() for r in reports], indent=2, default=str))
    else:
        for report in reports:
            print_report(report)
    if any(r.status != "ok" for r in reports):
        raise typer.Exit(1)


def print_report(report, console: Console = out) -> None:
    """A tick's report as a table a person reads in ten seconds."""
    table = Table(title=f"tick {report.now}  service {report.service}  [{report.status}]", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("rows", justify="right")
    for kind in sorted(report.read):
        table.add_row(f"{kind}: read", f"{report.read[kind]:,}")
        table.add_row(f"{kind}: accepted", f"{report.accepted[kind]:,}")
    total_q = sum(report.quarantined.values())
    table.add_row("quarantined", f"{total_q:,}")
    for reason, count in sorted(report.quarantined.items(), key=lambda kv: -kv[1]):
        table.add_row(f"  {reason}", f"{count:,}")
    table.add_row("joined with timings", f"{report.joined:,}")
    table.add_row("unmatched (no timings)", f"{report.unmatched:,}")
    table.add_row("duplicate request_ids", f"{report.duplicates:,}")
    table.add_row("waiting for timings", f"{report.pending_predictions:,}")
    table.add_row("folded into buckets", f"{report.folded:,} rows -> {report.buckets:,} partials")
    if report.first_ts:
        table.add_row("event time", f"{report.first_ts} .. {report.last_ts}")
    table.add_row("tick time", f"{report.seconds:.2f} s")
    console.print(table)
    if report.error:
        console.print(f"[red]error:[/] {report.error}")
    for line in report.events + report.notes:
        console.print(f"[dim]- {line}[/]")


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply the schema migrations to the configured database."""
    cfg = load_config()
    store = open_store(cfg, check_schema=False)
    notes = store.upgrade(sql_role=cfg.storage.query_sql.role)
    out.print(f"database at revision {store.current_revision()} (head {store.head_revision()})")
    for note in notes:
        err.print(f"[yellow]warning:[/] {note}", highlight=False)


@db_app.command("current")
def db_current() -> None:
    """Show the database's schema revision and the one this tailwatch expects."""
    cfg = load_config()
    store = open_store(cfg, check_schema=False)
    out.print(f"database: {store.current_revision() or 'empty'}; this tailwatch: {store.head_revision()}")


@reference_app.command("build")
def reference_build(
    service: Annotated[str | None, typer.Option(help="Only this service (default: every one with a reference).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
) -> None:
    """Profile each service's reference dataset, store the profile, and say what in it to fix."""
    from rich.markup import escape

    from checks.judge import judge
    from monitor.aggregate.profile import store_profile

    if fmt not in ("table", "json"):
        fail(f"--format: must be table or json, got {fmt!r}")
    cfg = load_config()
    store = open_store(cfg)
    chosen = [s for s in cfg.services if service in (None, s.name)]
    if service is not None and not chosen:
        fail(f"--service: no service named {service!r}")
    table = Table(title="reference profiles")
    for col in ("service", "rows", "fields", "fingerprint", "source"):
        table.add_column(col)
    concerns = Table(title="reference concerns: what to fix before trusting it")
    for col in ("service", "field", "concern", "seen", "suggested fix"):
        concerns.add_column(col, overflow="fold")
    built = []
    for svc in chosen:
        if svc.reference is None:
            err.print(f"[yellow]skipped:[/] service {escape(svc.name)} has no reference configured")
            continue
        try:
            profile = store_profile(store, svc)
        except (OSError, ValueError) as exc:
            fail(f"service {svc.name}: cannot profile {svc.reference.path}: {exc}")
        found = judge(profile, svc.check_params())
        built.append({"service": svc.name, "rows": profile.rows, "fields": list(profile.fields),
                      "fingerprint": profile.fingerprint, "source": str(svc.reference.path),
                      "concerns": [c.as_dict() for c in found]})
        table.add_row(escape(svc.name), f"{profile.rows:,}", escape(", ".join(profile.fields)), profile.fingerprint,
                      escape(str(svc.reference.path)))
        for c in found:
            concerns.add_row(escape(svc.name), escape(c.field or "(reference)"), c.kind, escape(c.detail),
                             escape(c.fix))
    if fmt == "json":
        print(json.dumps(built, indent=2))
        return
    out.print(table)
    if concerns.row_count:
        out.print(concerns)


@app.command()
def demo(
    scenario: Annotated[str, typer.Option(help="Simulator scenario to run.")] = "slower-batching",
    hours: Annotated[float, typer.Option(help="Simulated hours.")] = 6.0,
    seed: Annotated[int, typer.Option(help="Simulator seed.")] = 7,
    keep: Annotated[Path | None, typer.Option(help="Keep the generated logs and database in this directory.")] = None,
) -> None:
    """Generate a simulated serving scenario, tick over it with an injected clock, show what was seen."""
    from monitor.demo import run_demo

    try:
        run_demo(scenario=scenario, hours=hours, seed=seed, keep=keep, console=out)
    except ValueError as exc:
        fail(str(exc))


def _not_yet(command: str, issue: int, what: str) -> None:
    fail(f"`tailwatch {command}` is not available yet: {what} lands with issue #{issue}.")


@app.command()
def run(
    once: Annotated[bool, typer.Option("--once", help="Run one tick job (tick, recovery, after-tick stages) and exit.")] = False,
    now: Annotated[str | None, typer.Option(help="With --once: the clock for the tick (RFC 3339, UTC); default: now.")] = None,
) -> None:
    """Run the daemon: scheduled ticks and nightly jobs, leader lock, /livez /readyz /metrics."""
    from monitor.daemon import jobs, leader, logs
    from monitor.daemon.service import Daemon

    cfg = load_config()
    store = open_store(cfg)
    logs.setup(cfg.daemon.log_format, cfg.daemon.log_level, logs.config_secrets(cfg) + store._secrets)
    if not once:
        try:
            code = Daemon(cfg, store).run()
        except ValueError as exc:  # no leader lock for this database
            fail(str(exc))
        raise typer.Exit(code)
    try:
        lock = leader.for_store(store, cfg.daemon.lock_key)
    except ValueError as exc:
        fail(str(exc))
    if not lock.acquire():
        fail("another tailwatch process holds the leader lock; not ticking", code=3)
    try:
        reports = jobs.tick_job(cfg, leader.Fenced(store, lock), parse_now(now))
    finally:
        lock.release()
    if any(r.status != "ok" for r in reports):
        raise typer.Exit(1)


@app.command()
def backfill(
    since: Annotated[str, typer.Option(help="Where the replay clock starts (RFC 3339, UTC).")],
    until: Annotated[str, typer.Option(help="Where it stops; rows after it are left for the daemon.")],
    step: Annotated[str | None, typer.Option(help="How far the clock moves per tick, e.g. 15m, 1h (default: the "
                                             "smallest configured window; daemon.interval plays no part).")] = None,
    staging: Annotated[Path | None, typer.Option(help="Directory for the replayed files (default: beside the SQLite file, or ./tailwatch-backfill).")] = None,
    max_steps: Annotated[int | None, typer.Option(help="Stop after this many steps (rerun to resume).", min=1)] = None,
) -> None:
    """Replay history in event-time order exactly as live ticks would; rerun the same command to resume."""
    from monitor.daemon import backfill as backfill_mod
    from monitor.daemon import leader, logs

    try:
        length = config_mod.parse_duration(step) if step is not None else None
    except ValueError as exc:
        fail(f"--step: {exc}")
    cfg = load_config()
    store = open_store(cfg)
    logs.setup(cfg.daemon.log_format, "WARNING", logs.config_secrets(cfg) + store._secrets)
    start, end = parse_now(since), parse_now(until)
    lock = leader.for_store(store, cfg.daemon.lock_key)
    if not lock.acquire():
        fail("another tailwatch process (the daemon?) holds the leader lock; stop it before a backfill", code=3)
    try:
        result = backfill_mod.run(cfg, leader.Fenced(store, lock), start, end, step=length, staging=staging,
                                  console=err, max_steps=max_steps)
    except backfill_mod.BackfillError as exc:
        fail(str(exc))
    finally:
        lock.release()
    resumed = f" (resumed after {result.resumed_from:%Y-%m-%d %H:%M})" if result.resumed_from else ""
    state = "done" if result.done else "stopped; rerun the same command to resume"
    out.print(f"backfill run {result.run_id}: {result.steps} steps of {duration_text(result.step)}{resumed}, clock at "
              f"{result.reached:%Y-%m-%d %H:%M} UTC: {state}")


@app.command()
def nightly(
    now: Annotated[str | None, typer.Option(help="The clock (RFC 3339, UTC); default: now.")] = None,
    date: Annotated[str | None, typer.Option(help="Score as of the end of this UTC day (YYYY-MM-DD).")] = None,
    service: Annotated[str | None, typer.Option(help="Only this service.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
) -> None:
    """Score every matured window against its delayed labels (idempotent: a rerun rewrites the same results)."""
    from datetime import timedelta

    from monitor.daemon.nightly import run_nightly

    if fmt not in ("table", "json"):
        fail(f"--format: must be table or json, got {fmt!r}")
    if now is not None and date is not None:
        fail("give --now or --date, not both")
    clock = parse_now(now)
    if date is not None:
        try:
            clock = datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=UTC) + timedelta(days=1)
        except ValueError:
            fail(f"--date: not a date: {date!r} (use YYYY-MM-DD)")
    cfg = load_config()
    if service is not None and service not in [s.name for s in cfg.services]:
        fail(f"--service: no service named {service!r}")
    store = open_store(cfg)
    if service is None:
        from monitor.daemon import retention

        retention.apply(cfg, store, clock)  # the same nightly run as the daemon's: compaction and expiry first
    report = run_nightly(cfg, store, clock, service)
    if fmt == "json":
        print(json.dumps({"now": report.now, "seconds": report.seconds, "services": [
            {k: v for k, v in s.__dict__.items() if k != "scored"} for s in report.services]}, indent=2))
        return
    table = Table(title=f"nightly quality  {report.now}  ({report.seconds:.2f} s)")
    for col in ("service", "windows", "matured", "findings", "breaches", "pruned", "failed as miss"):
        table.add_column(col, justify="left" if col == "service" else "right")
    for s in report.services:
        table.add_row(s.service, str(s.windows), str(s.matured), str(s.findings), str(len(s.breaches)),
                      str(s.pruned), "yes" if s.failed_as_miss else "no")
    out.print(table)
    for s in report.services:
        for line in s.breaches[:20]:
            out.print(f"[red]breach[/] {s.service} {line}", highlight=False)
        if s.estimate_error:
            errs = ", ".join(f"{k} {v:.3f}" for k, v in sorted(s.estimate_error.items()))
            out.print(f"[dim]{s.service}: estimate mean |error| vs realized: {errs}[/]", highlight=False)
    if not report.services:
        out.print("[yellow]no service has a `quality` section[/]")


# --- investigation: query, compare, report, explain; defined in monitor.investigate.commands ---
def _register_investigation() -> None:
    from monitor.investigate.commands import register

    register(app, load_config=load_config, open_store=open_store, fail=fail)


_register_investigation()


# --- scan ---
@app.command()
def scan(
    dataset: Annotated[str, typer.Argument(help="Parquet dataset of joined prediction rows (path or fsspec URL).")],
    since: Annotated[str | None, typer.Option(help="Only rows with ts at or after this (RFC 3339).")] = None,
    until: Annotated[str | None, typer.Option(help="Only rows with ts before this (RFC 3339).")] = None,
    engine: Annotated[str | None, typer.Option(help="local or dask (default: the config's engine.kind).")] = None,
    scheduler: Annotated[str | None, typer.Option(help="Dask scheduler address (default: engine.scheduler).")] = None,
    service: Annotated[str | None, typer.Option(help="The service the rows belong to (default: the only one).")] = None,
    now: Annotated[str | None, typer.Option(help="The clock (RFC 3339): windows ending later are not scored.")] = None,
) -> None:
    """Fold a Parquet dataset into bucket partials (locally or on Dask), store them, score their windows."""
    from monitor.daemon.engines.scan import run_scan
    from monitor.daemon.runner import describe_labels

    cfg = load_config()
    chosen = [s for s in cfg.services if service in (None, s.name)]
    if len(chosen) != 1:
        fail(f"--service: {'no service named ' + repr(service) if service else 'several services'}; "
             f"one of {[s.name for s in cfg.services]}")
    try:
        settings = cfg.engine.model_copy(update={k: v for k, v in (("kind", engine), ("scheduler", scheduler))
                                                 if v is not None})
        settings = config_mod.Engine.model_validate(settings.model_dump())
    except ValueError as exc:
        fail(f"--engine/--scheduler: {_safe(exc)}")
    for name, value in (("since", since), ("until", until)):
        try:
            pd.Timestamp(value)
        except ValueError:
            fail(f"--{name}: not a timestamp: {value!r} (use RFC 3339, e.g. 2026-11-02T00:00:00Z)")
    bounds = [None if v is None else parse_now(v) for v in (since, until)]
    store = open_store(cfg)
    try:
        report = run_scan(cfg, chosen[0], store, dataset, parse_now(now), *bounds, engine=settings)
    except (OSError, ValueError) as exc:
        fail(f"cannot scan {dataset}: {type(exc).__name__}: {_safe(exc)}")
    result = report.result
    table = Table(title=f"scan {dataset}  engine {settings.kind}  service {chosen[0].name}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    for key in ("read", "accepted", "folded", "joined", "unmatched", "duplicates", "outside"):
        table.add_row(key, f"{result.counts[key]:,}")
    for key, n in sorted(result.counts.items()):
        if "quarantined:" in key:
            table.add_row(key, f"{n:,}")
    table.add_row("chunks / partitions", f"{result.chunks:,}")
    table.add_row("partials", f"{len(result.partials):,}")
    table.add_row("partial bytes gathered", f"{result.gathered_bytes:,}")
    table.add_row("fold time", f"{result.seconds:.2f} s")
    table.add_row("findings", f"{report.findings:,}")
    out.print(table)
    breaches = [(s, f) for s in report.scored for f in s.findings if f.status == "breach"]
    for s, f in breaches[:30]:
        out.print(f"[red]breach[/] {s.start:%Y-%m-%d %H:%M}+{int((s.end - s.start).total_seconds() // 60)}m "
                  f"{s.model_version} {f.check} {describe_labels(f.labels)} (n={f.n})", highlight=False, soft_wrap=True)
    if len(breaches) > 30:
        out.print(f"... and {len(breaches) - 30} more breaches (see `tailwatch query`)", highlight=False)


# --- alerts, silences and notifications ---
silence_app = typer.Typer(no_args_is_help=True, help="Silences: mute notifications of matching alerts for a while.")
app.add_typer(silence_app, name="silence")
notify_app = typer.Typer(no_args_is_help=True, help="Notifications: send what the outbox holds.")
app.add_typer(notify_app, name="notify")


@app.command("alerts")
def alerts_list(
    show_all: Annotated[bool, typer.Option("--all", help="Also inactive and resolved alerts.")] = False,
    now: Annotated[str | None, typer.Option(help="The clock for silences (RFC 3339); default: now.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
) -> None:
    """List active (pending and firing) alerts with their verdict, since when, what mutes them, and whether
    their notifications went out."""
    from sqlalchemy import select

    from monitor.alerts.alert import Alert
    from monitor.alerts.silence import muted_by
    from monitor.notify import undeliverable
    from storage.models import AlertState, Outbox

    cfg = load_config()
    store = open_store(cfg)
    clock = parse_now(now)
    why = undeliverable(cfg)
    with store.transaction() as session:
        rows = list(session.scalars(select(AlertState).order_by(AlertState.service, AlertState.alertname)))
        silences = store.load_silences(session, clock)
        incidents = store.load_incidents(session, status="open")
        by_group = {i["fingerprint"]: i["id"] for i in incidents}
        items = session.execute(select(Outbox.incident_id, Outbox.status, Outbox.last_error).where(
            Outbox.incident_id.in_(list(by_group.values()))).order_by(Outbox.id)).all() if by_group else []
    outbox: dict[int, list] = {}
    for incident_id, status, last_error in items:
        outbox.setdefault(incident_id, []).append((status, last_error))
    alerts = [Alert(r.fingerprint, dict(r.labels or {}), r.state, r.active_since, r.fired_at, r.resolved_at,
                    r.last_active_at, r.last_eval_at, dict(r.annotations or {})) for r in rows]
    firing = [a for a in alerts if a.state == "firing"]
    shown = [a for a in alerts if show_all or a.state in ("pending", "firing")]
    groups = {r.fingerprint: r.group_fingerprint for r in rows}
    records = [{"fingerprint": a.fingerprint, "state": a.state, "labels": a.labels,
                "since": (a.fired_at or a.active_since or a.resolved_at),
                # A resolved alert says why: fixed, rolled back, or no traffic.
                "summary": (f"resolved ({a.annotations['resolution']}): " if a.state == "resolved"
                            and a.annotations.get("resolution") else "") + a.annotations.get("summary", ""),
                "muted": muted_by(a, firing, silences, cfg.alerts, clock),
                "delivery": _delivery(cfg, why, outbox.get(by_group.get(groups.get(a.fingerprint)), []))}
               for a in shown]
    if fmt == "json":
        print(json.dumps({"alerts": records, "open_incidents": incidents, "notifications_undeliverable": why or None},
                         indent=2, default=str))
        return
    table = Table(title=f"alerts ({len(shown)} shown, {len(incidents)} open incident(s))")
    for col in ("state", "alert", "labels", "since (UTC)", "muted", "notified", "summary"):
        table.add_column(col, overflow="fold")
    for r in records:
        labels = {k: v for k, v in r["labels"].items() if k != "alertname"}
        since = r["since"].strftime("%Y-%m-%d %H:%M") if r["since"] else "-"
        delivery = f"[red]{escape(r['delivery'])}[/]" if r["delivery"].startswith("UNDELIVERABLE") else escape(r["delivery"])
        table.add_row(escape(r["state"]), escape(r["labels"].get("alertname", "")),
                      escape(" ".join(f"{k}={v}" for k, v in sorted(labels.items()))), since,
                      escape(r["muted"] or ""), delivery, escape(r["summary"]))
    out.print(table)
    if why:
        err.print(f"[red]error:[/] notifications undeliverable: {escape(why)}", highlight=False)
    if not shown:
        out.print("[green]no active alerts[/]")


def _delivery(cfg, why: str, items: list[tuple[str, str | None]]) -> str:
    """What became of an alert's notifications: its incident's outbox items (oldest first), or why none can
    be sent."""
    pending = sum(status == "pending" for status, _ in items)
    if cfg.alerts.slack is None:
        return "not configured"
    if why:
        return f"UNDELIVERABLE{f' ({pending} waiting)' if pending else ''}: {why}"
    failed = [error for status, error in items if status == "failed"]
    if failed:
        return f"failed: {failed[-1] or 'error'}"
    if pending:
        return f"pending ({pending})"
    return "sent" if items else "-"


@silence_app.command("create")
def silence_create(
    matcher: Annotated[list[str], typer.Option("--matcher", "-m", help="label=value, label!=value, label=~regex "
                                                "or label!~regex; repeat for several (all must match).")],
    duration: Annotated[str, typer.Option(help="How long, e.g. 2h, 30m, 1d.")] = "2h",
    comment: Annotated[str, typer.Option(help="Why (shown in `silence list`).")] = "",
    created_by: Annotated[str | None, typer.Option("--by", help="Who (default: $USER).")] = None,
    now: Annotated[str | None, typer.Option(help="Start (RFC 3339); default: now.")] = None,
) -> None:
    """Mute notifications of every alert matching all the matchers, for `duration`."""
    import getpass

    from monitor.alerts.silence import parse_matcher

    try:
        matchers = [parse_matcher(m) for m in matcher]
        length = config_mod.parse_duration(duration)
    except ValueError as exc:
        fail(str(exc))
    if length.total_seconds() <= 0:
        fail(f"--duration: must be positive, got {duration!r}")
    cfg = load_config()
    store = open_store(cfg)
    start = parse_now(now)
    with store.transaction() as session:
        sid = store.add_silence(session, matchers, created_by or getpass.getuser(), comment, start, start + length)
    out.print(f"silence {sid} until {start + length:%Y-%m-%d %H:%M} UTC: "
              + ", ".join(f"{m['name']}{m['op']}{m['value']}" for m in matchers), highlight=False)


@app.command()
def accept(
    version: Annotated[str, typer.Argument(help="The version value: a model_version, preprocess_version or config_hash.")],
    service: Annotated[str | None, typer.Option(help="The service (default: the only one).")] = None,
    comment: Annotated[str, typer.Option(help="Why it is good.")] = "",
    accepted_by: Annotated[str | None, typer.Option("--by", help="Who (default: $USER).")] = None,
    now: Annotated[str | None, typer.Option(help="When (RFC 3339); default: now.")] = None,
) -> None:
    """Accept a version as good: its windows are then compared with its own history, not with the last
    accepted version before it (see docs/alerts.md, Baselines)."""
    import getpass

    cfg = load_config()
    chosen = [s for s in cfg.services if service in (None, s.name)]
    if len(chosen) != 1:
        fail(f"--service: {'no service named ' + repr(service) if service else 'several services'}; "
             f"one of {[s.name for s in cfg.services]}")
    name = chosen[0].name
    store = open_store(cfg)
    with store.transaction() as session:
        seen = [v for v in store.load_versions(session, name) if v["value"] == version]
        new = store.accept_version(session, name, version, parse_now(now), accepted_by or getpass.getuser(), comment)
    what = ", ".join(f"{v['kind']} first seen {v['first_seen']:%Y-%m-%d %H:%M} UTC" for v in seen) or "not seen yet"
    out.print(f"{escape(name)}: {escape(version)} {'accepted' if new else 'was already accepted'} ({what})",
              highlight=False)


@silence_app.command("list")
def silence_list(
    show_all: Annotated[bool, typer.Option("--all", help="Also expired silences.")] = False,
    now: Annotated[str | None, typer.Option(help="The clock (RFC 3339); default: now.")] = None,
) -> None:
    """List silences in force (or all of them)."""
    cfg = load_config()
    store = open_store(cfg)
    clock = parse_now(now)
    with store.transaction() as session:
        rows = store.load_silences(session, None if show_all else clock)
    table = Table(title="silences")
    for col in ("id", "matchers", "starts (UTC)", "ends (UTC)", "state", "by", "comment"):
        table.add_column(col, overflow="fold")
    for r in rows:
        state = "active" if r["starts_at"] <= clock < r["ends_at"] else ("expired" if r["ends_at"] <= clock else "pending")
        table.add_row(str(r["id"]), ", ".join(f"{m['name']}{m['op']}{m['value']}" for m in r["matchers"]),
                      f"{r['starts_at']:%Y-%m-%d %H:%M}", f"{r['ends_at']:%Y-%m-%d %H:%M}", state, r["created_by"],
                      r["comment"])
    out.print(table)


@silence_app.command("expire")
def silence_expire(
    silence_id: Annotated[int, typer.Argument(help="The silence id (see `tailwatch silence list`).")],
    now: Annotated[str | None, typer.Option(help="The clock (RFC 3339); default: now.")] = None,
) -> None:
    """End a silence now."""
    cfg = load_config()
    store = open_store(cfg)
    with store.transaction() as session:
        done = store.expire_silence(session, silence_id, parse_now(now))
    if not done:
        fail(f"no silence {silence_id} in force")
    out.print(f"silence {silence_id} expired")


@notify_app.command("drain")
def notify_drain(
    now: Annotated[str | None, typer.Option(help="The clock (RFC 3339); default: now.")] = None,
) -> None:
    """Send the notifications due in the outbox (retries wait for their backoff)."""
    from monitor.notify import drain

    cfg = load_config()
    store = open_store(cfg)
    report = drain(cfg, store, parse_now(now))
    out.print(f"sent {report.sent}, retrying {report.retried}, failed {report.failed}, waiting {report.waiting}"
              + (f" ({report.note})" if report.note and not report.undeliverable else ""), highlight=False)
    for line in report.errors:
        err.print(f"[yellow]-[/] {line}", highlight=False)
    if report.undeliverable:
        fail(f"notifications undeliverable: {escape(report.undeliverable)}")
    if report.failed:
        raise typer.Exit(1)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
