"""Structured logs on stderr, with every configured secret value redacted: one JSON object per line, or
one text line per record carrying the same fields as `key=value` pairs after its message."""

from __future__ import annotations

import json
import logging
import sys
import traceback
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus

from pydantic import BaseModel
from pythonjsonlogger.json import JsonFormatter

from monitor.config import Config, ConfigError, Secret

REDACTED = "***"
MIN_SECRET_CHARS = 4  # shorter values would redact ordinary words; such a secret is too weak to hide anyway
# LogRecord attributes that are not `extra` fields.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class Redact(logging.Filter):
    """Replaces every secret value (and its URL-quoted forms) in a record's message, exception and extras."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.forms: list[str] = []
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        forms = set(self.forms)
        for secret in secrets:
            if secret and len(secret) >= MIN_SECRET_CHARS:
                forms |= {secret, quote(secret, safe=""), quote_plus(secret)}
        # Longest first, so a secret holding another secret is replaced whole.
        self.forms = sorted(forms, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for form in self.forms:
            text = text.replace(form, REDACTED)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.forms:
            return True
        record.msg, record.args = self.scrub(record.getMessage()), None
        if record.exc_info:
            # Formatted here so the traceback (and the exception message in it) is redacted too.
            record.exc_text = self.scrub("".join(traceback.format_exception(*record.exc_info)).rstrip())
            record.exc_info = None
        if record.stack_info:
            record.stack_info = self.scrub(record.stack_info)
        for key, value in list(vars(record).items()):
            if key not in _STANDARD and isinstance(value, str):
                setattr(record, key, self.scrub(value))
        return True


class TextFormatter(logging.Formatter):
    """`time level logger: message key=value ...`: a record's `extra` fields after its message, as the JSON
    format writes them; a value with spaces, quotes or `=` is written as a JSON string."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        line = super().formatMessage(record)
        pairs = [f"{key}={_text_value(value)}" for key, value in vars(record).items() if key not in _STANDARD]
        return " ".join([line, *pairs])


def _text_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
    if text and not any(c.isspace() or c in "\"=" for c in text):
        return text
    return json.dumps(text, ensure_ascii=False)


def config_secrets(config: Config) -> list[str]:
    """The values of every `Secret` in the config (storage, SQL sources, Slack, ...) that resolves now,
    and any password in the storage URL."""
    values: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, Secret):
            try:
                values.append(node.resolve())
            except ConfigError:
                pass  # unset: nothing to hide; whatever needs it reports that by name
        elif isinstance(node, BaseModel):
            for name in type(node).model_fields:
                walk(getattr(node, name))
        elif isinstance(node, list | tuple):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for item in node.values():
                walk(item)

    walk(config)
    return values


_ACTIVE = Redact()  # the filter of the last setup(): what scrub() applies


def scrub(text: str) -> str:
    """`text` with every secret known to logging replaced (for messages stored or sent, not only logged)."""
    return _ACTIVE.scrub(text)


def setup(fmt: str = "json", level: str = "INFO", secrets: Iterable[str] = (), stream=None) -> Redact:
    """Route every logger to one handler on `stream` (default stderr) in `fmt` json or text, behind a
    Redact filter of `secrets`; returns the filter so later secrets can be added."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(
            "{asctime}{levelname}{name}{message}", style="{",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            datefmt="%Y-%m-%dT%H:%M:%S%z", json_ensure_ascii=False))
    else:
        handler.setFormatter(TextFormatter())
    global _ACTIVE
    redact = _ACTIVE = Redact(secrets)
    handler.addFilter(redact)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # APScheduler logs every run at INFO; its errors and misses reach our own listener and log lines.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    # Alembic names its dialect implementation each time it reads the schema revision: on every /readyz.
    logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)
    return redact
