"""Printing query results: a rich table for people, CSV or JSON (the stable shapes of docs/investigate.md)
for scripts; and the time and filter arguments the investigation commands share."""

from __future__ import annotations

import base64
import json
import math
import re
import sys
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from monitor.config import parse_duration
from monitor.investigate.query import jsonable

FORMATS = ("table", "csv", "json")
MAX_CELL = 60
# A time held as text in a stored document (an alert's annotations), written with +00:00.
UTC_TEXT = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?)\+00:00")


def json_cell(value: Any) -> Any:
    """`query.jsonable`, for any cell a table or a query can hold: a time without a zone is UTC (as
    stored), and so is a time held as text with +00:00 (written with `Z`); what JSON has no type for is left
    to `json_default`."""
    if isinstance(value, datetime | pd.Timestamp) and not pd.isna(value) and value.tzinfo is None:
        value = pd.Timestamp(value).tz_localize("UTC")
    if isinstance(value, dict):
        return {str(k): json_cell(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_cell(v) for v in value]
    if isinstance(value, str) and (utc := UTC_TEXT.fullmatch(value)):
        return utc.group(1) + "Z"
    return jsonable(value)


def json_default(value: Any) -> Any:
    """JSON for the cell types `json.dumps` refuses: bytes as base64 text, decimals as numbers, dates and
    times as ISO text, durations in seconds, arrays as lists; anything else as its text."""
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Decimal):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, pd.Timedelta | timedelta):
        return pd.Timedelta(value).total_seconds()
    if isinstance(value, date | time):
        return value.isoformat()
    if hasattr(value, "tolist"):
        return json_cell(value.tolist())
    if isinstance(value, set | frozenset):
        return [json_cell(v) for v in sorted(value, key=str)]
    return str(value)


def dumps(value: Any, **kwargs) -> str:
    """`json.dumps` with `json_default` for whatever a column may hold."""
    return json.dumps(value, default=json_default, **kwargs)


def json_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Any table's rows as JSON objects (column -> value), whatever the column types."""
    return [{str(k): json_cell(v) for k, v in row.items()} for row in frame.to_dict("records")]


def parse_time(value: str | None, now: datetime, what: str) -> datetime | None:
    """RFC 3339 (naive means UTC), or a duration (`2h`, `30m`, `7d`) meaning that long before `now`."""
    if value is None:
        return None
    try:
        return now - parse_duration(value)
    except ValueError:
        pass
    try:
        ts = pd.Timestamp(value)
    except ValueError:
        raise ValueError(f"{what}: not a time or a duration: {value!r} (e.g. 2026-11-02T12:00:00Z or 6h)") from None
    return (ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")).to_pydatetime()


def time_range(since: str | None, until: str | None, now: datetime | None = None,
               default: timedelta | None = None) -> tuple[datetime | None, datetime | None]:
    """[since, until) from the command line; with `default`, a missing since is until - default and a
    missing until is now."""
    now = now or datetime.now(UTC)
    start, end = parse_time(since, now, "--since"), parse_time(until, now, "--until")
    if default is not None:
        end = end or now
        start = start or end - default
    if start is not None and end is not None and start >= end:
        raise ValueError(f"--since {start.isoformat()} is not before --until {end.isoformat()}")
    return start, end


def parse_labels(values: list[str] | None) -> dict[str, str]:
    """`--label stage=batch_wait --label quantile=p99` -> {"stage": "batch_wait", "quantile": "p99"}."""
    out = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--label: use key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def split_list(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def cell(value: Any, whole: bool = False, cut: bool = True) -> str:
    """A value as a table cell: integers with thousands separators, floats to 4 significant digits (with
    separators past 1,000, never in e-notation there), times as UTC, labels as k=v. `whole`: an id, shown
    as written and never cut. `cut`: text past MAX_CELL characters ends in an ellipsis."""
    if isinstance(value, pd.Timestamp | datetime) and not pd.isna(value):
        ts = pd.Timestamp(value).tz_convert("UTC")
        return f"{ts:%Y-%m-%d %H:%M}" if ts.second == 0 and ts.microsecond == 0 else f"{ts:%Y-%m-%d %H:%M:%S.%f}"[:-3]
    value = jsonable(value)
    if value is None:
        return "-"
    if whole:  # an id read back as a float beside missing ones (1.0) is still the id 1
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, dict):
        text = ", ".join(f"{k}={v}" for k, v in sorted(value.items()))  # a space: wraps between labels
    elif isinstance(value, list):
        text = json.dumps(value, separators=(",", ":"), default=str)
    else:
        text = str(value)
    return text if len(text) <= MAX_CELL or not cut else text[: MAX_CELL - 1] + "…"


# Columns whose cells are copied into other commands: shown whole on one line, never folded.
WHOLE = ("id", "fingerprint", "model_version", "check", "status", "verdict", "kind", "reason", "field", "source",
         "metric", "window")
MIN_WIDTH = 8  # a folded column keeps at least this many characters a line (or its header's)
MAX_WORD = 24  # ... and its longest word up to this many, so it folds between words (labels: k=v each)


def whole(name: str) -> bool:
    """An id, a name or a time: a cell a person copies, kept on one line."""
    return name in WHOLE or name.endswith(("_id", "_at", "_start", "_end", "_version")) or name in ("now", "first",
                                                                                                   "last", "since")


def table(frame: pd.DataFrame, title: str | None = None, columns: list[str] | None = None,
          width: int | None = None, every: str = "--format csv", keep: tuple[str, ...] = ()) -> Table:
    """`frame` as a rich table of `columns` (default: all). Ids, names and times are never wrapped nor cut,
    numbers never wrapped, other text folds; of a command's own pick of `columns`, those empty in every row
    are left out (the columns of a user's own SQL are all kept). Narrower than the table needs (`width`
    characters), the last columns are left out (columns come most telling first) and the caption names
    them and the option (`every`) that prints every column: what is shown is never cut. Text longer than
    MAX_CELL ends in an ellipsis, except in the columns to `keep` whole (it folds)."""
    names = [c for c in (columns or list(frame.columns)) if c in frame.columns]
    if columns is not None:
        # A column with no value in any row only takes width from the ones that say something.
        names = [c for c in names if not frame[c].map(lambda v: not isinstance(v, dict | list | tuple)
                                                      and bool(pd.isna(v))).all()]
    kinds = {}
    for name in names:
        numeric = pd.api.types.is_numeric_dtype(frame[name]) and not pd.api.types.is_bool_dtype(frame[name])
        when = pd.api.types.is_datetime64_any_dtype(frame[name])  # a time, whatever its column is called
        kinds[name] = "whole" if whole(str(name)) or when else "number" if numeric else "text"
    cells = {name: [cell(v, kinds[name] == "whole", name not in keep) for v in frame[name]] for name in names}
    natural = {name: max(len(str(name)), *map(len, cells[name] or [""])) for name in names}  # on one line
    least = {name: min(natural[name], MAX_WORD, max([MIN_WIDTH, *(len(w) for c in cells[name] for w in c.split())]))
             for name in names if kinds[name] == "text"}

    def needs(shown: list[str]) -> int:  # the narrowest the table can be: borders, padding, columns
        return 1 + sum(3 + (least[n] if kinds[n] == "text" else natural[n]) for n in shown)

    shown, left_out = list(names), []
    while width is not None and needs(shown) > width and len(shown) > 1:
        left_out.insert(0, shown.pop())  # columns come most telling first
    folded = _text_widths(shown, kinds, natural, least, width)
    # Plain text: a title names what the user named (a service, a --group-by), never markup.
    out = Table(title=Text(title, style="table.title") if title else None, show_lines=False)
    for name in shown:
        justify = "right" if kinds[name] == "number" else "left"
        if kinds[name] == "text":
            out.add_column(str(name), justify=justify, overflow="fold", min_width=least[name],
                           width=folded.get(name))
        else:
            out.add_column(str(name), justify=justify, no_wrap=True)
    for i in range(len(frame)):
        # Plain text: a value from the logs ("[bold]...") is shown as written, never read as markup.
        out.add_row(*(Text(cells[name][i]) for name in shown))
    if left_out:
        out.caption = f"left out at this width: {', '.join(map(str, left_out))} ({every} has every column)"
    return out


def _text_widths(shown: list[str], kinds: dict[str, str], natural: dict[str, int], least: dict[str, int],
                 width: int | None) -> dict[str, int]:
    """Widths of the text columns when the table is wider than `width` on one line: the widest are narrowed
    first, to a common cap, none below its `least`. Set here, not left to rich, whose narrowing can take a
    column below its minimum and then overflow the terminal restoring it."""
    text = [n for n in shown if kinds[n] == "text"]
    room = (width or 0) - 1 - 3 * len(shown) - sum(natural[n] for n in shown if kinds[n] != "text")
    if width is None or not text or sum(natural[n] for n in text) <= room:
        return {}

    def capped(cap: int) -> dict[str, int]:
        return {n: max(least[n], min(natural[n], cap)) for n in text}

    low, high = 0, max(natural[n] for n in text)
    while low < high:  # the widest cap that fits
        mid = (low + high + 1) // 2
        low, high = (mid, high) if sum(capped(mid).values()) <= room else (low, mid - 1)
    widths = capped(low)
    for n in text:  # what the cap leaves, a character each to the columns it narrowed
        if sum(widths.values()) < room and widths[n] < natural[n]:
            widths[n] += 1
    return widths


def by_severity(frame: pd.DataFrame, column: str, rank: dict[str, int]) -> pd.DataFrame:
    """`frame` with its most severe rows (lowest `rank` of `column`) first, in their order (time) within a rank."""
    if frame.empty or column not in frame.columns:
        return frame
    order = frame[column].map(lambda v: rank.get(v, len(rank)))
    return frame.iloc[order.argsort(kind="stable")].reset_index(drop=True)


def emit(frame: pd.DataFrame, fmt: str, console: Console, *, title: str | None = None,
         json_records: Callable[[pd.DataFrame], list[dict]] = json_records, columns: list[str] | None = None,
         empty: str = "nothing matched", severity: tuple[str, dict[str, int]] | None = None,
         after: str | None = None) -> None:
    """Print `frame` as a table of `columns` (sorted by `severity` (column, rank) first, then as given:
    time), CSV (every column) or JSON (`json_records`). `after`: a long column printed below the table,
    one unwrapped line per row led by its id, so it copies as written."""
    if fmt == "json":
        sys.stdout.write(dumps(json_records(frame), indent=2, ensure_ascii=False) + "\n")
    elif fmt == "csv":
        flat = frame.copy()
        for name in flat.columns:
            if flat[name].dtype == object:
                flat[name] = [dumps(json_cell(v), sort_keys=True) if isinstance(v, dict | list) else v
                              for v in flat[name]]
        sys.stdout.write(flat.to_csv(index=False))
    elif frame.empty:
        console.print(f"[dim]{empty}[/]")
    else:
        shown = by_severity(frame, *severity) if severity else frame
        console.print(table(shown, title, columns, width=console.width))
        lines = [(key, text) for key, text in zip(shown.get("id", shown.index), shown[after] if after else [],
                                                  strict=False) if isinstance(text, str)]
        if lines:
            console.print(Text(f"{after}, by id:", style="dim"))
        for key, text in lines:
            console.print(Text(f"{key}: ", style="dim") + Text(text), soft_wrap=True)
