"""CSV lines parsed with pyarrow, every value as text; rows of the wrong width are rejected."""

from __future__ import annotations

import csv
import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from monitor.config import Limits
from monitor.contract import RAW_BYTES, Reason, Reject, excerpt
from monitor.ingest.sources.batch import LINE, empty_frame
from monitor.ingest.sources.chunks import bad_utf8_lines, line_bounds, oversize_line
from monitor.ingest.sources.tables import to_frame


def parse_csv(buf: bytes, header: bytes, skip_header: bool, first_line: int, file: str,
              limits: Limits) -> tuple[pd.DataFrame, list[Reject], int]:
    """Parse whole CSV lines (header from the file's first line); rows of the wrong width are rejected.

    Values are read as text; validation converts them to their declared types.
    """
    n = buf.count(b"\n")
    if skip_header:
        buf, first_line = buf[buf.index(b"\n") + 1:], first_line + 1
    starts, ends = line_bounds(buf)
    long = np.flatnonzero(ends - starts > limits.max_line_bytes)
    rejects = [oversize_line(f"{file}:{first_line + i + 1}", int(ends[i] - starts[i]), buf[starts[i]:starts[i] + RAW_BYTES],
                             limits.max_line_bytes) for i in long]
    rejects += [Reject(f"{file}:{first_line + i + 1}", Reason.invalid_encoding, excerpt(buf[starts[i]:ends[i]]))
                for i in sorted(bad_utf8_lines(buf, starts) - set(long.tolist()))]
    keep = np.arange(len(ends), dtype=np.int64)
    # Blank lines hold no row, and pyarrow skips them: dropped here so its row numbers map back to lines.
    blank = [int(i) for i in np.flatnonzero(ends - starts <= 2) if not buf[starts[i]:ends[i]].strip()]
    if rejects or blank:
        keep = np.setdiff1d(keep, [int(r.position.rsplit(":", 1)[1]) - first_line - 1 for r in rejects] + blank)
        buf = b"".join(buf[starts[i]:ends[i] + 1] for i in keep)
    if not len(keep):
        return empty_frame(), rejects, n
    names = header_names(header)
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
    frame = to_frame([table], limits.max_field_chars)
    frame[LINE] = np.delete(keep, dropped) + first_line + 1
    return frame, rejects, n


def header_names(header: bytes) -> list[str]:
    """The column names of a CSV header line, quoted or not (`"ts","request_id"`, as pandas and pyarrow write
    them; a quoted name may hold a comma), each stripped of spaces and a byte order mark."""
    text = header.decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r\n")
    return [c.strip() for c in next(csv.reader([text]), [])]
