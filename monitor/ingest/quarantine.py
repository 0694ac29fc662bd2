"""Quarantine records as a person reads them: the excerpt of a rejected row, its line as written (bytes,
bounded), the same bytes made safe for a terminal, and the warning of a tick that rejected most rows."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

import pandas as pd
import pyarrow as pa

from monitor.contract import Reject, excerpt
from monitor.ingest.sources.batch import LINE, OVERSIZE, RawLines


def quote(rejects: list[Reject], lines: RawLines | None) -> list[Reject]:
    """`rejects` with the bytes of their lines (when `lines` holds them) as `raw`, and their excerpts cut
    from those bytes rather than from the parsed values."""
    return rejects if lines is None else [quoted(r, lines) for r in rejects]


def quoted(reject: Reject, lines: RawLines | None, parsed: Callable[[], str] | None = None) -> Reject:
    """`reject` quoting its line from `lines` (`raw`, and the excerpt cut from it); else, when it has no
    excerpt yet, with `parsed()` (the parsed row) as its excerpt."""
    file, _, number = reject.position.rpartition(":")
    raw = lines.line(file, int(number)) if lines is not None and reject.raw is None and number.isdigit() else None
    if raw is not None:
        return replace(reject, raw=raw, excerpt=excerpt(raw))
    return replace(reject, excerpt=parsed()) if parsed is not None and not reject.excerpt else reject


def printable(raw: bytes | str) -> str:
    """A line as written, safe for a terminal or a table: text as is, bytes that are not UTF-8 and control
    characters as backslash escapes (so a log line cannot move the cursor or colour the screen)."""
    text = raw.decode("utf-8", errors="backslashreplace") if isinstance(raw, bytes | bytearray) else raw
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)


QUARANTINED = "quarantined"  # the first word of a tick's quarantine warning


def warning(read: int, by_reason: Counter, by_field: Counter, max_share: float) -> str | None:
    """The warning of a tick that quarantined more than `max_share` of the `read` rows, naming its top
    reasons and the fields they name per record kind (`by_field` counts rows by "reason:kind:field").
    None at or below the share."""
    total = sum(by_reason.values())
    if not read or total <= max_share * read:
        return None
    top = []
    for reason, n in by_reason.most_common(3):
        kinds: dict[str, Counter] = {}
        for key, m in by_field.items():
            why, kind, name = key.split(":", 2)
            if why == reason:
                kinds.setdefault(kind, Counter())[name] += m
        named = "; ".join(f"{kind}: " + ", ".join(f for f, _ in fields.most_common(4)) for kind, fields in kinds.items())
        top.append(f"{reason} {n:,}" + (f" ({named})" if named else ""))
    return (f"{QUARANTINED} {total:,} of {read:,} rows ({total / read:.0%}, above limits.max_quarantine_share "
            f"{max_share:.0%}): " + ", ".join(top) + "; `tailwatch check-logs` shows what each field is read from")


def row_excerpt(frame: pd.DataFrame, i: int) -> str:
    """Row `i` of parsed rows as JSON (when no line of it is held)."""
    row = {k: v for k, v in frame.iloc[i].items() if k not in (LINE, OVERSIZE) and not _isna(v)}
    return _as_json(row)


def table_excerpt(table: pa.Table, i: int) -> str:
    row = {k: v for k, v in table.slice(i, 1).to_pylist()[0].items()
           if k not in (LINE, OVERSIZE) and v is not None and not (isinstance(v, float) and v != v)}
    return _as_json(row)


def _as_json(row: dict) -> str:
    try:
        return excerpt(json.dumps(row, default=as_written, ensure_ascii=False))
    except (TypeError, ValueError):
        return excerpt(repr(row))


def as_written(value) -> str:
    """A parsed value in JSON as close to its text as it can be: instants in RFC 3339."""
    if isinstance(value, datetime):
        text = value.isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    return str(value)


def _isna(value) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False
