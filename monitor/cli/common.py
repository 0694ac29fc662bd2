"""What every command of the `tailwatch` command line shares: the consoles, the config and store it
opens, the one-line failure, and the clock (`--now`) it parses."""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
import typer
from rich.console import Console

from monitor import config as config_mod
from monitor.config import ConfigError

out = Console()
err = Console(stderr=True)


class State:
    config_path: str | None = None


def fail(message: str, code: int = 2) -> None:
    """Print a one-line error (no traceback) and exit non-zero."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    raise typer.Exit(code)


def load_config() -> config_mod.Config:
    try:
        cfg = config_mod.load(State.config_path)
    except ConfigError as exc:
        fail(str(exc))
    for warning in cfg.warnings():
        err.print(f"[yellow]warning:[/] {warning}")
    return cfg


def open_store(cfg: config_mod.Config, *, check_schema: bool = True):
    from storage.database import SchemaError
    from storage.store import Store

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
