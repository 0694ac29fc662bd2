"""What every command of the `tailwatch` command line shares: the consoles, the config and store it
opens, the one-line failure, the clock (`--now`) it parses, the `--format` option and the renderer of
records in that format, and the help's metavars."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

import pandas as pd
import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperArgument, TyperGroup

from monitor import config as config_mod
from monitor.config import ConfigError
from monitor.investigate.output import FORMATS, dumps, emit, json_cell, time_range

Format = Annotated[Literal[FORMATS], typer.Option("--format", "-f",
                                     help="table, json or csv (csv: the rows of the json, flattened).")]

Service = Annotated[str | None, typer.Option("--service", "-s", help="The service (default: the only one).")]
Services = Annotated[str | None, typer.Option("--service", "-s", help="Only this service (default: every one).")]

out = Console()
err = Console(stderr=True)


class State:
    config_path: str | None = None
    quiet: bool = False  # no progress on stderr (monitor.cli.progress)


def fail(message: str, code: int = 2) -> None:
    """Print a one-line error (no traceback) and exit non-zero. `message` is plain text: it may quote a path,
    a value or a line from the logs."""
    err.print(Text("error: ", style="bold red") + Text(message), highlight=False)
    raise typer.Exit(code)


def one_of(option: str, value: str, valid: list[str]) -> None:
    """Fail (exit 2) unless `value` is one of `valid`, listing them."""
    if value not in valid:
        fail(f"{option}: no {option.lstrip('-')} {value!r}; one of: {', '.join(valid) or '(none configured)'}")


def one_service(cfg: config_mod.Config, name: str | None) -> config_mod.Service:
    """The service `--service` names, or the only one configured; else a one-line error listing them."""
    if name is None:
        if len(cfg.services) == 1:
            return cfg.services[0]
        fail(f"--service: several services configured ({', '.join(s.name for s in cfg.services)}); pick one")
    one_of("--service", name, [s.name for s in cfg.services])
    return next(s for s in cfg.services if s.name == name)


def some_services(cfg: config_mod.Config, name: str | None) -> list[config_mod.Service]:
    """Every configured service, or only the one `--service` names (an unknown name is an error listing them)."""
    if name is None:
        return list(cfg.services)
    return [one_service(cfg, name)]


def known_version(store, service: str, option: str, version: str | None) -> None:
    """Fail (exit 2) unless `version` is None or a model version `service` has stored buckets of, listing them."""
    if version is not None:
        with store.transaction() as session:
            stored = store.partials.versions(session, service)
        if version not in stored:
            fail(f"{option}: no stored model version {version!r} of service {service}; "
                 f"one of: {', '.join(stored) or '(none stored yet)'}")


def load_config() -> config_mod.Config:
    try:
        cfg = config_mod.load(State.config_path)
    except ConfigError as exc:
        fail(str(exc))
    for warning in cfg.warnings():
        err.print(Text("warning: ", style="yellow") + Text(warning))
    return cfg


def load_storage() -> config_mod.Storage:
    """The config's `storage` section alone (what the schema commands need), or a one-line error."""
    try:
        storage = config_mod.load_storage(State.config_path)
    except ConfigError as exc:
        fail(str(exc))
    for secret in (storage.password, storage.query_sql.password):
        for warning in secret.warnings() if secret is not None else []:
            err.print(Text("warning: ", style="yellow") + Text(warning))
    return storage


def open_store(cfg: config_mod.Config, *, check_schema: bool = True):
    return open_database(cfg.storage, check_schema=check_schema)


def open_database(storage: config_mod.Storage, *, check_schema: bool = True):
    from storage.database import SchemaError
    from storage.store import Store

    try:
        password = storage.password.resolve() if storage.password else None
        store = Store(storage.url, password=password)
        if check_schema:
            store.ensure_current()
    except (ConfigError, SchemaError) as exc:
        fail(str(exc))
    except Exception as exc:  # driver errors: say which database, never the password
        fail(f"cannot open the database: {type(exc).__name__}: {_safe(exc)}")
    return store


def _safe(exc: Exception) -> str:
    return str(exc).splitlines()[0][:300] if str(exc) else ""


def parse_range(since: str | None, until: str | None, now: datetime | None = None,
                default: timedelta | None = None) -> tuple[datetime | None, datetime | None]:
    """`--since` / `--until`, each RFC 3339 or a duration before `now` (6h, 7d): [since, until) in UTC,
    or a one-line error (exit 2)."""
    try:
        return time_range(since, until, now, default)
    except ValueError as exc:
        fail(str(exc))


def parse_now(value: str | None) -> datetime:
    if value is None:
        return datetime.now(UTC)
    try:
        ts = pd.Timestamp(value)
    except ValueError:
        fail(f"--now: not a timestamp: {value!r} (use RFC 3339, e.g. 2026-11-02T12:00:00Z)")
    return (ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")).to_pydatetime()


def render(records: list[dict[str, Any]], fmt: str, table: Callable[[], None], *, document: Any = None) -> None:
    """Print `records` as JSON (`document` instead, when given: records with their context), as CSV (one
    line per record, nested values as JSON), or as a table by calling `table`. Times in JSON and CSV are
    RFC 3339 UTC with `Z`."""
    if fmt == "json":
        sys.stdout.write(dumps(json_cell(records if document is None else document), indent=2,
                               ensure_ascii=False) + "\n")
    elif fmt == "csv":
        emit(pd.DataFrame.from_records([json_cell(r) for r in records]), "csv", out)
    else:
        table()


# Metavars the help shows, by option name; any other option shows its name in capitals, a flag none.
METAVARS = {"now": "TIME", "since": "TIME", "until": "TIME", "service": "NAME", "version": "VERSION",
            "step": "DURATION", "duration": "DURATION", "window": "DURATION", "every": "DURATION",
            "matcher": "MATCHER", "label": "KEY=VALUE", "created_by": "NAME", "accepted_by": "NAME"}


class Grammar(TyperGroup):
    """The root group: before any command runs or prints its help, every option of every command gets a
    metavar a person reads (TIME, NAME, table|json|csv), never a Python type."""

    def make_context(self, info_name, args, parent=None, **extra):
        _metavars(self, self.context_class(self, info_name=info_name, parent=parent))
        return super().make_context(info_name, args, parent, **extra)


class Positional(TyperArgument):
    """A positional argument in the help: its metavar (DATASET, INCIDENT), without a Python type beside it."""

    def display_type_rich(self, ctx) -> str | None:
        return None


def _metavars(command, ctx) -> None:
    if getattr(command, "help", None) and not command.short_help:
        # The command list shows a command's first sentence on one line (rich keeps the docstring's line
        # ends there); the command's own --help shows the whole text.
        text = " ".join(command.help.split())
        command.short_help = text[:text.index(". ") + 1] if ". " in text else text
    help_option = command.get_help_option(ctx)
    for param in [*command.params, *([help_option] if help_option else [])]:
        if isinstance(param, TyperArgument):
            param.__class__ = Positional
        descriptor = getattr(param, "type_descriptor", None)
        if param.metavar is not None or (descriptor is not None and descriptor.is_choice):
            continue  # a choice shows its values (table|csv|json)
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            param.metavar = ""
        else:
            param.metavar = METAVARS.get(param.name or "", (param.name or "value").upper())
    for sub in getattr(command, "commands", {}).values():
        _metavars(sub, ctx)
