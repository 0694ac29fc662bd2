"""What a source's logs hold, read from a bounded sample without storing anything: per contract field the
column it is read from, an example value and the shares missing and unreadable; per quarantine reason the
rows, the first offending field and its line as written. `tailwatch check-logs` prints it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import pandas as pd
import pyarrow as pa

from monitor.config import FileSource, Limits, Service, SqlSource
from monitor.contract import FIELDS, REQUIRED, Reason, RecordKind
from monitor.ingest.accept import check_batch
from monitor.ingest.quarantine import as_written, printable
from monitor.ingest.shape import column_of
from monitor.ingest.sources import open_source
from monitor.ingest.sources.batch import FILE, LINE, OVERSIZE

SAMPLE_LINES = 1000
# Reasons that say a present value could not be read as its field (missing_field says it was absent).
_UNREADABLE = (Reason.wrong_type, Reason.bad_timestamp, Reason.future_timestamp, Reason.unknown_status,
               Reason.bad_duration)


@dataclass(frozen=True)
class FieldSample:
    """One contract field in a sample: the source column it is read from, whether that column was seen,
    its first value as written, and the shares of parsed rows without it and with it unreadable."""

    field: str
    column: str
    required: bool
    found: bool
    example: str | None
    missing: float  # share of parsed rows where the column is absent or null
    unreadable: float  # share of parsed rows quarantined for this field's value


@dataclass(frozen=True)
class ReasonSample:
    """One quarantine reason in a sample: its rows, and the first such row's field, position and line."""

    reason: str
    rows: int
    field: str | None
    position: str
    line: str  # the line as written (or the parsed row when no line is held), safe for a terminal


@dataclass(frozen=True)
class SourceSample:
    service: str
    source: str  # predictions, timings or labels
    where: str  # the directory or table
    read: int  # rows read (lines, less blank ones)
    accepted: int
    fields: list[FieldSample] = field(default_factory=list)
    reasons: list[ReasonSample] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)  # columns seen that no field is read from

    def as_dict(self) -> dict:
        return {"service": self.service, "source": self.source, "where": self.where, "read": self.read,
                "accepted": self.accepted, "quarantined": self.read - self.accepted,
                "fields": [f.__dict__ for f in self.fields], "reasons": [r.__dict__ for r in self.reasons],
                "unused_columns": self.unused}


def sample_service(service: Service, limits: Limits, now: datetime, lines: int = SAMPLE_LINES) -> list[SourceSample]:
    """A sample of at most `lines` rows of each configured source of `service` (its oldest files first)."""
    out = []
    for kind in (RecordKind.predictions, RecordKind.timings, RecordKind.labels):
        source = getattr(service.sources, kind.value)
        if source is not None:
            out.append(sample_source(service, kind, source, limits, now, lines))
    return out


def sample_source(service: Service, kind: RecordKind, source: FileSource | SqlSource, limits: Limits,
                  now: datetime, lines: int = SAMPLE_LINES) -> SourceSample:
    """What the first `lines` rows of one source hold, checked as a tick checks them."""
    small = limits.model_copy(update={"chunk_rows": max(1, min(limits.chunk_rows, lines))})
    reader = open_source(f"{service.name}/{kind.value}", source, small)
    read = accepted = parsed = 0
    present: Counter = Counter()  # source column -> rows holding a value
    examples: dict[str, tuple[int, str]] = {}  # source column -> (line, its value there)
    rejects = []
    batches = reader.read({})
    try:
        for batch in batches:
            for raw in (batch.table, batch.frame):
                if raw is not None and (raw.num_rows if isinstance(raw, pa.Table) else len(raw)):
                    parsed += _look(raw, present, examples)
            ok, bad = check_batch(batch, kind, service.schema_, limits, now, source)
            read += batch.rows_read
            accepted += len(ok)
            rejects += bad
            if read >= lines:
                break
    finally:
        batches.close()
    unread = Counter(f for r in rejects if r.reason in _UNREADABLE and r.field for f in r.field.split(", "))
    names = _fields(kind, service, source, present)
    fields = [FieldSample(name, column_of(source, name), name in REQUIRED[kind], present[column_of(source, name)] > 0,
                          examples.get(column_of(source, name), (0, None))[1],
                          _share(parsed - present[column_of(source, name)], parsed), _share(unread[name], parsed))
              for name in names]
    reasons = []
    for reason, n in Counter(r.reason.value for r in rejects).most_common():
        first = next(r for r in rejects if r.reason.value == reason)
        reasons.append(ReasonSample(reason, n, first.field, first.position,
                                    printable(first.raw if first.raw is not None else first.excerpt)))
    used = {column_of(source, name) for name in names}
    unused = [c for c in present if c not in used]
    where = str(source.path) if isinstance(source, FileSource) else source.table
    return SourceSample(service.name, kind.value, where, read, accepted, fields, reasons, unused)


def _fields(kind: RecordKind, service: Service, source: FileSource | SqlSource, present: Counter) -> list[str]:
    """The contract fields worth a line: required, mapped, seen, or declared in the schema."""
    schema = service.schema_
    declared = (list(schema.features) + list(schema.segments) + list(schema.signals)
                if kind == RecordKind.predictions else [])
    names = [n for n in FIELDS[kind] if n in REQUIRED[kind] or n in source.columns or present[column_of(source, n)]]
    return names + [n for n in declared if n not in names]


def _look(raw: pd.DataFrame | pa.Table, present: Counter, examples: dict[str, tuple[int, str]]) -> int:
    """Count the values of each column of parsed rows, keep each column's value of the earliest line;
    returns the rows."""
    table = isinstance(raw, pa.Table)
    lines = raw[LINE].to_numpy() if LINE in (raw.column_names if table else raw.columns) else None
    for name in raw.column_names if table else raw.columns:
        if name in (LINE, FILE, OVERSIZE):
            continue
        valid = raw[name].is_valid().to_numpy(zero_copy_only=False) if table else raw[name].notna().to_numpy()
        present[name] += int(valid.sum())
        if valid.any():
            i = int(valid.argmax())
            line = int(lines[i]) if lines is not None else 0
            if name not in examples or line < examples[name][0]:
                value = raw[name][i].as_py() if table else raw[name].iloc[i]
                examples[name] = (line, printable(as_written(value)))
    return raw.num_rows if table else len(raw)


def _share(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0
