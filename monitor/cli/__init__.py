"""The `tailwatch` command line: the app, its global options, and its commands in the order help lists
them (commands of the pipeline, investigation and alerts; then the groups)."""

from __future__ import annotations

import sys
from importlib.metadata import version
from typing import Annotated

import typer

from monitor.cli.alerts import accept, alerts_list, notify_app, silence_app
from monitor.cli.check import check_logs
from monitor.cli.common import Grammar, State, out
from monitor.cli.investigate import register
from monitor.cli.pipeline import backfill, demo, init, nightly, run, scan, tick
from monitor.cli.reference import db_app, reference_app
from monitor.cli.ui import ui

app = typer.Typer(cls=Grammar, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="tailwatch: tells 'the service got slower' apart from 'the predictions got worse'.")
app.add_typer(db_app, name="db")
app.add_typer(reference_app, name="reference")


def _version(shown: bool) -> None:
    if shown:
        out.print(f"tailwatch {version('tailwatch')}", highlight=False)
        raise typer.Exit()


@app.callback()
def main_options(
    config: Annotated[str | None, typer.Option("--config", "-c", metavar="FILE", help="Config file (default $TAILWATCH_CONFIG, then ./tailwatch.yaml).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr (shown only when stderr is a terminal).")] = False,
    show_version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print tailwatch's version and exit.")] = False,
) -> None:
    State.config_path = config
    State.quiet = quiet


app.command()(init)
app.command()(tick)
app.command("check-logs")(check_logs)
app.command()(demo)
app.command()(run)
app.command()(backfill)
app.command()(nightly)
# investigation: query, compare, report, explain; defined in monitor.cli.investigate
register(app)
app.command()(scan)
app.add_typer(silence_app, name="silence")
app.add_typer(notify_app, name="notify")
app.command("alerts")(alerts_list)
app.command()(accept)
app.command()(ui)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
