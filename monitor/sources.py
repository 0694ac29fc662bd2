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
import re
import zlib
from collections.abc import Iterator
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
from storage.store import OffsetState

LINE = "_line"  # column carrying each row's 1-based line (or row) number within its file
OVERSIZE = "_oversize"  # present, and true on a row, when one of its text fields passes limits.max_field_chars
FINGERPRINT_BYTES = 256
_JSON_BLOCK_LINES = 16_384  # a bad line costs a re-parse of at most ~2x this many lines
_READ_OPTIONS = pajson.ReadOptions(block_size=4 << 20)
_BOM = b"\xef\xbb\xbf"


@dataclass
class Batch:
    """Rows parsed from one stretch of one file (or one query), not yet validated against the contract."""

    source: str
    file: str  # file name (or table name) used in quarantine positions
    frame: pd.DataFrame  # raw parsed rows, with LINE
    rejects: list[Reject]
    offset: OffsetState  # the state to commit once this batch's results are stored
    events: list[str] = field(default_factory=list)  # e.g. "truncated", "replaced"

    @property
    def rows_read(self) -> int:
        return len(self.frame) + len(self.rejects)


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
        for path in self.files():
            try:
                st = path.stat()
            except FileNotFoundError:  # deleted between listing and reading
                continue
            key = f"{st.st_dev}:{st.st_ino}"
            state, events = self._resume(path, key, st.st_size, offsets.get(key))
            fmt = file_format(path, self.config.format)
            if fmt == "parquet":
                yield from self._read_parquet(path, state, events)
            elif fmt in ("jsonl", "csv", "otlp"):
                yield from self._read_lines(path, state, events, fmt)
            # Files of an unknown type are skipped: the pattern chose them, so say so once per read.
            elif state.offset == 0 and state.line == 0:
                yield Batch(self.name, path.name, pd.DataFrame({LINE: []}),
                            [Reject(path.name, Reason.unparseable, f"unknown file type: {path.name}")],
                            replace(state, offset=st.st_size, line=1, size=st.st_size), events)

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

    def _read_parquet(self, path: Path, state: OffsetState, events: list[str]) -> Iterator[Batch]:
        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError):
            return  # no footer yet: a Parquet file still being written is read once it is complete
        if state.line >= pf.metadata.num_rows:
            return
        row = 0
        for rb in pf.iter_batches(batch_size=self.limits.chunk_rows):
            start, row = row, row + rb.num_rows
            if row <= state.line:
                continue
            table = pa.Table.from_batches([rb]).slice(max(0, state.line - start))
            first = max(start, state.line)
            frame = _to_frame([table], self.limits.max_field_chars)
            frame[LINE] = np.arange(first + 1, row + 1, dtype=np.int64)
            size = path.stat().st_size
            yield Batch(self.name, path.name, frame, [],
                        replace(state, line=row, offset=size, size=size), events)
            events = []

    def _read_lines(self, path: Path, state: OffsetState, events: list[str], fmt: str) -> Iterator[Batch]:
        header = None
        if fmt == "csv":
            header = _first_line(path)
            if header is None:
                return  # header not complete yet
        for buf, offset in _complete_chunks(path, state.offset, self.limits.chunk_bytes):
            if state.offset == 0 and buf.startswith(_BOM):
                buf = buf[len(_BOM):]
            first_line = state.line
            skip_header = fmt == "csv" and state.offset == 0
            if fmt == "jsonl":
                frame, rejects, lines = parse_jsonl(buf, first_line, path.name, self.limits)
            elif fmt == "otlp":
                frame, rejects, lines = parse_otlp_lines(buf, first_line, path.name)
            else:
                frame, rejects, lines = parse_csv(buf, header, skip_header, first_line, path.name, self.limits)
            state = replace(state, offset=offset, line=first_line + lines, size=offset)
            yield Batch(self.name, path.name, frame, rejects, state, events)
            events = []


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


def _complete_chunks(path: Path, offset: int, chunk_bytes: int) -> Iterator[tuple[bytes, int]]:
    """Stretches of whole lines after byte `offset` (decompressed offset for .gz), with the end offset.

    A last line without its newline is left for a later read: it may still be being written.
    """
    pieces = _gzip_pieces(path, offset) if path.suffix == ".gz" else _plain_pieces(path, offset)
    carry = b""
    for piece in pieces:
        carry += piece
        while len(carry) >= chunk_bytes:
            cut = carry.rfind(b"\n", 0, chunk_bytes) + 1
            if cut == 0:  # one line longer than a chunk: hand it over whole, the parser quarantines it
                cut = carry.find(b"\n") + 1
                if cut == 0:
                    break
            offset += cut
            yield carry[:cut], offset
            carry = carry[cut:]
    cut = carry.rfind(b"\n") + 1
    if cut:
        yield carry[:cut], offset + cut


def _plain_pieces(path: Path, offset: int, size: int = 16 << 20) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        fh.seek(offset)
        while piece := fh.read(size):
            yield piece


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


def _line_bounds(buf: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive, without the newline) of every complete line in `buf`."""
    ends = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == 10)
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    return starts, ends


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
    """Parse whole JSON Lines with pyarrow; a bad line is isolated by bisection, not by a slow path.

    Returns the rows (with LINE), the rejected lines, and the number of lines consumed.
    """
    starts, ends = _line_bounds(buf)
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
    for i in sorted(_bad_utf8_lines(buf, starts)):
        if not skip[i]:
            skip[i] = True
            rejects.append(Reject(f"{file}:{first_line + i + 1}", Reason.invalid_encoding, excerpt(buf[starts[i]:ends[i]])))

    tables: list[pa.Table] = []
    for block_start in range(0, n, _JSON_BLOCK_LINES):
        idx = np.arange(block_start, min(n, block_start + _JSON_BLOCK_LINES))
        idx = idx[~skip[idx]]
        if len(idx):
            _parse_json_block(buf, starts, ends, idx, first_line, file, tables, rejects)
    return _to_frame(tables, limits.max_field_chars), rejects, n


def _parse_json_block(buf, starts, ends, idx, first_line, file, tables, rejects) -> None:
    contiguous = idx[-1] - idx[0] + 1 == len(idx)
    data = buf[starts[idx[0]]:ends[idx[-1]] + 1] if contiguous else b"\n".join(buf[starts[i]:ends[i]] for i in idx) + b"\n"
    try:
        table = pajson.read_json(io.BytesIO(data), read_options=_READ_OPTIONS)
        if table.num_rows != len(idx):
            raise pa.ArrowInvalid("row count differs from line count")
    except pa.ArrowInvalid as exc:
        if len(idx) == 1:
            i = int(idx[0])
            rejects.append(Reject(f"{file}:{first_line + i + 1}", _classify_json(buf[starts[i]:ends[i]], exc),
                                  excerpt(buf[starts[i]:ends[i]])))
            return
        half = len(idx) // 2
        _parse_json_block(buf, starts, ends, idx[:half], first_line, file, tables, rejects)
        _parse_json_block(buf, starts, ends, idx[half:], first_line, file, tables, rejects)
        return
    tables.append(table.append_column(LINE, pa.array(idx + first_line + 1, type=pa.int64())))


def _classify_json(line: bytes, exc: Exception) -> Reason:
    try:
        value = json.loads(line)
    except ValueError:
        return Reason.unparseable
    if not isinstance(value, dict):
        return Reason.unparseable
    # A JSON object pyarrow refuses alone: a repeated key or a number beyond float range.
    return Reason.wrong_type if "too big" in str(exc) else Reason.unparseable


def _to_frame(tables: list[pa.Table], max_chars: int) -> pd.DataFrame:
    """One DataFrame from parsed blocks whose inferred column types may differ, oversize rows flagged."""
    if not tables:
        return pd.DataFrame({LINE: pd.Series([], dtype=np.int64)})
    try:
        return _flag_oversize(pa.concat_tables(tables, promote_options="permissive"), max_chars).to_pandas()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        # Blocks disagree on a column's type (number here, string there): object columns; validation sorts it out.
        return pd.concat([_flag_oversize(t, max_chars).to_pandas() for t in tables], ignore_index=True)


def _flag_oversize(table: pa.Table, max_chars: int) -> pa.Table:
    """Add OVERSIZE when a string cell is longer than `max_chars` bytes (checked in Arrow: no Python loop)."""
    over = None
    for col in table.columns:
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            hit = pc.greater(pc.binary_length(col), max_chars)
            over = hit if over is None else pc.or_(over, hit)
    if over is None or not pc.any(over).as_py():
        return table
    return table.append_column(OVERSIZE, pc.fill_null(over, False))


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
    if rejects:
        keep = np.setdiff1d(keep, [int(r.position.rsplit(":", 1)[1]) - first_line - 1 for r in rejects])
        buf = b"".join(buf[starts[i]:ends[i] + 1] for i in keep)
    if not len(keep):
        return pd.DataFrame({LINE: pd.Series([], dtype=np.int64)}), rejects, n
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

