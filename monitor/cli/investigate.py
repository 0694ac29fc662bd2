"""The investigation commands: `tailwatch query ...`, `compare`, `report`, `explain`. Thin: each parses
its options, calls monitor.investigate.query / monitor.investigate, and prints. Registered on the app by `register`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import pandas as pd
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from monitor.cli.common import (
    Format,
    Service,
    err,
    fail,
    known_version,
    load_config,
    one_of,
    one_service,
    open_store,
    parse_range,
    render,
)
from monitor.cli.progress import progress
from monitor.config import ConfigError
from monitor.durations import duration_text
from monitor.investigate import history, sql
from monitor.investigate import query as q
from monitor.investigate.logs import SLOWEST
from monitor.investigate.output import (
    cell,
    dumps,
    emit,
    json_records,
    parse_labels,
    split_list,
    table,
)

out = Console()
DEFAULT_RANGE = timedelta(hours=24)

Since = Annotated[str | None, typer.Option(help="Start (RFC 3339, UTC) or a duration before now (6h, 7d).")]
Until = Annotated[str | None, typer.Option(help="End, exclusive (RFC 3339, UTC) or a duration before now.")]
Version = Annotated[str | None, typer.Option("--version", help="Only this model version.")]


def _setup(service: str | None, version: str | None = None):
    """The config, the service `--service` names and the store; `version` must be one the service stored."""
    cfg = load_config()
    svc, store = one_service(cfg, service), open_store(cfg)
    known_version(store, svc.name, "--version", version)
    return cfg, svc, store


def _run(fn: Callable[[], Any]) -> Any:
    """Call `fn`; a QueryError or ValueError becomes a one-line error."""
    try:
        return fn()
    except (q.QueryError, ValueError) as exc:
        fail(str(exc))


query_app = typer.Typer(no_args_is_help=True, help="Query stored results (read-only): findings, metrics, ticks, "
                        "quarantine, verdicts, incidents, SQL, and the raw logs.")


def _with_length(frame: pd.DataFrame, fmt: str) -> pd.DataFrame:
    """`frame` with a `window` column (its length, 15m or 1h) for a table: windows of several lengths start at
    the same times, and the length tells their rows apart."""
    if fmt != "table" or frame.empty:
        return frame
    return frame.assign(window=[duration_text(e - s) for s, e in zip(frame["window_start"], frame["window_end"],
                                                                    strict=True)])


@query_app.command("findings")
def query_findings(
    service: Service = None, since: Since = None, until: Until = None, version: Version = None,
    check: Annotated[str | None, typer.Option(help="Only this check (latency, drift, ...).")] = None,
    status: Annotated[Literal["ok", "breach", "insufficient"] | None, typer.Option(help="Only findings of this status.")] = None,
    label: Annotated[list[str] | None, typer.Option(help="key=value a finding's labels must hold; repeatable.")] = None,
    segment: Annotated[str | None, typer.Option(help="'all' (all traffic), or a segment like 'Contract=Two year'.")] = None,
    window: Annotated[str | None, typer.Option(help="Only windows of this length (15m, 1h).")] = None,
    group_by: Annotated[str | None, typer.Option(help="Comma list of columns or label keys: check,stage,...")] = None,
    fmt: Format = "table",
) -> None:
    """Check results per window: value, baseline, n, interval; or counts per group."""
    from checks.catalog import names
    from monitor.config import parse_duration

    _, svc, store = _setup(service, version)
    start, end = parse_range(since, until)
    if check is not None and not check.startswith("slo:"):
        one_of("--check", check, list(names()))
    length = _run(lambda: parse_duration(window)) if window else None
    if length is not None:
        lengths = {*svc.buckets.windows, *(svc.quality.windows if svc.quality else [])}
        one_of("--window", duration_text(length), [duration_text(w) for w in sorted(lengths)])
    frame = _run(lambda: q.findings(store, svc.name, since=start, until=end, model_version=version, check=check,
                                    status=status, labels=_run(lambda: parse_labels(label)), segment=segment,
                                    window=length))
    if group_by:
        emit(q.group_findings(frame, split_list(group_by)), fmt, out, title=f"findings of {svc.name} by {group_by}")
        return
    emit(_with_length(frame, fmt), fmt, out, title=f"findings of {svc.name}", json_records=q.finding_records,
         columns=["window_start", "window", "check", "labels", "status", "value", "baseline", "model_version", "n",
                  "window_end", "interval_low", "interval_high"], severity=("status", q.STATUS_RANK))


@query_app.command("metrics")
def query_metrics(
    service: Service = None, since: Since = None, until: Until = None, version: Version = None,
    every: Annotated[str | None, typer.Option(help="One row per period of this length (1h); default: whole range.")] = None,
    segment: Annotated[str, typer.Option(help="'all' (default), a segment like 'Contract=Two year', or '*'.")] = "all",
    group_by: Annotated[str, typer.Option(help="Comma list of model_version, segment (may be empty).")] = "model_version",
    fmt: Format = "table",
) -> None:
    """Requests, status rates, latency percentiles per stage, cache, signals: merged from the bucket partials."""
    from monitor.config import parse_duration

    _, svc, store = _setup(service, version)
    start, end = parse_range(since, until, default=DEFAULT_RANGE)
    step = _run(lambda: parse_duration(every)) if every else None
    groups = split_list(group_by)
    if segment == "*" and "segment" not in groups:
        groups.append("segment")
    frame = _run(lambda: history.metrics(store, svc.name, since=start, until=end, model_version=version,
                                   segment="" if segment == "all" else segment, every=step, group_by=groups))
    # Most telling first (what stays at 80 columns): how much traffic, how slow, how much of it failed.
    cols = ["period_start", *groups, "requests", "total_p95_ms", "error_rate", "timeout_rate", "total_p99_ms",
            "total_p50_ms", "cache_hit_rate", "reject_rate", *(history.RATE_OF[s] for s in history.LOGGED)]
    cols += sorted(c for c in frame.columns if c.endswith("_p99_ms") and c not in cols)
    emit(frame, fmt, out, title=f"metrics of {svc.name}, {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} UTC",
         columns=cols, empty="no stored buckets in this range")


@query_app.command("ticks")
def query_ticks(
    service: Service = None, since: Since = None, until: Until = None,
    status: Annotated[Literal["ok", "error", "running"] | None, typer.Option(help="Only ticks that ended so.")] = None,
    limit: Annotated[int, typer.Option(help="The newest this many.")] = 50,
    fmt: Format = "table",
) -> None:
    """Ticks: when, how they ended, what they read."""
    _, svc, store = _setup(service)
    start, end = parse_range(since, until)
    emit(q.ticks(store, svc.name, since=start, until=end, status=status, limit=limit), fmt, out,
         title=f"ticks of {svc.name}")


@query_app.command("quarantine")
def query_quarantine(
    service: Service = None, since: Since = None, until: Until = None,
    reason: Annotated[str | None, typer.Option(help="Only this reason code.")] = None,
    kind: Annotated[str | None, typer.Option(help="predictions, timings, labels or reference.")] = None,
    group_by: Annotated[str | None, typer.Option(help="Comma list of reason, field, kind, source, tick_id.")] = None,
    limit: Annotated[int, typer.Option(help="Rows shown without --group-by.")] = 200,
    fmt: Format = "table",
) -> None:
    """Rows that broke the data contract, with where they came from and why."""
    _, svc, store = _setup(service)
    start, end = parse_range(since, until)
    frame = _run(lambda: q.quarantine(store, svc.name, since=start, until=end, reason=reason, kind=kind,
                                      group_by=split_list(group_by), limit=None if group_by else limit))
    if group_by:
        emit(frame, fmt, out, title=f"quarantine of {svc.name} by {group_by}")
        return
    emit(frame, fmt, out, title=f"quarantine of {svc.name}", after="line",
         columns=["id", "created_at", "reason", "field", "source", "position", "tick_id"])


@query_app.command("verdicts")
def query_verdicts(
    service: Service = None, since: Since = None, until: Until = None, version: Version = None,
    verdict: Annotated[str | None, typer.Option(help="slower, worse, both, drift, healthy, ...")] = None,
    incident: Annotated[int | None, typer.Option(help="Only the verdicts of this incident.")] = None,
    fmt: Format = "table",
) -> None:
    """Verdicts per window and model version, with their evidence."""
    _, svc, store = _setup(service, version)
    start, end = parse_range(since, until)
    frame = _run(lambda: q.verdicts(store, svc.name, since=start, until=end, model_version=version,
                                    verdict=verdict, incident_id=incident))
    emit(_with_length(frame, fmt), fmt, out, title=f"verdicts of {svc.name}", json_records=q.verdict_records,
         columns=["window_start", "window", "verdict", "model_version", "incident_id", "evidence", "estimated",
                  "window_end"], severity=("verdict", q.VERDICT_RANK))


@query_app.command("incidents")
def query_incidents(
    service: Service = None, since: Since = None, until: Until = None, version: Version = None,
    status: Annotated[Literal["open", "resolved"] | None, typer.Option(help="Only incidents of this status.")] = None,
    fmt: Format = "table",
) -> None:
    """Incidents: verdict, status, when opened and resolved."""
    _, svc, store = _setup(service, version)
    start, end = parse_range(since, until)
    frame = _run(lambda: q.incidents(store, svc.name, since=start, until=end, model_version=version,
                                     status=status))
    if fmt == "table":  # what each is (or why it resolved), a line each below the table
        frame = frame.assign(why=[q.why(r) for r in frame.to_dict("records")])
    emit(frame, fmt, out, title=f"incidents of {svc.name}",
         columns=["id", "status", "verdict", "model_version", "opened_at", "resolved_at", "first_window_start",
                  "last_window_end"], severity=("status", {"open": 0, "resolved": 1}), after="why")


@query_app.command("sql")
def query_sql(
    statement: Annotated[str, typer.Argument(help="One SELECT (or WITH / VALUES / EXPLAIN) statement.")],
    max_rows: Annotated[int, typer.Option(help="Refuse results longer than this.")] = sql.SQL_MAX_ROWS,
    fmt: Format = "table",
) -> None:
    """Run one read-only SQL statement on the store; writes, DDL and several statements are refused."""
    cfg = load_config()
    store = open_store(cfg)
    access = cfg.storage.query_sql
    try:
        password = access.password.resolve() if access.password is not None else None
    except ConfigError as exc:
        fail(f"storage.query_sql.password: {exc}")
    emit(_run(lambda: sql.sql(store, statement, max_rows=max_rows, role=access.role, password=password,
                            timeout=access.timeout.total_seconds())), fmt, out, title=None, empty="no rows")


@query_app.command("logs")
def query_logs(
    service: Service = None, since: Since = None, until: Until = None, version: Version = None,
    stage: Annotated[str | None, typer.Option(help="Rank by this stage's duration (default: total latency_ms).")] = None,
    min_ms: Annotated[float | None, typer.Option(help="Only requests at least this slow (ms); default: the "
                                                  "slowest --slowest percent of the range.")] = None,
    slowest: Annotated[float, typer.Option(help="Without --min-ms: the percent of the range's requests, the "
                                           "slowest, that are listed and compared with all (100: all of them).",
                                           min=0.01, max=100)] = 100 * SLOWEST,
    top: Annotated[int, typer.Option(help="How many requests to list.")] = 20,
    status: Annotated[str | None, typer.Option(help="Only this status.")] = None,
    features: Annotated[bool, typer.Option("--features", help="Also show raw feature values.")] = False,
    fmt: Format = "table",
) -> None:
    """The slowest requests in the raw logs (files, OTLP spans or SQL tables, as configured), and which
    versions, replicas, segments they share."""
    from monitor.contract import STATUSES
    from monitor.investigate.logs import LogsError, drill

    cfg, svc, store = _setup(service)
    start, end = parse_range(since, until, default=DEFAULT_RANGE)
    if status is not None:
        one_of("--status", status, list(STATUSES))
    try:
        with progress("query logs") as observe:
            result = drill(svc, cfg.limits, since=start, until=end, stage=stage, min_ms=min_ms, top=top,
                           model_version=version, status=status, features=features, observe=observe,
                           slowest=slowest / 100 if slowest < 100 else None)
    except (LogsError, OSError) as exc:
        fail(str(exc))
    if version is not None and not result.matched:
        # The logs may hold a version no tick stored yet; one in neither is a typo, named with the stored ones.
        known_version(store, svc.name, "--version", version)
    if fmt == "json":
        sys.stdout.write(dumps({"stage": stage, "min_ms": result.min_ms, "slowest": result.slowest,
                                "matched": result.matched,
                                "scanned": result.scanned, "skipped": result.skipped,
                                "requests": json_records(result.requests),
                                "aggregates": json_records(result.aggregates)}, indent=2) + "\n")
        return
    skipped = sum(result.skipped.values())
    floor = "" if result.min_ms is None else f", at or above {cell(result.min_ms)} ms" + (
        f" (the slowest {result.slowest:.0%}; --min-ms or --slowest to change)" if result.slowest else "")
    emit(result.requests, fmt, out, title=f"slowest {len(result.requests)} of {result.matched:,} matching requests "
         f"({result.scanned:,} in range) by {stage or 'total latency'}{floor}"
         + (f"; {skipped:,} rows left out as the tick quarantines them" if skipped else ""))
    if fmt == "table" and not result.aggregates.empty:
        out.print(table(result.aggregates.head(15), "what the matching requests share (lift = share / share of all)",
                        width=out.width))


def compare_cmd(
    baseline: Annotated[str, typer.Option(help="The version in service now.")],
    candidate: Annotated[str, typer.Option(help="The version under review.")],
    service: Service = None, since: Since = None, until: Until = None, fmt: Format = "table",
) -> None:
    """Two model versions side by side over the same period, with the configured constraints pass / fail."""
    from monitor.aggregate.profile import stored_profile
    from monitor.investigate.compare import compare

    _, svc, store = _setup(service)
    known_version(store, svc.name, "--baseline", baseline)
    known_version(store, svc.name, "--candidate", candidate)
    start, end = parse_range(since, until, default=DEFAULT_RANGE)
    profile, _ = stored_profile(store, svc) if svc.reference is not None else (None, None)
    result = _run(lambda: compare(store, svc, baseline, candidate, start, end, profile))
    if fmt == "json":
        sys.stdout.write(dumps({
            "baseline": baseline, "candidate": candidate, "since": q.jsonable(start), "until": q.jsonable(end),
            "metrics": q.records(result.table), "constraints": q.records(result.constraints),
            "passed": result.passed}, indent=2) + "\n")
    elif fmt == "csv":
        emit(result.table, fmt, out)
    else:
        out.print(_comparison(result.table, baseline, candidate,
                              f"{svc.name}: {baseline} vs {candidate}, {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} UTC"))
        if len(result.constraints):
            out.print(table(result.constraints, "hard constraints", width=out.width))
            out.print("[bold green]candidate passes every constraint[/]" if result.passed
                      else "[bold red]candidate fails a constraint[/]")
        else:
            out.print("[dim]no constraints configured (services[].compare.constraints)[/]")
    if not result.passed:
        raise typer.Exit(1)


def _comparison(frame, baseline: str, candidate: str, title: str) -> Table:
    """The metrics of `compare` with their units: shares as %, their difference in percentage points (pp), the
    ratio candidate / baseline as ×; numbers with thousands separators."""
    shown = Table(title=title)
    shown.add_column("metric", overflow="fold", min_width=8)
    shown.add_column("unit", no_wrap=True)
    for name in (baseline, candidate, "difference", "ratio"):
        shown.add_column(name, justify="right", no_wrap=True)
    for row in frame.itertuples(index=False):
        share = row.unit == "share"

        def value(v, share=share) -> str:
            return "-" if v is None or pd.isna(v) else f"{v:.2%}" if share else cell(float(v))

        diff = row.difference
        if diff is None or pd.isna(diff):
            change = "-"
        else:
            change = f"{diff * 100:+.2f} pp" if share else ("+" if diff > 0 else "") + cell(float(diff))
        ratio = "-" if row.ratio is None or pd.isna(row.ratio) else "×" + cell(float(row.ratio))
        shown.add_row(Text(row.metric), "%" if share else row.unit, value(row.baseline), value(row.candidate),
                      change, ratio)
    return shown


def report_cmd(
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the HTML.")] = Path("report.html"),
    incident: Annotated[int | None, typer.Option(help="Save this incident's page (its own range).")] = None,
    service: Service = None, since: Since = None, until: Until = None,
    evidently: Annotated[bool, typer.Option(help="Embed Evidently's drift report (needs the raw logs).")] = True,
    fmt: Format = "table",
) -> None:
    """Save a page of the web UI as one self-contained HTML file: the incident page, or the service overview
    for a range (default: the last 24 h), with Evidently's drift report (`--format` applies to the line
    saying what was written)."""
    from monitor.ui.report import build_report

    cfg, svc, store = _setup(service)
    if incident is not None and (since is not None or until is not None):
        fail("--incident: the page covers the incident's own range; leave out --since and --until")
    start, end = parse_range(since, until, default=None if incident is not None else DEFAULT_RANGE)
    with progress("report") as observe:
        html = _run(lambda: build_report(cfg, store, svc, since=start, until=end, incident_id=incident,
                                         evidently=evidently, observe=observe))
    output.write_text(html, encoding="utf-8")
    record = {"wrote": str(output), "bytes": len(html.encode()), "service": svc.name, "since": start, "until": end,
              "incident": incident}
    render([record], fmt, lambda: out.print(f"wrote {output} ({len(html) / 1e6:.1f} MB)", soft_wrap=True),
           document=record)


def explain_cmd(
    incident: Annotated[int, typer.Argument(help="The incident id (see `tailwatch query incidents`).")],
    service: Service = None, fmt: Format = "table",
) -> None:
    """Explain an incident: verdict, evidence chain, stage latency before and during, what changed, next queries."""
    from dataclasses import replace

    from monitor.investigate.explain import explain, render
    from monitor.investigate.logs import LogsError, stages_by_value

    cfg, svc, store = _setup(service)
    groups = svc.quality.groups if svc.quality is not None else {}
    result = _run(lambda: explain(store, svc.name, incident, groups=groups))
    hot = result.named.get("hotspots") or []
    if hot and result.window is not None:
        # The hot value's stages come from the raw logs: the stored partials time each routing value in total.
        field, _, value = hot[0].partition("=")
        try:
            by_value = stages_by_value(svc, cfg.limits, field=field, value=value, before=result.before,
                                       during=result.window, model_version=result.incident.get("model_version"))
            result = replace(result, hotspot=by_value.as_dict())
        except (LogsError, OSError) as exc:
            err.print(f"[dim]no per-stage latency of {escape(hot[0])}: {escape(str(exc))}[/]")
    if fmt == "json":
        sys.stdout.write(dumps(q.jsonable(result.as_dict()), indent=2) + "\n")
    else:
        render(result, out)


def register(app: typer.Typer) -> None:
    """Add query (a group), compare, report and explain to the `tailwatch` app."""
    app.add_typer(query_app, name="query")
    app.command("compare")(compare_cmd)
    app.command("report")(report_cmd)
    app.command("explain")(explain_cmd)


