"""What each page shows, gathered from the investigation layer (query, history, explain, logs) and the
store: plain dicts and figure dicts the templates lay out. Nothing here writes, except the silence calls.

Times are UTC-aware; a page's "now" for a service is its last tick's clock (stored history, not the wall
clock), so the pages of a replayed or paused service still show its data."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

import pandas as pd

from checks.catalog import family_of
from monitor.aggregate.keys import STAGE_PREFIX
from monitor.alerts.alert import SEVERITY_RANK
from monitor.config import Config, Service
from monitor.investigate import history, query
from monitor.investigate.explain import BEFORE, LABEL_WINDOW_MAX, QUALITY_CHECKS, explain
from monitor.investigate.logs import SLOWEST, LogsError, drill
from monitor.investigate.query import jsonable, why
from monitor.ui import figures
from monitor.verdicts.evidence import rule_text
from monitor.verdicts.verdict import VERDICTS
from storage.store import Store

SPANS = {"24h": timedelta(hours=24), "7d": timedelta(days=7)}  # the overview's ranges
CONTEXT = timedelta(hours=3)  # shown before an incident's first window on its timeline
RECENT = 200  # incidents listed at most
EXCERPTS = 5  # latest quarantined lines shown per reason
CHUNK_ROWS = 25_000  # rows of raw logs the slowest-requests page reads at a time
DRIFT_CHECKS = ("drift", "prediction_drift")
# The incident page's sections in their order after the one that leads, and the one each verdict leads with.
SECTIONS = ("latency", "cache", "inputs", "quality")
LEAD = {"worse": "quality", "slower": "latency", "drift": "inputs", "no_data": "latency"}
# The section of the service overview each of its charts belongs to.
CHART_SECTION = {"latency": "latency", "traffic": "latency", "signal": "latency", "cache": "cache",
                 "drift": "inputs", "quality": "quality"}
# The section that shows each family of checks' evidence (for a `both` verdict's lead).
SECTION_OF = {"quality": "quality", "estimates": "quality", "versions": "quality", "labels": "quality",
              "latency": "latency", "slo": "latency", "signals": "latency", "routing": "latency", "cache": "cache",
              "drift": "inputs", "predictions": "inputs", "ranges": "inputs", "completeness": "inputs",
              "lengths": "inputs", "vocabulary": "inputs"}


class NotFound(LookupError):
    """A page asked for a service or incident that does not exist; the message says which."""


# The values the incident list filters on, as incidents store them.
CHOICES = {"verdict": [v for v in VERDICTS if v not in ("healthy", "insufficient_data")],
           "severity": list(SEVERITY_RANK), "status": ["open", "resolved"]}


@dataclass(frozen=True)
class Filters:
    """The incident list's filters (query parameters); None: any. ValueError for a value no incident can
    have, naming the valid ones."""

    service: str | None = None
    version: str | None = None
    verdict: str | None = None
    severity: str | None = None
    status: str | None = None

    def __post_init__(self) -> None:
        for name, valid in CHOICES.items():
            value = getattr(self, name)
            if value is not None and value not in valid:
                raise ValueError(f"{name} {value!r} is not one of {', '.join(valid)}")


def service_of(cfg: Config, name: str) -> Service:
    for svc in cfg.services:
        if svc.name == name:
            return svc
    raise NotFound(f"no service {name!r} in the config")


def last_tick(store: Store, service: str, now: datetime) -> datetime:
    """The clock of `service`'s last tick, or `now` when it has none."""
    ticks = query.ticks(store, service, limit=1)
    return now if ticks.empty else ticks["now"].iloc[-1].to_pydatetime()


def data_version(store: Store, cfg: Config, incident_id: int | None = None, service: str | None = None
                 ) -> tuple[Any, ...]:
    """What changes when a page's data may have: the service's last tick (id and status), and for an
    incident its revision (the alert stage bumps it); NotFound for an unknown service or incident."""
    revision = None
    if incident_id is not None:
        with store.transaction() as session:
            row = store.incidents.get(session, incident_id)
            if row is None:
                raise NotFound(f"no incident {incident_id}")
            service, revision = row.service, (row.revision, row.updated_at)
    service_of(cfg, service)
    ticks = query.ticks(store, service, limit=1)
    last = None if ticks.empty else (int(ticks["id"].iloc[-1]), ticks["status"].iloc[-1])
    return service, last, revision


def slack_link(incident: dict[str, Any]) -> str | None:
    """The Slack thread of an incident (its channel and parent message ts), when one was posted."""
    channel, ts = incident.get("channel"), incident.get("slack_ts")
    if not channel or not ts:
        return None
    return f"https://slack.com/archives/{quote(str(channel), safe='')}/p{quote(str(ts).replace('.', ''), safe='')}"


def _start(inc: dict[str, Any]) -> datetime:
    first = inc.get("first_window_start")
    return pd.Timestamp(first if first is not None and not pd.isna(first) else inc["opened_at"]).to_pydatetime()


def _end(inc: dict[str, Any], now: datetime) -> datetime:
    """Where an incident's span ends on a page: an open one runs to `now` (its service's last tick), a
    resolved one to its resolution (else its last window)."""
    last = inc.get("last_window_end")
    last = None if last is None or pd.isna(last) else pd.Timestamp(last).to_pydatetime()
    if inc.get("status") == "open":
        return max(now, last) if last is not None else now
    resolved = inc.get("resolved_at")
    if resolved is not None and not pd.isna(resolved):
        return pd.Timestamp(resolved).to_pydatetime()
    return last or now


def _summary(inc: dict[str, Any]) -> dict[str, Any]:
    summary = inc.get("summary")
    return summary if isinstance(summary, dict) else {}


def _duration(start: datetime, end: datetime) -> str:
    minutes = max(int((end - start).total_seconds() // 60), 0)
    return f"{minutes} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def incident_list(cfg: Config, store: Store, filters: Filters, now: datetime) -> list[dict[str, Any]]:
    """Open and recent incidents matching `filters`, open first, then newest first."""
    names = [filters.service] if filters.service else [s.name for s in cfg.services]
    rows = []
    for name in names:
        service_of(cfg, name)
        with store.transaction() as session:
            found = store.incidents.load(session, name, status=filters.status, limit=RECENT)
        clock = last_tick(store, name, now)
        for inc in found:
            severity = _summary(inc).get("severity")
            if (filters.version and inc.get("model_version") != filters.version
                    or filters.verdict and inc["verdict"] != filters.verdict
                    or filters.severity and severity != filters.severity):
                continue
            start, end = _start(inc), _end(inc, clock)
            rows.append({"id": inc["id"], "service": name, "model_version": inc.get("model_version"),
                         "verdict": inc["verdict"], "severity": severity, "status": inc["status"], "onset": start,
                         "duration": _duration(start, end), "why": why(inc), "slack": slack_link(inc)})
    rows.sort(key=lambda r: (r["status"] != "open", -r["onset"].timestamp(), -r["id"]))
    return rows[:RECENT]


def stage_means(part) -> dict[str, float]:
    """Mean ms per request spent in each stage of a merged partial: stage time over all requests, so the
    stages add up to the mean request (a stage some requests skip counts 0 for them)."""
    if part is None or not part.rows:
        return {}
    return {name.removeprefix(STAGE_PREFIX): sketch.sum / part.rows for name, sketch in part.sketches.items()
            if name.startswith(STAGE_PREFIX) and sketch.count}


def _incident(cfg: Config, store: Store, incident_id: int) -> tuple[dict[str, Any], Service]:
    """The stored incident as a dict, and its service's config; NotFound when there is none."""
    with store.transaction() as session:
        row = store.incidents.get(session, incident_id)
        inc = None if row is None else store.incidents.as_dict(row)
    if inc is None:
        raise NotFound(f"no incident {incident_id}")
    return inc, service_of(cfg, inc["service"])


def incident(cfg: Config, store: Store, incident_id: int, now: datetime) -> dict[str, Any]:
    """Everything the incident page shows: explain's answer, the figures and the links to filtered views,
    its sections in `order` (the cause first). An open incident's charts run to its service's last tick
    (`now` without one), a resolved one's an hour past its end."""
    inc, svc = _incident(cfg, store, incident_id)
    clock = last_tick(store, svc.name, now)
    groups = svc.quality.groups if svc.quality is not None else {}
    result = explain(store, svc.name, incident_id, now=clock, groups=groups)
    first, last = result.window
    end = _end(inc, clock) if inc.get("status") == "open" else last
    until = end if inc.get("status") == "open" else last + timedelta(hours=1)
    version = inc.get("model_version")
    before_part, during_part = result.spans  # explain read them: the same partials, not read twice
    rates = [history.partial_metrics(p) if p is not None else {} for p in (before_part, during_part)]

    with store.transaction() as session:
        versions = [v for v in store.versions.load(session, svc.name)
                    if first - CONTEXT <= v["first_seen"] < until]
    shapes = figures.spans([{"start": first, "end": end, "name": "incident"}])
    shapes.append(figures.vertical(first, "onset", "#e45756"))
    shapes += [figures.vertical(v["first_seen"], f"{v['kind']} {v['value']}", "#4c78a8", "dash") for v in versions]
    step = _step(until - (first - CONTEXT))
    metrics = history.metrics(store, svc.name, since=first - CONTEXT, until=until, every=step, group_by=())
    rules = rule_rows(store, svc.name, version, first, end)
    wanted = {(r["metric"], r["class"]) for r in rules}
    labelled = query.findings(store, svc.name, since=first - CONTEXT - LABEL_WINDOW_MAX, until=until,
                              check="quality", segment="all")
    labelled = labelled[labelled["window_end"] > pd.Timestamp(first - CONTEXT)]
    shown = (first - CONTEXT, until)
    charts = {"timeline": figures.ranged(figures.stage_lines(metrics, "p95", shapes, "p95 latency per stage, "
                                                             "incident shaded"), *shown) if len(metrics) else None,
              "stages": figures.stacked_stages(stage_means(before_part), stage_means(during_part))
              if before_part is not None and during_part is not None else None,
              "failures": figures.failure_bars(*rates) if all(rates) else None,
              "quality": figures.intervals(rules or _quality_rows(result.affected)),
              "quality_lines": figures.ranged(figures.quality_lines(labelled, shapes, wanted), *shown),
              "signals": [figures.ranged(f, *shown) for f in (figures.signal_lines(metrics, s, shapes)
                                                             for s in svc.schema_.signals) if f]}
    return {"incident": inc, "service": svc.name, "explanation": result, "why": why(inc),
            "severity": _summary(inc).get("severity"), "slack": slack_link(inc), "charts": charts,
            "rules": rules, "until": end, "order": order(result.verdict, result.evidence),
            "histograms": _histograms(store, svc.name, result, version),
            "changes": [{"kind": v["kind"], "value": v["value"], "first_seen": v["first_seen"]} for v in versions],
            "rollback": _rollback(store, svc.name, incident_id),
            "next": next_links(svc.name, incident_id, version, first, end, result.named)}


def order(verdict: str, evidence: list[dict[str, Any]]) -> list[str]:
    """The incident page's sections, the cause first: quality for `worse`, the drifting inputs for `drift`,
    latency for `slower`; for `both`, the section of its strongest evidence (explain ranks it first)."""
    lead = LEAD.get(verdict)
    if lead is None:
        lead = next((SECTION_OF[f] for f in (family_of(str(e.get("check"))) for e in evidence) if f in SECTION_OF),
                    "latency")
    return [lead, *(s for s in SECTIONS if s != lead)]


def rule_rows(store: Store, service: str, version: str | None, first: datetime, end: datetime
              ) -> list[dict[str, Any]]:
    """Each acceptance rule and group scored on the incident's version in windows overlapping [first, end):
    the figure of its latest breaching window (else its latest; the larger n of two ending together) against
    the rule's floor and the accepted version's (or the reference's) figure, in the words every reader uses
    (`evidence.rule_text`), with that window's n and 95% interval; breaching rules first."""
    found = query.findings(store, service, since=first - LABEL_WINDOW_MAX, until=end, model_version=version,
                           check="acceptance", detail=True)
    found = found[found["window_end"] > pd.Timestamp(first)] if len(found) else found
    rows = []
    # One row per rule and group, over every window length the quality section scores.
    found = found.assign(key=[((lab or {}).get("rule"), (lab or {}).get("group")) for lab in found["labels"]])
    for _, part in found.sort_values(["window_end", "n"]).groupby("key", sort=False):
        breached = part[part["status"] == "breach"]
        shown = (breached if len(breached) else part).iloc[-1]
        labels, detail = shown["labels"] or {}, shown["detail"] or {}
        interval = None if pd.isna(shown["interval_low"]) else [float(shown["interval_low"]),
                                                                float(shown["interval_high"])]
        value, baseline = jsonable(shown["value"]), jsonable(shown["baseline"])
        row = {"rule": labels.get("rule"), "metric": labels.get("metric"), "class": labels.get("class"),
               "group": labels.get("group", "all"), "value": value, "baseline": baseline,
               # Drawn on the 0..1 axis: a max_drop rule's floor under a figure near 0 is below it.
               "floor": None if detail.get("floor") is None else min(max(float(detail["floor"]), 0.0), 1.0),
               "n": int(shown["n"] or 0), "interval": interval, "status": shown["status"],
               "estimated": bool(detail.get("estimated")), "window": (shown["window_start"], shown["window_end"]),
               "breached": len(breached), "windows": len(part),
               "text": rule_text({"check": "acceptance", "labels": labels, "value": value, "baseline": baseline,
                                  "detail": detail})}
        # Two short lines per row (group, then rule and n): a phone's chart keeps room for the markers.
        row["name"] = f"{row['group']}<br>{row['rule']}, n={row['n']:,}"
        rows.append(row)
    return sorted(rows, key=lambda r: (-r["breached"], r["status"] != "breach", (r["value"] or 0) - (r["floor"] or 0)))


def _rollback(store: Store, service: str, incident_id: int) -> str | None:
    verdicts = query.verdicts(store, service, incident_id=incident_id)
    return next((r for r in verdicts["rollback_to"] if r), None) if len(verdicts) else None


def _quality_rows(affected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for a in affected:
        if a["check"] not in QUALITY_CHECKS:
            continue
        labels = a.get("labels") or {}
        name = " ".join(str(labels[k]) for k in ("metric", "class") if labels.get(k))
        rows.append({"name": f"{name} [{labels.get('group') or 'all'}] (n={a.get('n')})", "value": a.get("value"),
                     "baseline": a.get("baseline"), "interval": a.get("interval")})
    return rows


def _histograms(store: Store, service: str, result, version: str | None) -> list[dict[str, Any]]:
    """The latest drift finding's bins of each field explain names, window vs reference."""
    out = []
    first, last = result.window
    for field in [f for f in result.named.get("fields", []) if f != "cache_hit"][:6]:
        found = query.findings(store, service, since=first, until=last, model_version=version, check="drift",
                               labels={"field": field}, segment="all", detail=True)
        found = found[found["detail"].map(bool)]
        if len(found):
            row = found.iloc[-1]
            fig = figures.histogram(field, row["detail"])
            if fig is not None:
                out.append({"field": field, "psi": jsonable(row["value"]), "figure": fig})
    return out


def _iso(at: datetime) -> str:
    return f"{pd.Timestamp(at).tz_convert('UTC'):%Y-%m-%dT%H:%MZ}"


def next_links(service: str, incident_id: int, version: str | None, first: datetime, last: datetime,
               named: dict[str, Any]) -> list[dict[str, str]]:
    """The explain next steps as links to this UI's filtered views: only drill-downs the rows can answer (by
    a stage with timings, by total latency when the rows carry it; `named["measured"]`, from explain)."""
    stage, ranked = named.get("stage"), named.get("measured", ())
    stages = [stage] if stage else [] if "total" in ranked else [s for s in ranked if s != "total"][:1]
    out = [{"text": f"slowest requests in stage {s} during the incident",
            "href": f"/incidents/{incident_id}/requests?{urlencode({'stage': s})}"} for s in stages]
    if "total" in ranked:
        out.append({"text": "slowest requests by total latency" if out else "slowest requests during the incident",
                    "href": f"/incidents/{incident_id}/requests"})
    span = urlencode({"since": _iso(first - BEFORE), "until": _iso(last + timedelta(hours=1))})
    out.append({"text": f"service {service} around the incident", "href": f"/services/{service}?{span}"})
    if version:
        out.append({"text": f"other incidents of version {version}",
                    "href": f"/?{urlencode({'service': service, 'version': version})}"})
    out.append({"text": f"quarantined rows of {service}", "href": f"/services/{service}/quarantine"})
    return out


def _step(span: timedelta) -> timedelta:
    """One point per 15 min for a day, per hour for a week: at most 200 points per line."""
    for minutes in (5, 15, 60, 360, 1440):
        if span.total_seconds() / (minutes * 60) <= 200:
            return timedelta(minutes=minutes)
    return timedelta(days=7)


def overview(cfg: Config, store: Store, service: str, now: datetime, span: str = "24h",
             since: datetime | None = None, until: datetime | None = None) -> dict[str, Any]:
    """The service's last `span` (24h / 7d) up to its last tick, or [since, until): latency per stage,
    traffic and failures, cache, each declared signal, drift per field, matured quality (the acceptance
    rules' metrics), with its incidents shaded; the newest incident's cause first (see `order`)."""
    svc = service_of(cfg, service)
    if since is None or until is None:
        if span not in SPANS:
            raise NotFound(f"unknown span {span!r}; one of {', '.join(SPANS)}")
        until = last_tick(store, service, now)
        since = until - SPANS[span]
    step = _step(until - since)
    metrics = history.metrics(store, service, since=since, until=until, every=step, group_by=())
    # Only the checks drawn: a day holds tens of thousands of other findings (latency per stage and segment).
    findings = pd.concat([query.findings(store, service, since=since, until=until, check=check, segment="all")
                          for check in DRIFT_CHECKS], ignore_index=True)
    with store.transaction() as session:
        found = store.incidents.load(session, service, limit=RECENT)
    shown = [i for i in found if _start(i) < until and _end(i, until) > since]
    # Shaded within the range shown: an incident resolved days later does not stretch the time axis.
    shapes = figures.spans([{"start": max(_start(i), since), "end": min(_end(i, until), until),
                             "name": f"incident {i['id']}"} for i in shown])
    charts: dict[str, Any] = {}
    if len(metrics):
        charts["latency"] = figures.stage_lines(metrics, "p95", shapes, "p95 latency per stage")
        charts["traffic"] = figures.traffic(metrics, shapes)
        charts["cache"] = figures.cache(metrics, shapes)
        for signal in svc.schema_.signals:
            charts[f"signal-{signal}"] = figures.signal_lines(metrics, signal, shapes)
    charts["drift"] = figures.drift(findings, shapes)
    labelled = query.findings(store, service, since=since - LABEL_WINDOW_MAX, until=until, check="quality",
                              segment="all")
    labelled = labelled[labelled["window_end"] > pd.Timestamp(since)]
    rules = svc.quality.rules if svc.quality is not None else []
    charts["quality"] = figures.quality_lines(labelled, shapes, rule_figures(rules, labelled))
    # The cause of the newest incident shown (an open one before a resolved one) leads the page.
    lead = min(shown, key=lambda i: (i["status"] != "open", -_start(i).timestamp()), default=None)
    sections = order(lead["verdict"], []) if lead is not None else list(SECTIONS)
    ranked = sorted(charts, key=lambda name: sections.index(CHART_SECTION.get(name.split("-")[0], "latency")))
    return {"service": svc.name, "since": since, "until": until, "step": step, "span": span,
            "spans": list(SPANS), "charts": {k: figures.ranged(charts[k], since, until) for k in ranked
                                             if charts[k] is not None},
            "incidents": [{"id": i["id"], "verdict": i["verdict"], "status": i["status"], "onset": _start(i)}
                          for i in shown]}


def rule_figures(rules: list[Any], labelled: pd.DataFrame) -> set[tuple[str, str]]:
    """The (metric, class) pairs of the quality findings that `rules` judge: a rule's own class where the
    findings score it, else every class its metric is scored for (a feedback rate is scored as class `all`
    whatever class the rule names)."""
    scored = {((lab or {}).get("metric"), (lab or {}).get("class")) for lab in labelled["labels"]}
    out = set()
    for rule in rules:
        own = {(m, c) for m, c in scored if m == rule.metric}
        out |= {(rule.metric, rule.class_)} & own or own
    return out


def quarantine(cfg: Config, store: Store, service: str, now: datetime, span: timedelta = SPANS["7d"]
               ) -> dict[str, Any]:
    """Quarantined rows of the last `span` up to the last tick: counts per reason per tick, and the latest
    lines quarantined for each reason (as the terminal-safe excerpts query gives; the page escapes them)."""
    service_of(cfg, service)
    until = last_tick(store, service, now) + timedelta(seconds=1)
    since = until - span
    per_tick = query.quarantine(store, service, since=since, until=until, group_by=("reason", "tick_id"))
    totals = query.quarantine(store, service, since=since, until=until, group_by=("reason",))
    reasons = []
    for row in totals.to_dict("records"):
        latest = query.quarantine(store, service, since=row["last"].to_pydatetime(), until=until,
                                  reason=row["reason"])
        reasons.append({"reason": row["reason"], "rows": int(row["rows"]), "first": row["first"],
                        "last": row["last"], "excerpts": latest.tail(EXCERPTS).to_dict("records")})
    return {"service": service, "since": since, "until": until, "figure": figures.quarantine(per_tick),
            "reasons": reasons}


def requests(cfg: Config, store: Store, incident_id: int, now: datetime, stage: str | None = None,
             top: int = 20, max_rows: int | None = None) -> dict[str, Any]:
    """The incident's slowest requests (the `query logs` drill-down over its windows, as its default picks
    them: the slowest SLOWEST share of the range's requests), no feature values; the logs read CHUNK_ROWS
    rows at a time, `max_rows` of the slowest held at most."""
    inc, svc = _incident(cfg, store, incident_id)
    since, until = _start(inc), _end(inc, last_tick(store, svc.name, now))
    limits = cfg.limits.model_copy(update={"chunk_rows": min(cfg.limits.chunk_rows, CHUNK_ROWS)})
    try:
        result = drill(svc, limits, since=since, until=until, stage=stage, top=top, now=now, slowest=SLOWEST,
                       max_rows=max_rows)
    except (LogsError, OSError) as exc:
        return {"incident": inc, "service": svc.name, "stage": stage, "error": str(exc), "since": since,
                "until": until}
    measure = "latency_ms" if stage is None else f"{stage}_ms"
    columns = list(result.requests.columns)
    return {"incident": inc, "service": svc.name, "stage": stage, "error": None, "since": since, "until": until,
            "measure": measure, "columns": columns, "rows": result.requests[columns].to_dict("records"),
            "matched": result.matched, "scanned": result.scanned, "min_ms": result.min_ms, "slowest": result.slowest,
            "limited": result.limited, "max_rows": max_rows,
            "aggregates": result.aggregates.head(15).to_dict("records")}


def silences(store: Store, now: datetime) -> list[dict[str, Any]]:
    """Every stored silence, newest first, with whether it holds at `now`."""
    with store.transaction() as session:
        rows = store.silences.load(session)
    return [{**s, "active": s["starts_at"] <= now < s["ends_at"]} for s in reversed(rows)]
