"""One batch through the contract: its rows put in the contract's shape (shape), checked (validate), and its
rejects quoted from the lines they were read from (quarantine)."""

from __future__ import annotations

from datetime import datetime

import pandas as pd

from monitor.config import FileSource, Limits, SqlSource
from monitor.contract import RecordKind, Reject
from monitor.ingest.quarantine import quote
from monitor.ingest.shape import to_contract
from monitor.ingest.sources.batch import LINE, Batch
from monitor.ingest.validate import validate
from monitor.schema import Schema


def check_batch(batch: Batch, kind: RecordKind, schema: Schema, limits: Limits, now: datetime,
                source: FileSource | SqlSource) -> tuple[pd.DataFrame, list[Reject]]:
    """The accepted rows of `batch` (typed, with LINE and, for small files read together, FILE) and every
    reject it holds (the reader's and the contract's, in line order). The batch's text is let go after."""
    frame = to_contract(batch.frame, source)
    accepted, bad = validate(kind, frame, batch.file, schema, limits, now, source.timezone, batch.lines)
    if batch.table is not None:
        # Rows parsed into Arrow are checked there; `frame` then holds the few rows whose types differ.
        table = to_contract(batch.table, source)
        main, main_bad = validate(kind, table, batch.file, schema, limits, now, source.timezone, batch.lines)
        if len(main) and len(accepted):
            # The few odd rows take the main rows' Arrow text dtype: an object column would make every row one.
            arrow = {c: main[c].dtype for c in accepted.columns
                     if c in main and isinstance(main[c].dtype, pd.ArrowDtype) and accepted[c].dtype == object}
            accepted = pd.concat([main, accepted.astype(arrow) if arrow else accepted], ignore_index=True)
            accepted = accepted.sort_values(LINE, kind="stable", ignore_index=True)
        elif not len(accepted):
            accepted = main
        bad = sorted(main_bad + bad, key=_line_of) if bad else main_bad
    # The reader's rejects quote their lines too (an excerpt they have; the bytes they get here).
    rejects = quote(batch.rejects, batch.lines) + bad
    batch.lines = None
    return accepted, rejects


def _line_of(reject: Reject) -> int:
    tail = reject.position.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0
