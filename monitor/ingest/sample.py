"""What a source's logs hold, read from a bounded sample without storing anything: per contract field the
column it is read from, an example value and the shares missing and unreadable; per quarantine reason the
rows, the first offending field and its line as written. `tailwatch check-logs` prints it."""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import pandas as pd
import pyarrow as pa

from monitor.aggregate.profile import Profile, profile_for
from monitor.classes import class_name
from monitor.config import FileSource, Limits, Service, SqlSource
from monitor.contract import DURATIONS, FIELDS, REQUIRED, STATUSES, TIMESTAMPS, Reason, RecordKind
from monitor.ingest.accept import check_batch
from monitor.ingest.labels import unmatched
from monitor.ingest.quarantine import as_written, printable
from monitor.ingest.shape import PER_SECOND, column_of
from monitor.ingest.sources import open_source
from monitor.ingest.sources.batch import FILE, LINE, OVERSIZE
from monitor.schema import Schema
from monitor.values import respelled

SAMPLE_LINES = 1000
_UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}
_PLAUSIBLE = (946_684_800, 4_102_444_800)  # epoch seconds of 2000 and 2100: a time a log holds
Row = tuple[int, str | None, int | None]  # a parsed row: its batch's number, its file (small files read together), its line
_BATCH = "_batch"
# Reasons that say a present value could not be read as its field (missing_field says it was absent).
_UNREADABLE = (Reason.wrong_type, Reason.bad_timestamp, Reason.future_timestamp, Reason.unknown_status,
               Reason.bad_duration)


@dataclass(frozen=True)
class FieldSample:
    """One contract field in a sample: the source column it is read from, whether that column was seen,
    its first value as written and, for a time or a duration, what the contract reads it as (RFC 3339 UTC;
    milliseconds), and the shares of parsed rows without it and with it unreadable."""

    field: str
    column: str
    required: bool
    found: bool
    example: str | None
    read_as: str | None
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
    warnings: list[str] = field(default_factory=list)  # what keeps rows out, and how to say what they are
    errors: list[str] = field(default_factory=list)  # what the config asks of these logs that they cannot give
    cursor: str | None = None  # a SQL source's cursor column: read to know where the next read starts

    def as_dict(self) -> dict:
        return {"service": self.service, "source": self.source, "where": self.where, "read": self.read,
                "accepted": self.accepted, "quarantined": self.read - self.accepted,
                "fields": [f.__dict__ for f in self.fields], "reasons": [r.__dict__ for r in self.reasons],
                "unused_columns": self.unused, "cursor_column": self.cursor, "warnings": self.warnings,
                "errors": self.errors}


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
    examples: dict[str, tuple[Row, str]] = {}  # source column -> (its first row, its value there)
    rejects = []
    converted = []  # accepted rows' times and durations, in the contract's units
    rows = []  # accepted prediction rows: their values are checked against the reference and the config
    statuses: Counter = Counter()  # each status as written -> rows
    batches = reader.read({})
    try:
        for number, batch in enumerate(batches):
            for raw in (batch.table, batch.frame):
                if raw is not None and (raw.num_rows if isinstance(raw, pa.Table) else len(raw)):
                    parsed += _look(raw, number, present, examples)
                    if kind == RecordKind.predictions:
                        statuses.update(_written(raw, column_of(source, "status")))
            ok, bad = check_batch(batch, kind, service.schema_, limits, now, source)
            read += batch.rows_read
            accepted += len(ok)
            rejects += bad
            kept = ok[[c for c in ok.columns if c in (LINE, FILE) or c in TIMESTAMPS or c in DURATIONS]]
            converted.append(kept.assign(**{_BATCH: number}))
            if kind == RecordKind.predictions and len(ok):
                rows.append(ok)
            if read >= lines:
                break
    finally:
        batches.close()
    unread = Counter(f for r in rejects if r.reason in _UNREADABLE and r.field for f in r.field.split(", "))
    names = _fields(kind, service, source, present)
    read_as = pd.concat([c for c in converted if len(c)], ignore_index=True) if any(len(c) for c in converted) else None
    fields = []
    for name in names:
        column = column_of(source, name)
        row, example = examples.get(column, (None, None))
        fields.append(FieldSample(name, column, name in REQUIRED[kind], present[column] > 0, example,
                                  _read_as(read_as, name, row) if row is not None else None,
                                  _share(parsed - present[column], parsed), _share(unread[name], parsed)))
    reasons = []
    for reason, n in Counter(r.reason.value for r in rejects).most_common():
        first = next(r for r in rejects if r.reason.value == reason)
        reasons.append(ReasonSample(reason, n, first.field, first.position,
                                    printable(first.raw if first.raw is not None else first.excerpt)))
    cursor = source.cursor_column if isinstance(source, SqlSource) else None
    used = {column_of(source, name) for name in names} | {cursor}
    unused = [c for c in present if c not in used]
    where = str(source.path) if isinstance(source, FileSource) else source.table
    values = pd.concat(rows, ignore_index=True) if rows else None
    checked = (respelled_warnings(reference_profile(service), service.schema_, values)
               + unmatched(values, service, f"the logs' first {accepted:,} rows") if values is not None else [])
    return SourceSample(service.name, kind.value, where, read, accepted, fields, reasons, unused,
                        _warnings(kind, source, read, fields) + _unknown_statuses(source, statuses)
                        + _undeclared(kind, service, fields, unused) + checked,
                        _unscorable(kind, service, source, present, parsed), cursor)


def log_rows(service: Service, limits: Limits, now: datetime, lines: int = SAMPLE_LINES) -> pd.DataFrame | None:
    """The accepted rows among the first `lines` prediction rows of `service`'s source (None: none)."""
    source = service.sources.predictions
    small = limits.model_copy(update={"chunk_rows": max(1, min(limits.chunk_rows, lines))})
    batches = open_source(f"{service.name}/predictions", source, small).read({})
    rows, read = [], 0
    try:
        for batch in batches:
            ok, _ = check_batch(batch, RecordKind.predictions, service.schema_, limits, now, source)
            read += batch.rows_read
            rows += [ok] if len(ok) else []
            if read >= lines:
                break
    finally:
        batches.close()
    return pd.concat(rows, ignore_index=True) if rows else None


def reference_profile(service: Service) -> Profile | None:
    """The profile of `service`'s reference file (None without one, or when it cannot be read)."""
    if service.reference is None:
        return None
    try:
        return profile_for(service.reference, service.schema_)
    except (OSError, ValueError):
        return None


def respelled_warnings(profile: Profile | None, schema: Schema, rows: pd.DataFrame | None) -> list[str]:
    """A line per categorical value the logs write otherwise than the reference does, though it differs
    only in case or whitespace (values are already read one way: monitor.values); says how to fold case."""
    if profile is None or rows is None:
        return []
    out = []
    for name, kind in schema.features.items():
        if kind != "categorical" or name not in rows or name not in profile.fields:
            continue
        seen = [v for v in pd.unique(rows[name].astype(object)) if isinstance(v, str)]
        for ours, theirs in respelled(profile.fields[name].categories, seen):
            case = ours.lower() == theirs.lower() and name not in schema.fold_case
            out.append(f"field {name}: reference has {ours!r}, logs have {theirs!r}"
                       + (f" (list {name} under schema.fold_case to read them as one)" if case else ""))
    return out


def _written(raw: pd.DataFrame | pa.Table, column: str) -> Counter:
    """Rows per value (as text) of `column` in parsed rows; empty when they do not have it."""
    names = raw.column_names if isinstance(raw, pa.Table) else list(raw.columns)
    if column not in names:
        return Counter()
    values = raw[column].to_pandas() if isinstance(raw, pa.Table) else raw[column]
    return Counter(str(v) for v in values.dropna().tolist())


def _unknown_statuses(source: FileSource | SqlSource, written: Counter) -> list[str]:
    """The statuses as written on more than one row (a service's own words, not a stray line) that no
    `values:` map makes a contract status: each is quarantined as unknown_status, so the line names the
    map that would read it."""
    mapping = source.values.get("status", {})
    meant = {v: mapping.get(class_name(v), v) for v in written}
    unknown = {printable(v): n for v, n in written.items()
               if n > 1 and meant[v] is not None and meant[v] not in STATUSES}
    if not unknown:
        return []
    shown = ", ".join(f"{v!r} ({n:,} rows)" for v, n in sorted(unknown.items(), key=lambda vn: -vn[1])[:8])
    first = max(unknown, key=unknown.get)
    return [f"status {shown}: not a status ({', '.join(STATUSES)}), so quarantined as unknown_status; say what "
            f"each means under sources.predictions.values.status (`values: {{status: {{{first}: <status>}}}}`)"]


def _unscorable(kind: RecordKind, service: Service, source: FileSource | SqlSource, present: Counter,
                parsed: int) -> list[str]:
    """A quality section scored on predictions whose logs hold no prediction and no score column: every
    labelled request would count as a wrong prediction (accuracy 0), so no figure of it could be trusted."""
    q = service.quality
    if kind != RecordKind.predictions or q is None or not parsed or getattr(q, "feedback", None) is not None:
        return []
    schema = service.schema_
    scores = [schema.score_column(c) for c in schema.classes] or [c for c in present if c.startswith("score_")]
    if present[column_of(source, "prediction")] or any(present[c] for c in scores):
        return []
    column = column_of(source, "prediction")
    feedback = ("; a feedback label (thumbs up / down, a score) is scored without one: quality.feedback"
                if "feedback" in type(q).model_fields else "")
    return [f"quality: the logs hold no prediction (column {column}) and no score column "
            f"({', '.join(scores) or 'score_<class>'}) in {parsed:,} rows, so every labelled request would be "
            f"scored as a wrong prediction. Map the column holding it under sources.predictions.columns "
            f"(`prediction: <column>`){feedback}"]


def _undeclared(kind: RecordKind, service: Service, fields: list[FieldSample], unused: list[str]) -> list[str]:
    """Schema columns (features, segments, signals) not in the logs, each with the unread column most like
    its name: a schema names columns as the logs do, so the fix is there, not in `columns:`."""
    if kind != RecordKind.predictions:
        return []
    schema = service.schema_
    declared = {**{n: "feature" for n in schema.features}, **{n: "segment" for n in schema.segments},
                **{n: "signal" for n in schema.signals}}
    out = []
    for f in fields:
        if f.field in declared and not f.found:
            close = difflib.get_close_matches(f.field, unused, n=1, cutoff=0.5)
            out.append(f"schema {declared[f.field]} {f.field}: no such column in the logs"
                       + (f"; they have {close[0]}: declare it under schema by that name" if close else ""))
    return out


def _warnings(kind: RecordKind, source: FileSource | SqlSource, read: int, fields: list[FieldSample]) -> list[str]:
    """Required fields whose column was not seen; times written as numbers in another epoch unit than the
    source says; a request's latency that reads as under a millisecond while the source says ms."""
    out = []
    lost = [f for f in fields if f.required and not f.found]
    if read and lost:
        named = ", ".join(f.field if f.column == f.field else f"{f.field} (column {f.column})" for f in lost)
        plural = len(lost) > 1
        out.append(f"required field{'s' * plural} not found: {named}; every row would be quarantined. Name the "
                   f"column{'s' * plural} holding {'them' if plural else 'it'} under sources.{kind.value}.columns "
                   f"(contract field: your column, e.g. `{lost[0].field}: <column>`)")
    for f in fields:
        number = pd.to_numeric(f.example, errors="coerce") if f.example is not None else None
        if f.field in TIMESTAMPS and f.unreadable and number is not None and not pd.isna(number):
            unit = next((u for u, per in PER_SECOND.items() if _PLAUSIBLE[0] <= abs(number) / per < _PLAUSIBLE[1]), None)
            if unit is not None and unit != source.timestamps.epoch_unit:
                out.append(f"{f.field}: {f.example} is a time in epoch {_UNIT_NAMES[unit]}, read as epoch "
                           f"{_UNIT_NAMES[source.timestamps.epoch_unit]}: set `timestamps: {{epoch_unit: {unit}}}`")
        # A whole request in under a millisecond is rare; a stage (duration_ms) may well be.
        if (f.field in ("latency_ms", "ttft_ms") and source.durations == "ms" and f.read_as is not None and number is not None
                and 0 < number < 1):
            out.append(f"{f.field}: {f.example} reads as {f.read_as}; if it is written in seconds, set `durations: s`")
    return out


def _fields(kind: RecordKind, service: Service, source: FileSource | SqlSource, present: Counter) -> list[str]:
    """The contract fields worth a line: required, mapped, seen, or declared in the schema; and the score
    columns of the schema's classes that were seen (a binary model often logs the positive class's only)."""
    schema = service.schema_
    declared = (list(schema.features) + list(schema.segments) + list(schema.signals)
                if kind == RecordKind.predictions else [])
    scores = ([schema.score_column(c) for c in schema.classes if present[schema.score_column(c)]]
              if kind == RecordKind.predictions else [])
    names = [n for n in FIELDS[kind] if n in REQUIRED[kind] or n in source.columns or present[column_of(source, n)]]
    names += [n for n in declared if n not in names]
    return names + [n for n in scores if n not in names]


def _read_as(accepted: pd.DataFrame | None, name: str, row: Row) -> str | None:
    """How the contract read field `name` in `row` (its batch, file and line; without lines, the batch's first
    accepted row holding it): a time as RFC 3339 UTC, a duration in ms; None for other fields or a row that
    was not accepted."""
    if accepted is None or name not in accepted or not (name in TIMESTAMPS or name in DURATIONS):
        return None
    number, file, line = row
    same = (accepted[_BATCH] == number).to_numpy()
    if line is not None and LINE in accepted:
        same &= (accepted[LINE] == line).to_numpy()
        if file is not None and FILE in accepted:
            same &= (accepted[FILE].astype(str) == file).to_numpy()
    rows = accepted[same & accepted[name].notna().to_numpy()]
    value = rows[name].iloc[0] if len(rows) else None
    if value is None or pd.isna(value):
        return None
    if name in TIMESTAMPS:
        text = pd.Timestamp(value).tz_convert("UTC").strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".")
        return text + "Z"
    return f"{float(value):,.6g} ms"


def _look(raw: pd.DataFrame | pa.Table, number: int, present: Counter, examples: dict[str, tuple[Row, str]]) -> int:
    """Count the values of each column of parsed rows of batch `number`, keep each column's value of the
    earliest row (first batch, then lowest line); returns the rows."""
    table = isinstance(raw, pa.Table)
    names = raw.column_names if table else list(raw.columns)
    lines = raw[LINE].to_numpy() if LINE in names else None
    files = raw[FILE].to_numpy() if FILE in names else None
    for name in raw.column_names if table else raw.columns:
        if name in (LINE, FILE, OVERSIZE):
            continue
        valid = raw[name].is_valid().to_numpy(zero_copy_only=False) if table else raw[name].notna().to_numpy()
        present[name] += int(valid.sum())
        if valid.any():
            i = int(valid.argmax())
            row = (number, str(files[i]) if files is not None else None, int(lines[i]) if lines is not None else None)
            if name not in examples or _order(row) < _order(examples[name][0]):
                value = raw[name][i].as_py() if table else raw[name].iloc[i]
                examples[name] = (row, printable(as_written(value)))
    return raw.num_rows if table else len(raw)


def _order(row: Row) -> tuple[int, int]:
    return row[0], row[2] or 0


def _share(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0
