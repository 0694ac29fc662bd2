"""One batch through the contract: its rows put in the contract's shape (shape), checked (validate), and its
rejects quoted from the lines they were read from (quarantine); what a stage reading sources counted."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import pandas as pd

from monitor.config import Config, FileSource, Limits, Service, SqlSource
from monitor.contract import RecordKind, Reject
from monitor.ingest.frame import ARRIVED
from monitor.ingest.quarantine import quote
from monitor.ingest.shape import to_contract
from monitor.ingest.sources.batch import FILE, LINE, Batch
from monitor.ingest.validate import validate
from monitor.schema import Schema


def check_batch(batch: Batch, kind: RecordKind, schema: Schema, limits: Limits, now: datetime,
                source: FileSource | SqlSource) -> tuple[pd.DataFrame, list[Reject]]:
    """The accepted rows of `batch` (typed, with LINE and, for small files read together, FILE) and every
    reject it holds (the reader's and the contract's, in line order). The batch's text is let go after."""
    frame = to_contract(batch.frame, source, schema.fold_case)
    accepted, bad = validate(kind, frame, batch.file, schema, limits, now, source.timezone, batch.lines)
    if batch.table is not None:
        # Rows parsed into Arrow are checked there; `frame` then holds the few rows whose types differ.
        table = to_contract(batch.table, source, schema.fold_case)
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


Rejected = tuple[RecordKind, str, Reject]  # (record kind, source, reject)


@dataclass
class Intake:
    """What a stage read from its sources and what the contract made of it; counts are rows."""

    read: Counter = field(default_factory=Counter)  # per record kind
    accepted: Counter = field(default_factory=Counter)  # per record kind
    quarantined: Counter = field(default_factory=Counter)  # per reason code
    quarantined_fields: Counter = field(default_factory=Counter)  # per "reason:kind:field", rows naming a field
    events: list[str] = field(default_factory=list)

    def accept(self, batch: Batch | None, kind: RecordKind, service: Service, config: Config, now: datetime,
               rejects: list[Rejected]) -> pd.DataFrame:
        """Validate one batch; collect its rejects; return the accepted rows stamped with their arrival."""
        if batch is None:
            return pd.DataFrame()
        self.read[kind.value] += batch.rows_read
        self.events += [f"{batch.file}: {e}" for e in batch.events]
        accepted, bad = check_batch(batch, kind, service.schema_, config.limits, now,
                                    getattr(service.sources, kind.value))
        rejects += [(kind, batch.source, r) for r in bad]
        self.accepted[kind.value] += len(accepted)
        accepted[ARRIVED] = pd.Timestamp(now)
        # Small files read together name each row's file; any other batch is one file.
        accepted["_source"] = accepted.pop(FILE).astype(str) if FILE in accepted else batch.file
        return accepted

    def count(self, rejects: list[Rejected]) -> None:
        """Count stored rejects per reason and per field they name."""
        for kind, _, r in rejects:
            self.quarantined[r.reason.value] += 1
            for name in r.field.split(", ") if r.field else ():
                self.quarantined_fields[f"{r.reason.value}:{kind.value}:{name}"] += 1


def quarantine_rows(rejects: list[Rejected], tick_id: int, service: str, now: datetime) -> list[dict]:
    """The `quarantine` rows of `rejects`, read by tick `tick_id` at `now`."""
    return [{"tick_id": tick_id, "service": service, "kind": kind.value, "source": source, "position": r.position,
             "reason": r.reason.value, "excerpt": r.excerpt, "field": r.field, "raw": r.raw, "created_at": now}
            for kind, source, r in rejects]
