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
from rich.table import Table

from monitor import config as config_mod
from monitor.config import ConfigError

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
    from monitor.runner import tick as run_tick

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
    store.upgrade()
    out.print(f"database at revision {store.current_revision()} (head {store.head_revision()})")


@db_app.command("current")
def db_current() -> None:
    """Show the database's schema revision and the one this tailwatch expects."""
    cfg = load_config()
    store = open_store(cfg, check_schema=False)
    out.print(f"database: {store.current_revision() or 'empty'}; this tailwatch: {store.head_revision()}")


@reference_app.command("build")
def reference_build(
    service: Annotated[str | None, typer.Option(help="Only this service (default: every one with a reference).")] = None,
) -> None:
    """Profile each service's reference dataset and store the profile."""
    from monitor.profile import store_profile

    cfg = load_config()
    store = open_store(cfg)
    chosen = [s for s in cfg.services if service in (None, s.name)]
    if service is not None and not chosen:
        fail(f"--service: no service named {service!r}")
    table = Table(title="reference profiles")
    for col in ("service", "rows", "fields", "fingerprint", "source"):
        table.add_column(col)
    for svc in chosen:
        if svc.reference is None:
            err.print(f"[yellow]skipped:[/] service {svc.name} has no reference configured")
            continue
        try:
            profile = store_profile(store, svc)
        except (OSError, ValueError) as exc:
            fail(f"service {svc.name}: cannot profile {svc.reference.path}: {exc}")
        table.add_row(svc.name, f"{profile.rows:,}", ", ".join(profile.fields), profile.fingerprint,
                      str(svc.reference.path))
    out.print(table)


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


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run() -> None:
    """Run the daemon (scheduled ticks and nightly jobs)."""
    _not_yet("run", 7, "the scheduled daemon")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def backfill() -> None:
    """Replay history in event-time order exactly as live ticks would."""
    _not_yet("backfill", 7, "backfill")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def nightly() -> None:
    """Score every matured window against its delayed labels."""
    _not_yet("nightly", 5, "label scoring")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def query() -> None:
    """Query stored metrics, findings, incidents, quarantine and ticks."""
    _not_yet("query", 8, "the query commands")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def explain() -> None:
    """Explain an incident: verdict, evidence, what changed, next queries."""
    _not_yet("explain", 8, "incident explanation")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def report() -> None:
    """Write a self-contained HTML report."""
    _not_yet("report", 8, "the HTML report")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
