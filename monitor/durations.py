"""Durations as the config and the command line write them: `250ms`, `30s`, `5m`, `1h`, `1d`."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(value: Any) -> timedelta:
    """`5m`, `1h`, `30s`, `1d`, `250ms` or seconds as a number -> timedelta."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"not a duration (use e.g. 30s, 5m, 1h, 1d): {value!r}")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def duration_text(d: timedelta) -> str:
    """A whole-second duration as parse_duration reads it back: `1h`, `15m`, `90s`, `2d`."""
    seconds = int(d.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
