"""Sources: read new rows incrementally from a growing directory of files or from a SQL table.

Each read yields `Batch`es of at most `limits.chunk_rows` rows (memory stays bounded whatever the
backlog) together with the offset state that marks them consumed. The caller commits a batch's results
and its offsets in one transaction, so a restart reads every row exactly once.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from monitor.config import FileSource, Limits, SqlSource
from monitor.contract import Reason, Reject, excerpt
from monitor.frame import is_text
from storage.store import OffsetState

LINE = "_line"  # column carrying each row's 1-based line (or row) number within its file
OVERSIZE = "_oversize"  # present, and true on a row, when one of its text fields passes limits.max_field_chars
FINGERPRINT_BYTES = 256
_JSON_BLOCK_LINES = 4096  # lines per parse call; a bad line costs a re-parse of at most this many lines
_ERROR_ROW = re.compile(r"in row (\d+)$")
_WORKERS = max(1, min(4, os.cpu_count() or 1))  # pyarrow releases the GIL while parsing a block
# JSON Lines chunks a read holds at once: the next batch's, and the one read and queued while it parses.
_CHUNKS_AHEAD = 2
_SCAN_BYTES = 64 << 10  # bytes per numpy call when scanning a buffer (see _scan)
_BOM = b"\xef\xbb\xbf"
# Deeper JSON is quarantined as oversize_field (see _parse_json_lines); real records nest 2-3 levels.
MAX_JSON_DEPTH = 64
# pyarrow parsed 4,000 levels and crashed the process at 10,000 (on a thread, pyarrow 26): a line shorter
# than this, which cannot open more levels than it has bytes, is safe to hand to it before its depth is known.
_SAFE_LINE_BYTES = 1024


# Waits for a JSON Lines chunk's blocks: (rows in one Arrow table, the few rows of other types, rejects).
_Parsed = Callable[[], tuple[pa.Table | None, pd.DataFrame, list[Reject]]]


@dataclass
class Batch:
    """Rows parsed from one stretch of one file (or one query), not yet validated against the contract."""

    source: str
    file: str  # file name (or table name) used in quarantine positions
    frame: pd.DataFrame  # raw parsed rows, with LINE (with `table`: the few rows whose types differ from it)
    rejects: list[Reject]
    offset: OffsetState  # the state to commit once this batch's results are stored
    events: list[str] = field(default_factory=list)  # e.g. "truncated", "replaced"
    table: pa.Table | None = None  # raw parsed rows kept in Arrow (JSONL, Parquet), with LINE

    @property
    def rows_read(self) -> int:
        return len(self.frame) + len(self.rejects) + (self.table.num_rows if self.table is not None else 0)


def file_format(path: Path, declared: str) -> str:
    """jsonl / csv / parquet / otlp for a file, from the config or from its name."""
    if declared != "auto":
        return declared
    # Rotated copies keep their type: app.jsonl.1, app.jsonl.2.gz.
    name = re.sub(r"(\.\d+)?(\.gz)?$", "", path.name.lower())
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if name.endswith((".csv", ".tsv")):
        return "csv"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    return "unknown"


class DirectorySource:
    """A directory of growing files, tracked by inode so rotation (rename) does not re-read a file."""

    def __init__(self, name: str, config: FileSource, limits: Limits):
        self.name, self.config, self.limits = name, config, limits

    def files(self) -> list[Path]:
        """Matching files, oldest first (mtime, then name)."""
        paths = [p for p in self.config.path.glob(self.config.pattern) if p.is_file()]
        return sorted(paths, key=lambda p: (p.stat().st_mtime_ns, p.name))

    def read(self, offsets: dict[str, OffsetState]) -> Iterator[Batch]:
        """New rows of every file since `offsets`, chunk by chunk."""
        own: set[int] = set()  # the pool's threads
        pool = ThreadPoolExecutor(_WORKERS, thread_name_prefix="tailwatch-parse",
                                  initializer=lambda: own.add(threading.get_ident()))
        try:
            for path in self.files():
                try:
                    st = path.stat()
                except FileNotFoundError:  # deleted between listing and reading
                    continue
                key = f"{st.st_dev}:{st.st_ino}"
                state, events = self._resume(path, key, st.st_size, offsets.get(key))
                fmt = file_format(path, self.config.format)
                if fmt == "parquet":
                    yield from self._read_parquet(path, state, events, seen=key in offsets)
                elif fmt in ("jsonl", "csv", "otlp"):
                    yield from self._read_lines(path, state, events, fmt, pool)
                # Files of an unknown type are skipped: the pattern chose them, so say so once per read.
                elif state.offset == 0 and state.line == 0:
                    yield Batch(self.name, path.name, pd.DataFrame({LINE: []}),
                                [Reject(path.name, Reason.unparseable, f"unknown file type: {path.name}")],
                                replace(state, offset=st.st_size, line=1, size=st.st_size), events)
        finally:
            # The caller stopped early or a parse failed: blocks still queued are dropped, running ones
            # (a block each) are waited for, so no thread outlives the read. Closed on one of its own
            # threads (the garbage collector runs wherever it is triggered), the read cannot wait for that
            # thread: the others end after their block.
            pool.shutdown(wait=threading.get_ident() not in own, cancel_futures=True)

    def _resume(self, path: Path, key: str, size: int, state: OffsetState | None) -> tuple[OffsetState, list[str]]:
        fresh = OffsetState(file_key=key, path=str(path), offset=0, line=0, cursor=None,
                            fingerprint=_fingerprint(path), size=size)
        if state is None:
            return fresh, []
        if path.suffix == ".gz":
            # Compressed bytes are not comparable with decompressed offsets; the fingerprint guards replacement.
            same = state.fingerprint is None or _fingerprint(path) == state.fingerprint
            return (replace(state, path=str(path)), []) if same else (fresh, ["replaced"])
        if size < state.offset:
            return fresh, ["truncated"]
        if state.fingerprint and _fingerprint(path, _fp_len(state.fingerprint)) != state.fingerprint:
            return fresh, ["replaced"]
        # A file that was shorter than FINGERPRINT_BYTES when first seen gets a longer fingerprint now.
        return replace(state, path=str(path), fingerprint=_fingerprint(path)), []

    def _read_parquet(self, path: Path, state: OffsetState, events: list[str], seen: bool) -> Iterator[Batch]:
        try:
            pf = _open_parquet(path)
        except (pa.ArrowInvalid, OSError) as exc:
            # No footer yet: a Parquet file still being written is read once it is complete. One that stays
            # unreadable at the same size from one tick to the next is broken: quarantined once, as a file.
            size = path.stat().st_size
            if not seen:
                yield Batch(self.name, path.name, pd.DataFrame({LINE: []}), [], replace(state, size=size), events)
            elif state.size == size and state.offset < size:
                reject = Reject(path.name, Reason.unparseable, excerpt(f"not a readable Parquet file: {exc}"))
                yield Batch(self.name, path.name, pd.DataFrame({LINE: []}), [reject],
                            replace(state, offset=size, size=size), events)
            elif state.size != size:
                yield Batch(self.name, path.name, pd.DataFrame({LINE: []}), [], replace(state, size=size), events)
            return
        if state.line >= pf.metadata.num_rows:
            return
        row = 0
        for rb in pf.iter_batches(batch_size=self.limits.chunk_rows):
            start, row = row, row + rb.num_rows
            if row <= state.line:
                continue
            table = pa.Table.from_batches([rb]).slice(max(0, state.line - start))
            first = max(start, state.line)
            table = _flag_oversize(table, self.limits.max_field_chars)
            table = table.append_column(LINE, pa.array(np.arange(first + 1, row + 1, dtype=np.int64)))
            size = path.stat().st_size
            yield Batch(self.name, path.name, _empty_frame(), [],
                        replace(state, line=row, offset=size, size=size), events, table)
            events = []

    def _read_lines(self, path: Path, state: OffsetState, events: list[str], fmt: str,
                    pool: ThreadPoolExecutor) -> Iterator[Batch]:
        header = None
        if fmt == "csv":
            header = _first_line(path)
            if header is None:
                return  # header not complete yet
        # JSON Lines: a chunk's blocks are queued on `pool` and the next chunk is read and queued while they
        # parse, so reading, pre-checks and parsing overlap; batches still come out in order, each with the
        # offsets of its own chunk, and at most _CHUNKS_AHEAD chunks are held at once.
        ahead: deque[tuple[OffsetState, _Parsed]] = deque()
        for buf, offset, newlines in _line_chunks(path, state.offset, self.limits.chunk_bytes,
                                                  self.limits.chunk_rows):
            if state.offset == 0 and buf.startswith(_BOM):
                buf, newlines = buf[len(_BOM):], None
            first_line = state.line
            skip_header = fmt == "csv" and state.offset == 0
            if fmt == "jsonl":
                parsed, lines = _start_jsonl(buf, first_line, path.name, self.limits, pool, newlines)
                state = replace(state, offset=offset, line=first_line + lines, size=offset)
                ahead.append((state, parsed))
                if len(ahead) < _CHUNKS_AHEAD:
                    continue
                yield self._parsed_batch(path, *ahead.popleft(), events)
            else:
                if fmt == "otlp":
                    frame, rejects, lines = parse_otlp_lines(buf, first_line, path.name)
                else:
                    frame, rejects, lines = parse_csv(buf, header, skip_header, first_line, path.name, self.limits)
                state = replace(state, offset=offset, line=first_line + lines, size=offset)
                yield Batch(self.name, path.name, frame, rejects, state, events)
            events = []
        while ahead:
            yield self._parsed_batch(path, *ahead.popleft(), events)
            events = []

    def _parsed_batch(self, path: Path, state: OffsetState, parsed: _Parsed, events: list[str]) -> Batch:
        table, frame, rejects = parsed()
        return Batch(self.name, path.name, frame, rejects, state, events, table)


def _fp_len(fingerprint: str) -> int:
    return int(fingerprint.split(":", 1)[0])


def _fingerprint(path: Path, length: int = FINGERPRINT_BYTES) -> str:
    """`<n>:<sha1 of the first n bytes>`: tells a replaced file from a grown one at the same inode."""
    with open(path, "rb") as fh:
        head = fh.read(length)
    return f"{len(head)}:{hashlib.sha1(head).hexdigest()}"


def _first_line(path: Path) -> bytes | None:
    with _open(path) as fh:
        line = fh.readline(1 << 20)
    return line if line.endswith(b"\n") else None


def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _complete_chunks(path: Path, offset: int, chunk_bytes: int,
                     chunk_rows: int | None = None) -> Iterator[tuple[bytes, int]]:
    """Stretches of whole lines after byte `offset` (decompressed offset for .gz), with the end offset.

    A stretch holds at most `chunk_bytes` bytes (unless one line is longer) and `chunk_rows` lines.
    A last line without its newline is left for a later read: it may still be being written.
    """
    for buf, end, _ in _line_chunks(path, offset, chunk_bytes, chunk_rows):
        yield buf, end


def _line_chunks(path: Path, offset: int, chunk_bytes: int,
                 chunk_rows: int | None = None) -> Iterator[tuple[bytes, int, np.ndarray | None]]:
    """`_complete_chunks`, with the position of each newline in the stretch when it was found (else None)."""
    for buf, end in _byte_chunks(path, offset, chunk_bytes):
        if chunk_rows is None or len(buf) <= chunk_rows:  # each line holds a newline: no more lines than bytes
            yield buf, end, None
            continue
        newlines = _newlines(buf)
        if len(newlines) <= chunk_rows:
            yield buf, end, newlines
            continue
        # Narrow lines: cut after every chunk_rows-th newline.
        ends = newlines[chunk_rows - 1::chunk_rows] + 1
        start = end - len(buf)
        prev = 0
        for cut in ends.tolist():
            yield buf[prev:cut], start + cut, None
            prev = cut
        if prev < len(buf):
            yield buf[prev:], end, None


def _newlines(buf: bytes) -> np.ndarray:
    return _scan(np.frombuffer(buf, dtype=np.uint8), lambda piece: piece == 10)


def _scan(arr: np.ndarray, hit: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Positions in `arr` (bytes) where `hit` is true.

    Scanned in pieces of _SCAN_BYTES: temporaries this small are reused from the heap and stay in cache,
    while buffer-sized ones get pages of their own every time, which cost as much to fault in as the scan.
    """
    if not len(arr):
        return np.empty(0, dtype=np.intp)
    return np.concatenate([np.flatnonzero(hit(arr[p:p + _SCAN_BYTES])) + p for p in range(0, len(arr), _SCAN_BYTES)])


def _byte_chunks(path: Path, offset: int, chunk_bytes: int) -> Iterator[tuple[bytes, int]]:
    """`_complete_chunks` by bytes only."""
    if path.suffix != ".gz":
        yield from _plain_chunks(path, offset, chunk_bytes)
        return
    pieces = _gzip_pieces(path, offset)
    # Pieces are gathered in a list and joined once per chunk: `carry += piece` would copy the growing
    # chunk again for every piece.
    parts: list[bytes] = []
    size = 0
    for piece in pieces:
        parts.append(piece)
        size += len(piece)
        if size < chunk_bytes:
            continue
        carry = b"".join(parts)
        while len(carry) >= chunk_bytes:
            cut = carry.rfind(b"\n", 0, chunk_bytes) + 1
            if cut == 0:  # one line longer than a chunk: hand it over whole, the parser quarantines it
                cut = carry.find(b"\n") + 1
                if cut == 0:
                    break
            offset += cut
            yield carry[:cut], offset
            carry = carry[cut:]
        parts, size = [carry], len(carry)
    carry = b"".join(parts)
    cut = carry.rfind(b"\n") + 1
    if cut:
        yield carry if cut == len(carry) else carry[:cut], offset + cut


def _plain_chunks(path: Path, offset: int, chunk_bytes: int) -> Iterator[tuple[bytes, int]]:
    """`_byte_chunks` of an uncompressed file: each chunk read once, at its size, where it starts.

    The end of a chunk (its last newline within `chunk_bytes`) is found in a short read of its tail first,
    so the chunk is read straight into its own buffer: no joining of pieces, no copy of a carried-over rest.
    """
    probe = min(chunk_bytes, 1 << 16)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        while offset < size:
            span = min(chunk_bytes, size - offset)
            fh.seek(offset + span - probe if span > probe else offset)
            tail = fh.read(min(probe, span))
            if len(tail) < min(probe, span):  # the file shrank meanwhile: the next read sees it
                return
            k = tail.rfind(b"\n")
            if k >= 0:
                cut = span - len(tail) + k + 1
                fh.seek(offset)
                buf = fh.read(cut)
                if len(buf) < cut:  # the file shrank meanwhile: the next read sees it
                    return
            else:
                fh.seek(offset)
                buf = fh.read(span)
                cut = buf.rfind(b"\n") + 1
                if cut == 0:
                    if span < chunk_bytes:
                        return  # an unfinished last line: it waits for a later read
                    # One line longer than a chunk: hand it over whole, the parser quarantines it.
                    parts = [buf]
                    while True:
                        more = fh.read(chunk_bytes)
                        if not more:
                            return
                        j = more.find(b"\n")
                        if j >= 0:
                            parts.append(more[:j + 1])
                            break
                        parts.append(more)
                    buf = b"".join(parts)
                    cut = len(buf)
                elif cut < len(buf):
                    buf = buf[:cut]
            offset += cut
            yield buf, offset


def _gzip_pieces(path: Path, offset: int, size: int = 4 << 20) -> Iterator[bytes]:
    """Decompressed bytes after `offset`; a stream still being written yields what is complete so far."""
    skip = offset
    with open(path, "rb") as fh:
        decomp = zlib.decompressobj(wbits=47)
        while raw := fh.read(size):
            while raw:
                out = decomp.decompress(raw)
                raw = b""
                if decomp.eof:  # concatenated gzip members
                    raw = decomp.unused_data
                    decomp = zlib.decompressobj(wbits=47)
                if skip:
                    dropped = min(skip, len(out))
                    out, skip = out[dropped:], skip - dropped
                if out:
                    yield out


def _line_bounds(buf: bytes, newlines: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive, without the newline) of every complete line in `buf`."""
    ends = _newlines(buf) if newlines is None else newlines
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    return starts, ends


def _is_utf8(buf: bytes | memoryview) -> bool:
    """Whether all of `buf` is UTF-8, checked by Arrow's validator (no decoded copy of the buffer)."""
    data = pa.py_buffer(buf)
    offsets = pa.py_buffer(np.array([0, len(buf)], dtype=np.int64).tobytes())
    try:
        pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, data]).cast(pa.large_string())
    except pa.ArrowInvalid:
        return False
    return True


def _bad_utf8_lines(buf: bytes, starts: np.ndarray) -> set[int]:
    """Indexes of lines holding bytes that are not UTF-8 (decoding stops at each and resumes after its line)."""
    bad: set[int] = set()
    pos = 0
    while True:
        try:
            buf[pos:].decode("utf-8")
            return bad
        except UnicodeDecodeError as exc:
            idx = int(np.searchsorted(starts, pos + exc.start, side="right")) - 1
            bad.add(idx)
            if idx + 1 >= len(starts):
                return bad
            pos = int(starts[idx + 1])


def parse_jsonl(buf: bytes, first_line: int, file: str, limits: Limits) -> tuple[pd.DataFrame, list[Reject], int]:
    """Parse whole JSON Lines with pyarrow; a bad line is isolated by the row pyarrow names, not by a slow path.

    Returns the rows (with LINE), the rejected lines, and the number of lines consumed.
    """
    with ThreadPoolExecutor(_WORKERS) as pool:
        parsed, n = _start_jsonl(buf, first_line, file, limits, pool)
        table, odd, rejects = parsed()
    if table is None:
        return odd, rejects, n
    frame = table.to_pandas()
    if len(odd):
        frame = pd.concat([frame, odd], ignore_index=True).sort_values(LINE, kind="stable", ignore_index=True)
    return frame, rejects, n


def _start_jsonl(buf: bytes, first_line: int, file: str, limits: Limits, pool: ThreadPoolExecutor,
                 newlines: np.ndarray | None = None) -> tuple[_Parsed, int]:
    """Queue the blocks of whole JSON Lines on `pool`; returns a function that waits for the blocks and gives
    (rows in one Arrow table, the few rows whose field types differ from it, rejects), and the number of lines.

    Rows and rejects keep the order of their lines. `newlines`: the position of every newline in `buf`, when
    the caller has it already. Everything that scans a block's bytes runs with its block, on `pool`.
    """
    starts, ends = _line_bounds(buf, newlines)
    n = len(ends)
    lengths = ends - starts
    rejects: list[Reject] = []
    skip = np.zeros(n, dtype=bool)
    # Blank lines hold no row; pyarrow drops them, so they are dropped here too to keep line numbers right.
    short = np.flatnonzero(lengths <= 2)
    for i in short:
        if not buf[starts[i]:ends[i]].strip():
            skip[i] = True
    line_cap = limits.max_field_chars * 4 + 1024
    for i in np.flatnonzero(lengths > line_cap):
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
        return *_combine(tables, limits.max_field_chars), rejects

    return parsed, n


def _parse_json_lines(buf: bytes, view: memoryview, starts: np.ndarray, ends: np.ndarray, idx: np.ndarray,
                      first_line: int, file: str) -> tuple[list[pa.Table], list[Reject]]:
    """One block of lines `idx` (increasing): lines of invalid UTF-8 or nested too deep are rejected, the rest
    parsed into tables (with LINE). Returns the tables and the rejects, in line order within each kind."""
    rejects: list[Reject] = []
    lo, hi = int(starts[idx[0]]), int(ends[idx[-1]])
    if not _is_utf8(view[lo:hi]):
        first = int(idx[0])
        bad = np.isin(idx, [first + i for i in _bad_utf8_lines(buf[lo:hi], starts[first:idx[-1] + 1] - lo)])
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
    opens = _scan(arr, lambda piece: (piece | 0x20) == 0x7B)
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


def _empty_frame() -> pd.DataFrame:
    return pd.DataFrame({LINE: pd.Series([], dtype=np.int64)})


def _to_frame(tables: list[pa.Table], max_chars: int) -> pd.DataFrame:
    """One DataFrame from parsed blocks whose inferred column types may differ, oversize rows flagged."""
    if not tables:
        return _empty_frame()
    try:
        return _flag_oversize(pa.concat_tables(tables, promote_options="permissive"), max_chars).to_pandas()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        # Blocks disagree on a column's type (number here, string there): object columns; validation sorts it
        # out. Made object before the concat, so that no column's type depends on which blocks held only
        # nulls; a column every block holds in one type keeps it.
        frames = [_flag_oversize(t, max_chars).to_pandas() for t in tables]
        types: dict[str, set] = {}
        for f in frames:
            for c in f.columns:
                types.setdefault(c, set()).add(f[c].dtype)
        mixed = {c for c, seen in types.items() if c != LINE and (len(seen) > 1 or any(c not in f for f in frames))}
        return pd.concat([f.astype({c: object for c in f.columns if c in mixed}) for f in frames], ignore_index=True)


def _combine(tables: list[pa.Table], max_chars: int) -> tuple[pa.Table | None, pd.DataFrame]:
    """Parsed blocks as one Arrow table, and apart (as pandas) the few whose column types do not merge with it.

    A line whose field has another type than in its neighbours ends up in a table of its own; it is
    kept apart so that one odd line does not turn a whole column into Python objects.
    """
    if not tables:
        return None, _empty_frame()
    try:
        return _flag_oversize(pa.concat_tables(tables, promote_options="permissive"), max_chars), _empty_frame()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    main: list[pa.Table] = []
    odd: list[pa.Table] = []
    schema = None
    for t in sorted(tables, key=lambda t: -t.num_rows):  # the biggest blocks set the types
        try:
            merged = t.schema if schema is None else pa.unify_schemas([schema, t.schema], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            odd.append(t)
            continue
        schema = merged
        main.append(t)
    main.sort(key=lambda t: t[LINE][0].as_py())
    try:
        table = _flag_oversize(pa.concat_tables(main, promote_options="permissive"), max_chars)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None, _to_frame(tables, max_chars).sort_values(LINE, kind="stable", ignore_index=True)
    return table, _to_frame(odd, max_chars).sort_values(LINE, kind="stable", ignore_index=True)


def _open_parquet(path: Path) -> pq.ParquetFile:
    """The file, its text columns but `request_id` read as dictionaries.

    A dictionary column decodes each distinct text once (most repeat: versions, statuses, categories) and
    reaches fold as category codes, with no text hashed per row; ids are distinct and stay plain text.
    pyarrow takes `read_dictionary` only when a file is opened: the footer read first is handed on.
    """
    metadata = pq.read_metadata(path)
    schema = metadata.schema.to_arrow_schema()
    return pq.ParquetFile(path, metadata=metadata,
                          read_dictionary=[f.name for f in schema if is_text(f.type) and f.name != "request_id"])


def _flag_oversize(table: pa.Table, max_chars: int) -> pa.Table:
    """Add OVERSIZE when a text cell is longer than `max_chars` bytes (checked in Arrow: no Python loop)."""
    over = None
    for col in table.columns:
        t = col.type
        if is_text(t):
            lengths = pc.binary_length(col)
            longest = pc.max(lengths).as_py()
        elif pa.types.is_dictionary(t) and is_text(t.value_type):
            # Each distinct text measured once; the rows' lengths are taken only when one is too long.
            longest = max((pc.max(pc.binary_length(c.dictionary)).as_py() or 0 for c in col.chunks), default=0)
            if longest > max_chars:
                lengths = pa.chunked_array([pc.take(pc.binary_length(c.dictionary), c.indices) for c in col.chunks])
        else:
            continue
        if longest is None or longest <= max_chars:
            continue  # the usual case: no cell to flag, no mask to build
        # A null cell is not oversize; without fill_null a null would hide a hit in another column.
        hit = pc.fill_null(pc.greater(lengths, max_chars), False)
        over = hit if over is None else pc.or_(over, hit)
    if over is None or not pc.any(over).as_py():
        return table
    return table.append_column(OVERSIZE, over)


def parse_csv(buf: bytes, header: bytes, skip_header: bool, first_line: int, file: str,
              limits: Limits) -> tuple[pd.DataFrame, list[Reject], int]:
    """Parse whole CSV lines (header from the file's first line); rows of the wrong width are rejected.

    Values are read as text; validation converts them to their declared types.
    """
    n = buf.count(b"\n")
    if skip_header:
        buf, first_line = buf[buf.index(b"\n") + 1:], first_line + 1
    starts, ends = _line_bounds(buf)
    rejects = [Reject(f"{file}:{first_line + i + 1}", Reason.invalid_encoding, excerpt(buf[starts[i]:ends[i]]))
               for i in sorted(_bad_utf8_lines(buf, starts))]
    keep = np.arange(len(ends), dtype=np.int64)
    # Blank lines hold no row, and pyarrow skips them: dropped here so its row numbers map back to lines.
    blank = [int(i) for i in np.flatnonzero(ends - starts <= 2) if not buf[starts[i]:ends[i]].strip()]
    if rejects or blank:
        keep = np.setdiff1d(keep, [int(r.position.rsplit(":", 1)[1]) - first_line - 1 for r in rejects] + blank)
        buf = b"".join(buf[starts[i]:ends[i] + 1] for i in keep)
    if not len(keep):
        return _empty_frame(), rejects, n
    names = [c.strip() for c in header.decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r\n").split(",")]
    invalid: list[tuple[int, str]] = []

    def on_invalid(row) -> str:
        invalid.append((row.number, row.text or ""))
        return "skip"

    table = pacsv.read_csv(
        io.BytesIO(buf),
        read_options=pacsv.ReadOptions(column_names=names, block_size=8 << 20, use_threads=False),
        parse_options=pacsv.ParseOptions(invalid_row_handler=on_invalid, newlines_in_values=False),
        convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in names}, strings_can_be_null=True),
    )
    # pyarrow numbers the rows of this buffer from 1; map them back to lines of the file.
    dropped = np.array([number - 1 for number, _ in invalid], dtype=np.int64)
    rejects += [Reject(f"{file}:{first_line + int(keep[number - 1]) + 1}", Reason.unparseable, excerpt(text))
                for number, text in invalid]
    frame = _to_frame([table], limits.max_field_chars)
    frame[LINE] = np.delete(keep, dropped) + first_line + 1
    return frame, rejects, n


def parse_otlp_lines(buf: bytes, first_line: int, file: str) -> tuple[pd.DataFrame, list[Reject], int]:
    """Stage timings from OTLP-JSON trace documents (one per line, or one pretty-printed document)."""
    from monitor.otlp import parse_otlp

    n = buf.count(b"\n")
    frame, rejects = parse_otlp(buf, source=file)
    frame[LINE] = np.arange(first_line + 1, first_line + 1 + len(frame), dtype=np.int64)
    return frame, rejects, n


class SqlTableSource:
    """A SQL table read in `cursor_column` order; the last cursor value read is the offset.

    A run of rows sharing one cursor value is never split across chunks, so `>` never skips a row.
    """

    def __init__(self, name: str, config: SqlSource, limits: Limits):
        self.name, self.config, self.limits = name, config, limits
        self._engine = None

    def engine(self):
        if self._engine is None:
            from sqlalchemy import create_engine
            from sqlalchemy.engine import make_url

            url = make_url(self.config.url)
            if self.config.password is not None:
                url = url.set(password=self.config.password.resolve())
            self._engine = create_engine(url, pool_pre_ping=True)
        return self._engine

    def read(self, offsets: dict[str, OffsetState]) -> Iterator[Batch]:
        import sqlalchemy as sa

        key = f"sql:{self.config.table}"
        state = offsets.get(key) or OffsetState(file_key=key, path=self.config.table, offset=0, line=0,
                                                cursor=None, fingerprint=None, size=None)
        schema, _, name = self.config.table.rpartition(".")
        table = sa.Table(name, sa.MetaData(), schema=schema or None, autoload_with=self.engine())
        col = table.c[self.config.cursor_column]
        limit = self.limits.chunk_rows
        while True:
            query = sa.select(table).order_by(col).limit(limit + 1)
            if state.cursor is not None:
                query = query.where(col > _decode_cursor(state.cursor))
            with self.engine().connect() as conn:
                frame = pd.read_sql(query, conn)
                more = len(frame) > limit
                if more:
                    cursor = frame[self.config.cursor_column]
                    if cursor.iloc[0] == cursor.iloc[limit]:
                        # One cursor value fills the chunk: read all of its rows at once.
                        frame = pd.read_sql(sa.select(table).where(col == cursor.iloc[0]), conn)
                    else:
                        frame = frame[cursor != cursor.iloc[limit]]
            if frame.empty:
                return
            frame[LINE] = np.arange(state.line + 1, state.line + 1 + len(frame), dtype=np.int64)
            state = replace(state, cursor=_encode_cursor(frame[self.config.cursor_column].iloc[-1]),
                            line=state.line + len(frame))
            yield Batch(self.name, self.config.table, frame, [], state, [])
            if not more:
                return


def _encode_cursor(value) -> str:
    if isinstance(value, pd.Timestamp):
        return json.dumps({"t": value.isoformat()})
    if isinstance(value, np.integer | int):
        return json.dumps({"i": int(value)})
    if isinstance(value, np.floating | float):
        return json.dumps({"f": float(value)})
    return json.dumps({"s": str(value)})


def _decode_cursor(text: str):
    (tag, value), = json.loads(text).items()
    return {"t": pd.Timestamp, "i": int, "f": float, "s": str}[tag](value)


def open_source(name: str, config: FileSource | SqlSource, limits: Limits) -> DirectorySource | SqlTableSource:
    """The reader for a configured source."""
    return DirectorySource(name, config, limits) if config.kind == "files" else SqlTableSource(name, config, limits)

