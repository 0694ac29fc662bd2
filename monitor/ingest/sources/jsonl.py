"""JSON Lines parsed with pyarrow, block by block on a thread pool; a bad line is isolated by the row
pyarrow names, and lines nested too deep never reach it."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pajson

from monitor.config import Limits
from monitor.contract import RAW_BYTES, Reason, Reject, excerpt
from monitor.ingest.sources.batch import LINE
from monitor.ingest.sources.chunks import bad_utf8_lines, is_utf8, line_bounds, oversize_line, scan
from monitor.ingest.sources.tables import combine

_JSON_BLOCK_LINES = 4096  # lines per parse call; a bad line costs a re-parse of at most this many lines
_ERROR_ROW = re.compile(r"in row (\d+)$")
WORKERS = max(1, min(4, os.cpu_count() or 1))  # pyarrow releases the GIL while parsing a block
# Deeper JSON is quarantined as oversize_field (see _parse_json_lines); real records nest 2-3 levels.
MAX_JSON_DEPTH = 64
# pyarrow parsed 4,000 levels and crashed the process at 10,000 (on a thread, pyarrow 26): a line shorter
# than this, which cannot open more levels than it has bytes, is safe to hand to it before its depth is known.
_SAFE_LINE_BYTES = 1024


# Waits for a JSON Lines chunk's blocks: (rows in one Arrow table, the few rows of other types, rejects).
Parsed = Callable[[], tuple[pa.Table | None, pd.DataFrame, list[Reject]]]


def parse_jsonl(buf: bytes, first_line: int, file: str, limits: Limits) -> tuple[pd.DataFrame, list[Reject], int]:
    """Parse whole JSON Lines with pyarrow; a bad line is isolated by the row pyarrow names, not by a slow path.

    Returns the rows (with LINE), the rejected lines, and the number of lines consumed.
    """
    with ThreadPoolExecutor(WORKERS) as pool:
        parsed, n = start_jsonl(buf, first_line, file, limits, pool)
        table, odd, rejects = parsed()
    if table is None:
        return odd, rejects, n
    frame = table.to_pandas()
    if len(odd):
        frame = pd.concat([frame, odd], ignore_index=True).sort_values(LINE, kind="stable", ignore_index=True)
    return frame, rejects, n


def start_jsonl(buf: bytes, first_line: int, file: str, limits: Limits, pool: ThreadPoolExecutor,
                 newlines: np.ndarray | None = None) -> tuple[Parsed, int]:
    """Queue the blocks of whole JSON Lines on `pool`; returns a function that waits for the blocks and gives
    (rows in one Arrow table, the few rows whose field types differ from it, rejects), and the number of lines.

    Rows and rejects keep the order of their lines. `newlines`: the position of every newline in `buf`, when
    the caller has it already. Everything that scans a block's bytes runs with its block, on `pool`.
    """
    starts, ends = line_bounds(buf, newlines)
    n = len(ends)
    lengths = ends - starts
    rejects: list[Reject] = []
    skip = np.zeros(n, dtype=bool)
    # Blank lines hold no row; pyarrow drops them, so they are dropped here too to keep line numbers right.
    short = np.flatnonzero(lengths <= 2)
    for i in short:
        if not buf[starts[i]:ends[i]].strip():
            skip[i] = True
    for i in np.flatnonzero(lengths > limits.max_line_bytes):
        skip[i] = True
        rejects.append(oversize_line(f"{file}:{first_line + i + 1}", int(lengths[i]), buf[starts[i]:starts[i] + RAW_BYTES],
                                     limits.max_line_bytes))
    line_cap = limits.max_field_chars * 4 + 1024
    for i in np.flatnonzero((lengths > line_cap) & ~skip):
        skip[i] = True
        rejects.append(Reject(f"{file}:{first_line + i + 1}", Reason.oversize_field, excerpt(buf[starts[i]:starts[i] + 400])))

    blocks = [idx[~skip[idx]] for idx in
              (np.arange(b, min(n, b + _JSON_BLOCK_LINES)) for b in range(0, n, _JSON_BLOCK_LINES))]
    view = memoryview(buf)
    futures = [pool.submit(_parse_json_lines, buf, view, starts, ends, idx, first_line, file)
               for idx in blocks if len(idx)]

    def parsed() -> tuple[pa.Table | None, pd.DataFrame, list[Reject]]:  # on the reading thread, in order
        tables: list[pa.Table] = []
        for future in futures:
            block_tables, bad = future.result()
            tables += block_tables
            rejects.extend(bad)
        return *combine(tables, limits.max_field_chars), rejects

    return parsed, n


def _parse_json_lines(buf: bytes, view: memoryview, starts: np.ndarray, ends: np.ndarray, idx: np.ndarray,
                      first_line: int, file: str) -> tuple[list[pa.Table], list[Reject]]:
    """One block of lines `idx` (increasing): lines of invalid UTF-8 or nested too deep are rejected, the rest
    parsed into tables (with LINE). Returns the tables and the rejects, in line order within each kind."""
    rejects: list[Reject] = []
    lo, hi = int(starts[idx[0]]), int(ends[idx[-1]])
    if not is_utf8(view[lo:hi]):
        first = int(idx[0])
        bad = np.isin(idx, [first + i for i in bad_utf8_lines(buf[lo:hi], starts[first:idx[-1] + 1] - lo)])
        rejects += [Reject(f"{file}:{first_line + i + 1}", Reason.invalid_encoding, excerpt(buf[starts[i]:ends[i]]))
                    for i in idx[bad]]
        idx = idx[~bad]
    # Only lines long enough to crash pyarrow are scanned for their depth first. A shorter line nesting
    # deeper than MAX_JSON_DEPTH shows in the parsed types (or among the lines pyarrow refuses): only then
    # is every line of the block scanned, and the block parsed again without the deep ones.
    deep = _too_deep(buf, starts, ends, idx[ends[idx] - starts[idx] >= _SAFE_LINE_BYTES])
    dropped: list[int] = []
    for exact in (False, True):
        if deep:
            dropped += deep
            idx = idx[~np.isin(idx, deep)]
        tables: list[pa.Table] = []
        refused: list[Reject] = []
        _parse_json_block(buf, view, starts, ends, idx, first_line, file, tables, refused)
        if exact or not refused and all(_nesting(t.schema) <= MAX_JSON_DEPTH for t in tables):
            break
        deep = _too_deep(buf, starts, ends, idx)
        if not deep:  # refused for another reason: what was parsed stands
            break
    rejects += [Reject(f"{file}:{first_line + i + 1}", Reason.oversize_field, excerpt(buf[starts[i]:ends[i]]))
                for i in sorted(dropped)]
    return tables, rejects + refused


def _nesting(schema: pa.Schema) -> int:
    """How deep the JSON objects read as `schema` nest: 1 for the object, one more per struct or list level."""
    deepest = 1
    todo = [(f.type, 2) for f in schema]
    while todo:
        typ, level = todo.pop()
        if pa.types.is_struct(typ):
            deepest = max(deepest, level)
            todo += [(typ.field(i).type, level + 1) for i in range(typ.num_fields)]
        elif pa.types.is_list(typ) or pa.types.is_large_list(typ):
            deepest = max(deepest, level)
            todo.append((typ.value_type, level + 1))
    return deepest


def _too_deep(buf: bytes, starts: np.ndarray, ends: np.ndarray, idx: np.ndarray) -> list[int]:
    """Lines of `idx` (increasing) whose JSON nests deeper than MAX_JSON_DEPTH.

    pyarrow's reader and its conversion to pandas recurse per level and crash the process (a segfault, not
    an exception) somewhere past a few thousand levels, so such lines never reach them.
    """
    if not len(idx):
        return []
    lo, hi = int(starts[idx[0]]), int(ends[idx[-1]])
    if hi - lo <= MAX_JSON_DEPTH:  # each level takes a byte
        return []
    arr = np.frombuffer(buf, dtype=np.uint8, count=hi - lo, offset=lo)
    # '[' (0x5B) and '{' (0x7B) are the only bytes that OR 0x20 makes 0x7B: one comparison instead of two.
    opens = scan(arr, lambda piece: (piece | 0x20) == 0x7B)
    if len(opens) <= MAX_JSON_DEPTH:
        return []
    # Cheap bound first: a line with few brackets cannot nest deep; only the rest is scanned exactly. (The
    # brackets of a line left out of `idx` count towards the next line of `idx`: that only costs a scan.)
    per_line = np.bincount(np.searchsorted(ends[idx] - lo, opens, side="right"), minlength=len(idx) + 1)
    return [int(i) for i in idx[per_line[:len(idx)] > MAX_JSON_DEPTH]
            if _depth(buf[starts[i]:ends[i]]) > MAX_JSON_DEPTH]


def _depth(line: bytes) -> int:
    """The deepest nesting of arrays and objects in one JSON text (brackets inside strings ignored)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in line:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _read_block(data) -> pa.Table:
    # One block per call, read on this thread: pyarrow's "in row N" then counts from the first line given.
    return pajson.read_json(pa.BufferReader(data), read_options=pajson.ReadOptions(
        use_threads=False, block_size=max(len(data) + 1, 1 << 16)))


def _parse_json_block(buf, view, starts, ends, idx, first_line, file, tables, rejects) -> None:
    """Parse lines `idx`; a line pyarrow refuses is set aside (parsed alone or rejected) and the rest go on."""
    while len(idx):
        contiguous = idx[-1] - idx[0] + 1 == len(idx)
        data = (view[starts[idx[0]]:ends[idx[-1]] + 1] if contiguous
                else b"\n".join(buf[starts[i]:ends[i]] for i in idx) + b"\n")
        try:
            table = _read_block(data)
        except pa.ArrowInvalid as exc:
            if len(idx) == 1:
                i = int(idx[0])
                rejects.append(_reject_line(buf[starts[i]:ends[i]], first_line + i + 1, file, exc))
                return
            found = _ERROR_ROW.search(str(exc))
            row = int(found.group(1)) if found else -1
            if not 0 <= row < len(idx):
                _bisect_json_block(buf, view, starts, ends, idx, first_line, file, tables, rejects)
                return
            # The rows before it parsed; the named row alone either parses (its field types differ from
            # its neighbours': validation decides) or is rejected; parsing resumes after it.
            if row:
                _parse_json_block(buf, view, starts, ends, idx[:row], first_line, file, tables, rejects)
            _parse_json_block(buf, view, starts, ends, idx[row:row + 1], first_line, file, tables, rejects)
            idx = idx[row + 1:]
            continue
        if table.num_rows != len(idx):
            _bisect_json_block(buf, view, starts, ends, idx, first_line, file, tables, rejects)
            return
        tables.append(table.append_column(LINE, pa.array(idx + first_line + 1, type=pa.int64())))
        return


def _bisect_json_block(buf, view, starts, ends, idx, first_line, file, tables, rejects) -> None:
    """Halves until each half parses with one row per line (pyarrow named no row, or rows went missing)."""
    if len(idx) == 1:
        i = int(idx[0])
        rejects.append(_reject_line(buf[starts[i]:ends[i]], first_line + i + 1, file, None))
        return
    half = len(idx) // 2
    _parse_json_block(buf, view, starts, ends, idx[:half], first_line, file, tables, rejects)
    _parse_json_block(buf, view, starts, ends, idx[half:], first_line, file, tables, rejects)


def _reject_line(line: bytes, number: int, file: str, exc: Exception | None) -> Reject:
    """The Reject for one line pyarrow refused (or read as no row)."""
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return Reject(f"{file}:{number}", Reason.invalid_encoding, excerpt(line))
    reason = Reason.unparseable if exc is None else _classify_json(line, exc)
    return Reject(f"{file}:{number}", reason, excerpt(line))


def _classify_json(line: bytes, exc: Exception) -> Reason:
    try:
        value = json.loads(line)
    except ValueError:
        return Reason.unparseable
    if not isinstance(value, dict):
        return Reason.unparseable
    # A JSON object pyarrow refuses alone: a repeated key or a number beyond float range.
    return Reason.wrong_type if "too big" in str(exc) else Reason.unparseable
