"""The commands that run the pipeline: `init`, `tick`, `demo`, `run`, `backfill`, `nightly` and `scan`."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from monitor import config as config_mod
from monitor.cli.common import (
    Format,
    Service,
    Services,
    _safe,
    fail,
    load_config,
    one_service,
    open_store,
    out,
    parse_now,
    parse_range,
    render,
    some_services,
)
from monitor.cli.progress import progress
from monitor.durations import duration_text


def init(
    path: Annotated[Path, typer.Argument(help="Where to write the example config.")] = Path(config_mod.DEFAULT_PATH),
    force: Annotated[bool, typer.Option(help="Overwrite an existing file.")] = False,
    fmt: Format = "table",
) -> None:
    """Write a commented example config."""
    if path.exists() and not force:
        fail(f"{path} exists; use --force to overwrite")
    path.write_text(config_mod.example(), encoding="utf-8")
    record = {"wrote": str(path), "next": ["tailwatch check-logs", "tailwatch db upgrade", "tailwatch tick"]}
    render([record], fmt, lambda: out.print(f"wrote {path}; edit its sources and schema, check them with "
                                            "`tailwatch check-logs`, then run `tailwatch db upgrade` and "
                                            "`tailwatch tick`", soft_wrap=True),
           document=record)


def tick(
    now: Annotated[str | None, typer.Option(help="The clock for this tick (RFC 3339, UTC); default: now.")] = None,
    service: Services = None,
    fmt: Format = "table",
) -> None:
    """Run one tick: ingest new rows, quarantine bad ones, join timings, store bucket counts."""
    from monitor.daemon.runner import tick as run_tick

    cfg = load_config()
    if service is not None:
        cfg = cfg.model_copy(update={"services": some_services(cfg, service)})
    store = open_store(cfg)
    with progress("tick") as observe:
        reports = run_tick(cfg, store, parse_now(now), observe)
    render([tick_record(r) for r in reports], fmt, lambda: [print_report(report) for report in reports])
    if any(r.status != "ok" for r in reports):
        raise typer.Exit(1)


def tick_record(report) -> dict:
    """A tick's report as a record; its times (held as text) as times, so JSON writes them with `Z`."""
    record = report.as_dict()
    for key in ("now", "first_ts", "last_ts"):
        if record.get(key):
            record[key] = pd.Timestamp(record[key])
    return record


def print_report(report, console: Console = out) -> None:
    """A tick's report as a table a person reads in ten seconds."""
    # Plain text: "[ok]" as markup is a style and vanished, and a service's name is the user's.
    now = pd.Timestamp(report.now).tz_convert("UTC")
    table = Table(title=Text(f"tick {now:%Y-%m-%d %H:%M:%S} UTC · service {report.service} · {report.status}",
                             style="table.title"),
                  show_header=False)
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
        first, last = (pd.Timestamp(t).tz_convert("UTC") for t in (report.first_ts, report.last_ts))
        table.add_row("event time", f"{first:%Y-%m-%d %H:%M:%S} .. {last:%Y-%m-%d %H:%M:%S} UTC")
    table.add_row("tick time", f"{report.seconds:.2f} s")
    console.print(table)
    # Plain text: an error, a warning or an event may quote a path or a line from the logs.
    if report.error:
        console.print(Text("error: ", style="red") + Text(report.error))
    for line in report.warnings:
        console.print(Text("warning: ", style="yellow") + Text(line))
    for line in report.events + report.notes:
        console.print(Text(f"- {line}", style="dim"))

def demo(
    scenario: Annotated[str, typer.Option(help="Simulator scenario to run.")] = "slower-batching",
    hours: Annotated[float, typer.Option(help="Simulated hours.")] = 6.0,
    seed: Annotated[int, typer.Option(help="Simulator seed.")] = 7,
    keep: Annotated[Path | None, typer.Option(help="Keep the generated logs and database in this directory.")] = None,
    fmt: Format = "table",
) -> None:
    """Generate a simulated serving scenario, tick over it with an injected clock, show what was seen
    (`--format json|csv`: only its summary record)."""
    from monitor.demo import run_demo

    try:
        summary = run_demo(scenario=scenario, hours=hours, seed=seed, keep=keep,
                           console=out if fmt == "table" else Console(quiet=True))
    except ValueError as exc:
        fail(str(exc))
    render([summary], fmt, lambda: None, document=summary)


def run(
    once: Annotated[bool, typer.Option("--once", help="Run one tick job (tick, recovery, after-tick stages) and exit.")] = False,
    now: Annotated[str | None, typer.Option(help="With --once: the clock for the tick (RFC 3339, UTC); default: now.")] = None,
    fmt: Format = "table",
) -> None:
    """Run the daemon: scheduled ticks and nightly jobs, leader lock, /livez /readyz /metrics. With --once,
    print the tick's reports in `--format` (the daemon itself logs as daemon.log_format says)."""
    from monitor.daemon import jobs, leader, logs
    from monitor.daemon.service import Daemon
    from storage.lock import for_store

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
        lock = for_store(store, cfg.daemon.lock_key)
    except ValueError as exc:
        fail(str(exc))
    if not lock.acquire():
        fail("another tailwatch process holds the leader lock; not ticking", code=3)
    try:
        reports = jobs.tick_job(cfg, leader.Fenced(store, lock), parse_now(now))
    finally:
        lock.release()
    render([tick_record(r) for r in reports], fmt, lambda: [print_report(report) for report in reports])
    if any(r.status != "ok" for r in reports):
        raise typer.Exit(1)


def backfill(
    since: Annotated[str, typer.Option(help="Where the replay clock starts (RFC 3339, UTC, or a duration before now: 7d).")],
    until: Annotated[str, typer.Option(help="Where it stops (RFC 3339 or a duration before now); rows after it are left for the daemon.")],
    step: Annotated[str | None, typer.Option(help="How far the clock moves per tick, e.g. 15m, 1h (default: the "
                                             "smallest configured window; daemon.interval plays no part).")] = None,
    staging: Annotated[Path | None, typer.Option(help="Directory for the replayed files (default: beside the SQLite file, or ./tailwatch-backfill).")] = None,
    max_steps: Annotated[int | None, typer.Option(help="Stop after this many steps (rerun to resume).", min=1)] = None,
    fmt: Format = "table",
) -> None:
    """Replay history in event-time order exactly as live ticks would; rerun the same command to resume."""
    from monitor.daemon import backfill as backfill_mod
    from monitor.daemon import leader, logs
    from storage.lock import for_store

    try:
        length = config_mod.parse_duration(step) if step is not None else None
    except ValueError as exc:
        fail(f"--step: {exc}")
    cfg = load_config()
    store = open_store(cfg)
    logs.setup(cfg.daemon.log_format, "WARNING", logs.config_secrets(cfg) + store._secrets)
    start, end = parse_range(since, until)
    lock = for_store(store, cfg.daemon.lock_key)
    if not lock.acquire():
        fail("another tailwatch process (the daemon?) holds the leader lock; stop it before a backfill", code=3)
    try:
        with progress("backfill", "steps") as observe:
            result = backfill_mod.run(cfg, leader.Fenced(store, lock), start, end, step=length, staging=staging,
                                      observe=observe, max_steps=max_steps)
    except backfill_mod.BackfillError as exc:
        fail(str(exc))
    finally:
        lock.release()
    resumed = f" (resumed after {result.resumed_from:%Y-%m-%d %H:%M})" if result.resumed_from else ""
    state = "done" if result.done else "stopped; rerun the same command to resume"
    summaries = backfill_mod.summarize(cfg, store, result.run_id)
    record = {"run_id": result.run_id, "steps": result.steps, "step_seconds": result.step.total_seconds(),
              "resumed_from": result.resumed_from, "reached": result.reached, "done": result.done,
              "services": [dataclasses.asdict(s) for s in summaries]}

    def show() -> None:
        out.print(f"backfill run {result.run_id}: {result.steps:,} steps of {duration_text(result.step)}{resumed}, "
                  f"clock at {result.reached:%Y-%m-%d %H:%M} UTC: {state}", highlight=False)
        for line in _backfill_lines(summaries):
            out.print(line, highlight=False, markup=False)

    render([record], fmt, show, document=record)


def _backfill_lines(summaries) -> list[str]:
    """A backfill's summary per service, as a person reads it."""
    lines = []
    for s in summaries:
        kinds = ", ".join(f"{s.read.get(k, 0):,} {k}" for k in ("predictions", "timings", "labels") if k in s.read)
        timed = f"{s.joined:,} joined with timings, {s.unmatched:,} without, {s.orphan_timings:,} orphan timings"
        quarantined = ", ".join(f"{k} {n:,}" for k, n in sorted(s.quarantined.items(), key=lambda kv: -kv[1]))
        opened = (f"{len(s.incidents):,} incidents opened ({', '.join(str(i) for i in s.incidents[:10])}"
                  + (", ..." if len(s.incidents) > 10 else "") + ")") if s.incidents else "0 incidents opened"
        failed = f"; {s.failed_steps:,} steps failed (see the log)" if s.failed_steps else ""
        lines.append(f"  {s.service}: read {kinds or 'nothing'}; {timed}; quarantined: {quarantined or 'none'}; "
                     f"{opened}{failed}")
    return lines


def nightly(
    now: Annotated[str | None, typer.Option(help="The clock (RFC 3339, UTC); default: now.")] = None,
    date: Annotated[str | None, typer.Option(help="Score as of the end of this UTC day (YYYY-MM-DD).")] = None,
    service: Services = None,
    fmt: Format = "table",
) -> None:
    """Score every matured window against its delayed labels (idempotent: a rerun rewrites the same results)."""
    from datetime import timedelta

    from monitor.alerts.render import plain
    from monitor.daemon.nightly import run_nightly

    if now is not None and date is not None:
        fail("give --now or --date, not both")
    clock = parse_now(now)
    if date is not None:
        try:
            clock = datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=UTC) + timedelta(days=1)
        except ValueError:
            fail(f"--date: not a date: {date!r} (use YYYY-MM-DD)")
    cfg = load_config()
    some_services(cfg, service)
    store = open_store(cfg)
    if service is None:
        from monitor.daemon import retention

        retention.apply(cfg, store, clock)  # the same nightly run as the daemon's: compaction and expiry first
    report = run_nightly(cfg, store, clock, service)
    services = [{k: v for k, v in s.__dict__.items() if k != "scored"} for s in report.services]
    if fmt != "table":
        render(services, fmt, lambda: None,
               document={"now": pd.Timestamp(report.now), "seconds": report.seconds, "services": services})
        return
    table = Table(title=f"nightly quality  {report.now}  ({report.seconds:.2f} s)")
    for col in ("service", "windows", "matured", "findings", "breaches", "pruned", "failed as miss"):
        table.add_column(col, justify="left" if col == "service" else "right")
    for s in report.services:
        table.add_row(s.service, f"{s.windows:,}", f"{s.matured:,}", f"{s.findings:,}", f"{len(s.breaches):,}",
                      f"{s.pruned:,}", "yes" if s.failed_as_miss else "no")
    out.print(table)
    for s in report.services:
        for line in s.breaches[:20]:
            out.print(Text("breach ", style="red") + Text(plain(f"{s.service} {line}")), highlight=False)
        if s.estimate_error:
            errs = ", ".join(f"{k} {v:.3f}" for k, v in sorted(s.estimate_error.items()))
            out.print(f"[dim]{s.service}: estimate mean |error| vs realized: {errs}[/]", highlight=False)
    if not report.services:
        out.print("[yellow]no service has a `quality` section[/]")


def scan(
    dataset: Annotated[str, typer.Argument(help="Parquet dataset of joined prediction rows (path or fsspec URL).")],
    since: Annotated[str | None, typer.Option(help="Only rows with ts at or after this (RFC 3339, or a duration before --now: 6h).")] = None,
    until: Annotated[str | None, typer.Option(help="Only rows with ts before this (RFC 3339, or a duration before --now).")] = None,
    engine: Annotated[str | None, typer.Option(help="local or dask (default: the config's engine.kind).")] = None,
    scheduler: Annotated[str | None, typer.Option(help="Dask scheduler address (default: engine.scheduler).")] = None,
    service: Service = None,
    now: Annotated[str | None, typer.Option(help="The clock (RFC 3339): windows ending later are not scored.")] = None,
    fmt: Format = "table",
) -> None:
    """Fold a Parquet dataset into bucket partials (locally or on Dask), store them, score their windows."""
    from monitor.daemon.engines.scan import run_scan

    cfg = load_config()
    chosen = [one_service(cfg, service)]
    try:
        settings = cfg.engine.model_copy(update={k: v for k, v in (("kind", engine), ("scheduler", scheduler))
                                                 if v is not None})
        settings = config_mod.Engine.model_validate(settings.model_dump())
    except ValueError as exc:
        fail(f"--engine/--scheduler: {_safe(exc)}")
    clock = parse_now(now)
    bounds = parse_range(since, until, clock)
    store = open_store(cfg)
    try:
        with progress("scan") as observe:
            report = run_scan(cfg, chosen[0], store, dataset, clock, *bounds, engine=settings, observe=observe)
    except (OSError, ValueError) as exc:
        fail(f"cannot scan {dataset}: {type(exc).__name__}: {_safe(exc)}")
    result = report.result
    breaches = [(s, f) for s in report.scored for f in s.findings if f.status == "breach"]
    record = {"dataset": dataset, "engine": settings.kind, "service": chosen[0].name, **result.counts,
              "chunks": result.chunks, "partials": len(result.partials), "gathered_bytes": result.gathered_bytes,
              "seconds": result.seconds, "findings": report.findings,
              "breaches": [{"window_start": s.start, "window_end": s.end, "model_version": s.model_version,
                            "check": f.check, "labels": f.labels, "n": f.n} for s, f in breaches]}
    render([record], fmt, lambda: _print_scan(dataset, settings.kind, chosen[0].name, report, breaches),
           document=record)


def _print_scan(dataset: str, engine: str, service: str, report, breaches: list) -> None:
    from monitor.verdicts.stage import describe_labels

    result = report.result
    table = Table(title=Text(f"scan {dataset}  engine {engine}  service {service}", style="table.title"),
                  show_header=False)
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
    for s, f in breaches[:30]:
        out.print(Text("breach ", style="red") + Text(
            f"{s.start:%Y-%m-%d %H:%M}+{int((s.end - s.start).total_seconds() // 60)}m {s.model_version} {f.check} "
            f"{describe_labels(f.labels)} (n={f.n})"), highlight=False, soft_wrap=True)
    if len(breaches) > 30:
        out.print(f"... and {len(breaches) - 30:,} more breaches; all of them: "
                  f"`tailwatch query findings --service {service} --status breach`", highlight=False, soft_wrap=True)

