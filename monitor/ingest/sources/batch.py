"""A batch of rows read from a source, the columns every reader adds to its rows, and the format of a file."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from monitor.contract import RAW_BYTES, Reject
from monitor.ingest.sources.chunks import line_bounds
from storage.offsets import OffsetState

LINE = "_line"  # column carrying each row's 1-based line (or row) number within its file
OVERSIZE = "_oversize"  # present, and true on a row, when one of its text fields passes limits.max_field_chars
FILE = "_file"  # column naming each row's file, in a batch of small files read together
_ROTATED = re.compile(r"(\.\d+)?(\.gz)?$")


class RawLines:
    """The bytes a batch's rows were parsed from, per file: a rejected row is quoted as it was written."""

    def __init__(self, pieces: dict[str, tuple[bytes, int]]):
        self.pieces = pieces  # file name -> (whole lines, the file's line number just before the first)
        self._bounds: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def line(self, file: str, number: int) -> bytes | None:
        """Line `number` (1-based, in its file) without its line end, cut to RAW_BYTES; None when not held."""
        piece = self.pieces.get(file)
        if piece is None:
            return None
        buf, before = piece
        if file not in self._bounds:
            self._bounds[file] = line_bounds(buf)
        starts, ends = self._bounds[file]
        i = number - before - 1
        if not 0 <= i < len(ends):
            return None
        start, end = int(starts[i]), int(ends[i])
        if end > start and buf[end - 1] == 0x0D:  # CRLF: the CR ends the line too
            end -= 1
        return buf[start:min(end, start + RAW_BYTES)]


@dataclass
class Batch:
    """Rows parsed from one stretch of one file (or one query), not yet validated against the contract."""

    source: str
    file: str  # file name (or table name) used in quarantine positions
    frame: pd.DataFrame  # raw parsed rows, with LINE (with `table`: the few rows whose types differ from it)
    rejects: list[Reject]
    offset: OffsetState | None  # the state to commit once this batch's results are stored (None: nothing read)
    events: list[str] = field(default_factory=list)  # e.g. "truncated", "replaced"
    table: pa.Table | None = None  # raw parsed rows kept in Arrow (JSONL, Parquet), with LINE
    more: list[OffsetState] = field(default_factory=list)  # the other files' states, for small files read together
    lines: RawLines | None = None  # the text the rows were parsed from (JSON Lines and CSV), until validated

    @property
    def offsets(self) -> list[OffsetState]:
        """Every offset state this batch consumed."""
        return ([self.offset] if self.offset is not None else []) + self.more

    @property
    def rows_read(self) -> int:
        return len(self.frame) + len(self.rejects) + (self.table.num_rows if self.table is not None else 0)


# Progress, told by the stages that work through a backlog: (done so far, in all when known, else None).
Observer = Callable[[int, int | None], None]


class Backlog:
    """A read's progress for an observer: the rows read, and the rows in all, estimated from the share of
    the files' unread bytes (Parquet: rows) read so far, and exact once the read ends (`finish`)."""

    def __init__(self, observe: Observer, files: list[tuple[str, int, int, int, bool]]):
        # Per file key: where its read starts and ends, in bytes or (by_rows: Parquet) in rows, and its
        # weight: the bytes it has left to read.
        self.observe = observe
        self.files = {key: (start, end, weight, by_rows) for key, start, end, weight, by_rows in files if end > start}
        self.weight = sum(f[2] for f in self.files.values())
        self.reached: dict[str, float] = {}  # per file key, the share of its weight read
        self.rows = 0

    def read(self, batch: Batch) -> None:
        """Count `batch`'s rows and how far its offsets moved; tell the observer."""
        self.rows += batch.rows_read
        for state in batch.offsets:
            if state.file_key in self.files:
                start, end, _, by_rows = self.files[state.file_key]
                at = state.line if by_rows else state.offset
                self.reached[state.file_key] = min(max(at - start, 0) / (end - start), 1.0)
        done = sum(self.files[key][2] * share for key, share in self.reached.items())
        total = round(self.rows * self.weight / done) if done else None
        self.observe(self.rows, None if total is None else max(total, self.rows))

    def finish(self) -> None:
        self.observe(self.rows, self.rows)


class Chain:
    """One observer over reads made one after another: each read's counts follow the rows of those before
    it (call `next` between reads)."""

    def __init__(self, observe: Observer):
        self.observe, self.before, self.last = observe, 0, 0

    def __call__(self, done: int, total: int | None) -> None:
        self.last = done
        self.observe(self.before + done, None if total is None else self.before + total)

    def next(self) -> None:
        self.before, self.last = self.before + self.last, 0


def file_format(path: Path, declared: str) -> str:
    """jsonl / csv / parquet / otlp for a file, from the config or from its name."""
    return format_of(path.name, declared)


def format_of(name: str, declared: str) -> str:
    if declared != "auto":
        return declared
    # Rotated copies keep their type: app.jsonl.1, app.jsonl.2.gz.
    name = name.lower()
    if name[-1:].isdigit() or name.endswith(".gz"):  # the only names _ROTATED changes
        name = _ROTATED.sub("", name)
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if name.endswith((".csv", ".tsv")):
        return "csv"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    return "unknown"


def empty_frame() -> pd.DataFrame:
    return pd.DataFrame({LINE: pd.Series([], dtype=np.int64)})
