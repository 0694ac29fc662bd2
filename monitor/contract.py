"""The data contract: record kinds, their fields, and the reason codes of quarantine.

docs/contract.md is the long form of this module; keep the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# `cancelled`: the client went away or the server aborted the request; `truncated`: an answer cut short (a
# generation stopped at its length limit). Each status's share of requests is a measured rate.
STATUSES = ("ok", "timeout", "rejected", "error", "cancelled", "truncated")
STAGES = ("parse", "preprocess", "batch_wait", "model", "postprocess")


class RecordKind(StrEnum):
    predictions = "predictions"
    timings = "timings"
    labels = "labels"
    reference = "reference"


REQUIRED: dict[RecordKind, tuple[str, ...]] = {
    RecordKind.predictions: ("request_id", "ts", "model_version", "status"),
    RecordKind.timings: ("request_id", "stage", "duration_ms"),
    RecordKind.labels: ("request_id", "label"),
    RecordKind.reference: (),
}

# Optional prediction fields with a fixed meaning (feature, segment and score columns come from config).
NUMERIC_OPTIONAL = (
    "latency_ms", "ttft_ms", "input_tokens", "output_tokens", "threshold",
    "batch_size", "queue_depth", "memory_mb", "spec_accept_rate",
)
STRING_OPTIONAL = (
    "prediction", "cache_version", "preprocess_version", "config_hash", "route", "expert", "replica",
    "cache_state",
)
BOOL_OPTIONAL = ("cache_hit", "cold")

# Every field of a fixed name per record kind: what a source's `columns:` mapping may name.
FIELDS: dict[RecordKind, tuple[str, ...]] = {
    RecordKind.predictions: REQUIRED[RecordKind.predictions] + NUMERIC_OPTIONAL + STRING_OPTIONAL + BOOL_OPTIONAL,
    RecordKind.timings: REQUIRED[RecordKind.timings] + ("start_ts",),
    RecordKind.labels: REQUIRED[RecordKind.labels] + ("label_ts",),
    RecordKind.reference: ("label", "prediction"),
}
# Fields whose values a source's `values:` map may respell (besides categorical features and segments).
VALUE_FIELDS: dict[RecordKind, tuple[str, ...]] = {
    RecordKind.predictions: ("model_version", "status") + STRING_OPTIONAL + BOOL_OPTIONAL,
    RecordKind.timings: ("stage",),
    RecordKind.labels: ("label",),
    RecordKind.reference: ("label", "prediction"),
}
TIMESTAMPS = ("ts", "start_ts", "label_ts")
# Fields whose values are durations in milliseconds.
DURATIONS = ("duration_ms", "latency_ms", "ttft_ms")


class Reason(StrEnum):
    """Why a row was quarantined; one code per row, the first that applies in this order."""

    oversize_line = "oversize_line"  # a line longer than limits.max_line_bytes, passed over unparsed
    invalid_encoding = "invalid_encoding"  # bytes that are not UTF-8
    unparseable = "unparseable"  # not a JSON object / CSV row of the header's width
    oversize_field = "oversize_field"  # a line or field longer than limits.max_field_chars, or JSON nested > 64 deep
    missing_field = "missing_field"  # a required field absent or null
    wrong_type = "wrong_type"  # a value that does not convert to its declared type
    bad_timestamp = "bad_timestamp"  # before limits.min_ts (negative or absurd epoch)
    future_timestamp = "future_timestamp"  # later than now + limits.max_future
    unknown_status = "unknown_status"  # status not one of STATUSES (after the source's `values:` map)
    bad_duration = "bad_duration"  # NaN, infinite or negative duration_ms
    orphan_timing = "orphan_timing"  # a stage timing whose prediction never arrived within join.lateness
    late_timing = "late_timing"  # a stage timing of a request folded more than join.lateness before it was read
    orphan_label = "orphan_label"  # a label whose prediction never arrived within quality.label_horizon
    unknown_label = "unknown_label"  # a label that is not one of schema.classes
    source_error = "source_error"  # a file that could not be listed or read (its path and the OS error)


EXCERPT_CHARS = 200
RAW_BYTES = 2048  # of a rejected line kept as it was written


@dataclass(frozen=True)
class Reject:
    """One row that broke the contract: where it was, why, the field that broke it (its contract name;
    for `missing_field` every required field it lacks, "ts, status"; None when the row as a whole did),
    the start of what it said, and the bytes of its line as written."""

    position: str  # "<file>:<line>" for text files, "<file>:row <n>" for Parquet, "<table>:<cursor>" for SQL
    reason: Reason
    excerpt: str  # at most EXCERPT_CHARS characters
    field: str | None = None
    raw: bytes | None = None  # at most RAW_BYTES; None for rows that were not lines (Parquet, SQL, spans)


def excerpt(raw: bytes | str) -> str:
    """The first EXCERPT_CHARS characters of a raw row, undecodable bytes replaced."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes | bytearray) else str(raw)
    return text[:EXCERPT_CHARS]
