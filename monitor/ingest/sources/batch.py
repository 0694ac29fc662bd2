"""A batch of rows read from a source, the columns every reader adds to its rows, and the format of a file."""

from __future__ import annotations

import re
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
