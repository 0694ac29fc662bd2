"""SQLAlchemy models: the tables of migration 0001 and the column types they share.

All datetimes are timezone-aware UTC in Python; JSON columns are stored as text so SQLite and
PostgreSQL hold byte-for-byte the same documents.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from storage.jsontext import dumps

# Deterministic constraint names, so migrations can name (and later alter) every one of them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

EXCERPT_MAX_CHARS = 512

# 64-bit ids on PostgreSQL; SQLite only autoincrements an INTEGER PRIMARY KEY (already 64-bit there).
BigId = BigInteger().with_variant(Integer, "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored as UTC; accepts aware datetimes only and returns aware UTC datetimes."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f"expected a datetime, got {type(value).__name__}")
        if value.tzinfo is None or value.utcoffset() is None:
            # A naive datetime is ambiguous (local? UTC?); refusing it keeps every stored instant exact.
            raise ValueError(f"naive datetime {value.isoformat()} given; pass a timezone-aware datetime")
        value = value.astimezone(UTC)
        if isinstance(value, datetime) and type(value) is not datetime:
            # pandas.Timestamp and friends: store the plain datetime the driver understands.
            value = datetime(
                value.year, value.month, value.day, value.hour, value.minute, value.second,
                value.microsecond, tzinfo=UTC,
            )
        # SQLite has no timezone type: it keeps the UTC wall time, read back as UTC below.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # raw text written by something other than SQLAlchemy
            value = datetime.fromisoformat(value)
        elif isinstance(value, date) and not isinstance(value, datetime):
            value = datetime(value.year, value.month, value.day)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class JSONText(TypeDecorator[Any]):
    """A JSON document stored as TEXT (canonical form, so equal documents compare equal)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        return None if value is None else dumps(value)

    def process_result_value(self, value: str | None, dialect: Any) -> Any:
        return None if value is None else json.loads(value)


def finite_or_none(value: float | None) -> float | None:
    """NaN becomes None: SQLite would store NaN as NULL anyway, PostgreSQL would keep it."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class SourceOffset(Base):
    """How far one input file (or SQL source) has been consumed."""

    __tablename__ = "source_offsets"

    source: Mapped[str] = mapped_column(String, primary_key=True)
    file_key: Mapped[str] = mapped_column(String, primary_key=True)
    path: Mapped[str] = mapped_column(String, nullable=False)
    offset: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)  # bytes consumed
    line: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)  # lines/rows consumed
    cursor: Mapped[str | None] = mapped_column(String, nullable=True)  # SQL sources' monotonic column
    fingerprint: Mapped[str | None] = mapped_column(String, nullable=True)
    size: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    tail: Mapped[str | None] = mapped_column(String, nullable=True)  # a hash of the last bytes read
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class Tick(Base):
    """One run of the pipeline for one service."""

    __tablename__ = "ticks"
    __table_args__ = (Index(None, "service", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    service: Mapped[str] = mapped_column(String, nullable=False)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    now: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)  # the injected clock
    status: Mapped[str] = mapped_column(String, nullable=False)  # running | ok | error
    rows_read: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0, server_default="0")
    accepted: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0, server_default="0")
    quarantined: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0, server_default="0")
    joined: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0, server_default="0")
    unmatched: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0, server_default="0")
    duplicates: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0, server_default="0")
    summary: Mapped[Any] = mapped_column(JSONText, nullable=True)


class BucketPartial(Base):
    """The mergeable partial aggregate of one event-time bucket (payload format owned by the caller)."""

    __tablename__ = "bucket_partials"

    service: Mapped[str] = mapped_column(String, primary_key=True)
    model_version: Mapped[str] = mapped_column(String, primary_key=True)
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    bucket_seconds: Mapped[int] = mapped_column(Integer, primary_key=True)
    segment: Mapped[str] = mapped_column(String, primary_key=True)  # '' = all rows
    rows: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class FindingRow(Base):
    """One check result for one window and label set; rewritten in place when re-scored."""

    __tablename__ = "findings"
    __table_args__ = (
        UniqueConstraint(
            "service", "check", "model_version", "window_start", "window_end", "labels_key",
            name="uq_findings_identity",
        ),
        Index(None, "service", "window_start"),
        Index(None, "service", "check", "window_start"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tick_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("ticks.id", ondelete="SET NULL"), nullable=True
    )
    service: Mapped[str] = mapped_column(String, nullable=False)
    check: Mapped[str] = mapped_column(String, nullable=False)
    model_version: Mapped[str] = mapped_column(String, nullable=False)
    window_start: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    window_end: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    labels_key: Mapped[str] = mapped_column(String, nullable=False)
    labels: Mapped[Any] = mapped_column(JSONText, nullable=True)
    status: Mapped[str] = mapped_column(String, nullable=False)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    baseline: Mapped[float | None] = mapped_column(Float, nullable=True)
    effect: Mapped[float | None] = mapped_column(Float, nullable=True)
    interval_low: Mapped[float | None] = mapped_column(Float, nullable=True)
    interval_high: Mapped[float | None] = mapped_column(Float, nullable=True)
    p_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    n: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    detail: Mapped[Any] = mapped_column(JSONText, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class AlertState(Base):
    """The evaluator state of one alert identity (fingerprint of its sorted labels)."""

    __tablename__ = "alert_state"

    fingerprint: Mapped[str] = mapped_column(String, primary_key=True)
    labels: Mapped[Any] = mapped_column(JSONText, nullable=True)
    state: Mapped[str] = mapped_column(String, nullable=False)
    active_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    fired_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_eval_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    annotations: Mapped[Any] = mapped_column(JSONText, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    # Added by migration 0004:
    service: Mapped[str | None] = mapped_column(String, nullable=True)
    alertname: Mapped[str | None] = mapped_column(String, nullable=True)
    last_active_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)  # for keep_firing_for
    keep_firing_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    group_fingerprint: Mapped[str | None] = mapped_column(String, nullable=True)


class Outbox(Base):
    """A notification written before it is sent; a channel outage delays it, never loses it."""

    __tablename__ = "outbox"
    __table_args__ = (Index(None, "status", "next_attempt_at"), Index(None, "incident_id"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    dedup_key: Mapped[str] = mapped_column(String, nullable=False, unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    channel: Mapped[str] = mapped_column(String, nullable=False)
    payload: Mapped[Any] = mapped_column(JSONText, nullable=True)
    status: Mapped[str] = mapped_column(String, nullable=False, default="pending")  # pending|sent|failed
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_error: Mapped[str | None] = mapped_column(String, nullable=True)
    external_id: Mapped[str | None] = mapped_column(String, nullable=True)  # e.g. Slack message ts
    # Added by migration 0004: which incident, and post | update | reply.
    incident_id: Mapped[int | None] = mapped_column(BigId, nullable=True)
    kind: Mapped[str | None] = mapped_column(String, nullable=True)


class QuarantineRow(Base):
    """One input row that broke the data contract, with where it came from and why."""

    __tablename__ = "quarantine"
    __table_args__ = (Index(None, "service", "reason"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tick_id: Mapped[int | None] = mapped_column(BigId, nullable=True)
    service: Mapped[str] = mapped_column(String, nullable=False)
    kind: Mapped[str] = mapped_column(String, nullable=False)  # predictions|timings|labels|reference
    source: Mapped[str] = mapped_column(String, nullable=False)
    position: Mapped[str] = mapped_column(String, nullable=False)  # e.g. "file.jsonl:123"
    reason: Mapped[str] = mapped_column(String, nullable=False)  # monitor.contract.Reason code
    excerpt: Mapped[str] = mapped_column(String, nullable=False, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    field: Mapped[str | None] = mapped_column(String, nullable=True)  # the contract field that broke it
    raw: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)  # its line as written, bounded


class JoinPending(Base):
    """Rows waiting for their timings or labels to arrive: one Parquet blob per service and kind."""

    __tablename__ = "join_pending"
    __table_args__ = (Index(None, "service", "kind"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    service: Mapped[str] = mapped_column(String, nullable=False)
    kind: Mapped[str] = mapped_column(String, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    rows: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class ReferenceProfile(Base):
    """The reference profile (bins, ranges, categories) a service's window checks compare with."""

    __tablename__ = "reference_profiles"

    service: Mapped[str] = mapped_column(String, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String, nullable=False)
    source: Mapped[str] = mapped_column(String, nullable=False)  # the reference file it was built from
    rows: Mapped[int] = mapped_column(BigInteger, nullable=False)
    built_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    profile: Mapped[str] = mapped_column(Text, nullable=False)  # Profile.to_json()


# --- labels and quality (migration 0003) ---


class ScoredPrediction(Base):
    """What quality needs of one prediction, kept until its label arrives: written at ingest for services
    with a `quality` section. `attrs` holds only the segment, group and input-length values groups use."""

    __tablename__ = "scored_predictions"
    __table_args__ = (Index(None, "service", "ts"),)

    service: Mapped[str] = mapped_column(String, primary_key=True)
    request_id: Mapped[str] = mapped_column(String, primary_key=True)
    model_version: Mapped[str] = mapped_column(String, primary_key=True)  # shadow versions share ids
    ts: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)  # prediction time: windows by this
    status: Mapped[str] = mapped_column(String, nullable=False)
    prediction: Mapped[str | None] = mapped_column(String, nullable=True)
    scores: Mapped[Any] = mapped_column(JSONText, nullable=True)  # {class: score}
    attrs: Mapped[Any] = mapped_column(JSONText, nullable=True)  # {column: value}


class LabelRow(Base):
    """The latest label of one request; `changes` counts later labels that said something else."""

    __tablename__ = "labels"
    __table_args__ = (Index(None, "service", "first_seen"),)

    service: Mapped[str] = mapped_column(String, primary_key=True)
    request_id: Mapped[str] = mapped_column(String, primary_key=True)
    label: Mapped[str] = mapped_column(String, nullable=False)
    label_ts: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)  # the tick clock when first read
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)  # tick clock of the last change
    changes: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")



# --- verdicts, alerts, silences and notifications (migration 0004) ---


class VerdictRow(Base):
    """The verdict of one model version on one window: slower / worse / both / drift / healthy /
    insufficient_data / no_data, with its evidence, attribution and next steps; rewritten when re-scored."""

    __tablename__ = "verdicts"
    __table_args__ = (
        UniqueConstraint("service", "model_version", "window_start", "window_end", name="uq_verdicts_identity"),
        Index(None, "service", "window_end"),
        Index(None, "incident_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    service: Mapped[str] = mapped_column(String, nullable=False)
    model_version: Mapped[str] = mapped_column(String, nullable=False)
    window_start: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    window_end: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    verdict: Mapped[str] = mapped_column(String, nullable=False)
    estimated: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    rows: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0, server_default="0")
    evidence: Mapped[Any] = mapped_column(JSONText, nullable=True)  # [{check, labels, value, baseline, n, ...}]
    attribution: Mapped[Any] = mapped_column(JSONText, nullable=True)  # {stages: {stage: share}, signals: [...]}
    what_changed: Mapped[Any] = mapped_column(JSONText, nullable=True)  # [{kind, value, first_seen, text}]
    next_steps: Mapped[Any] = mapped_column(JSONText, nullable=True)  # [str]
    rollback_to: Mapped[str | None] = mapped_column(String, nullable=True)
    summary: Mapped[str] = mapped_column(String, nullable=False, default="", server_default="")
    incident_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("incidents.id", ondelete="SET NULL"), nullable=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class Incident(Base):
    """One notification group's life from its first firing alert to its resolution (one Slack thread)."""

    __tablename__ = "incidents"
    __table_args__ = (Index(None, "service", "status"), Index(None, "fingerprint", "status"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    service: Mapped[str] = mapped_column(String, nullable=False)
    model_version: Mapped[str | None] = mapped_column(String, nullable=True)
    verdict: Mapped[str] = mapped_column(String, nullable=False)  # or the alertname (no_data, tick_error, a rule)
    status: Mapped[str] = mapped_column(String, nullable=False)  # open | resolved
    opened_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    first_window_start: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_window_end: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    fingerprint: Mapped[str] = mapped_column(String, nullable=False)  # of the group's label set
    group_labels: Mapped[Any] = mapped_column(JSONText, nullable=True)
    summary: Mapped[Any] = mapped_column(JSONText, nullable=True)  # what the last notification said
    revision: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    notified_hash: Mapped[str | None] = mapped_column(String, nullable=True)  # content last notified
    last_notified_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    channel: Mapped[str | None] = mapped_column(String, nullable=True)
    slack_ts: Mapped[str | None] = mapped_column(String, nullable=True)  # the thread's parent message
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class Silence(Base):
    """Mutes notifications of every alert whose labels match all `matchers` between starts_at and ends_at."""

    __tablename__ = "silences"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    matchers: Mapped[Any] = mapped_column(JSONText, nullable=False)  # [{name, value, op: = != =~ !~}]
    created_by: Mapped[str] = mapped_column(String, nullable=False)
    comment: Mapped[str] = mapped_column(String, nullable=False, default="")
    starts_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ends_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class AlertCursor(Base):
    """The last tick of a service whose findings have been turned into verdicts."""

    __tablename__ = "alert_cursors"

    service: Mapped[str] = mapped_column(String, primary_key=True)
    last_tick_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class VersionSeen(Base):
    """When a version (model_version, preprocess_version, config_hash ...) of a service was first seen."""

    __tablename__ = "versions_seen"

    service: Mapped[str] = mapped_column(String, primary_key=True)
    kind: Mapped[str] = mapped_column(String, primary_key=True)  # model_version | preprocess_version | ...
    value: Mapped[str] = mapped_column(String, primary_key=True)
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)  # event time (bucket start)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)



class VersionAccepted(Base):
    """A version value (model_version, preprocess_version, config_hash) accepted as good (`tailwatch
    accept`): from then on its windows are compared with its own history, not with the version before it."""

    __tablename__ = "versions_accepted"

    service: Mapped[str] = mapped_column(String, primary_key=True)
    value: Mapped[str] = mapped_column(String, primary_key=True)
    accepted_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    accepted_by: Mapped[str] = mapped_column(String, nullable=False, default="", server_default="")
    comment: Mapped[str] = mapped_column(String, nullable=False, default="", server_default="")


# --- operations (migration 0005) ---


class DaemonHeartbeat(Base):
    """The last sign of life of one daemon process (`host:pid`), leader or follower."""

    __tablename__ = "daemon_heartbeats"

    instance: Mapped[str] = mapped_column(String, primary_key=True)
    role: Mapped[str] = mapped_column(String, nullable=False)  # leader | follower
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    beat_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    last_tick_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_tick_status: Mapped[str | None] = mapped_column(String, nullable=True)


class JobEvent(Base):
    """A scheduled job that failed, or a run the scheduler missed: what the alert stage raises an
    `error` alert from."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_at", "at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    job: Mapped[str] = mapped_column(String, nullable=False)  # tick | nightly | tick:<stage> | ...
    kind: Mapped[str] = mapped_column(String, nullable=False)  # error | missed
    instance: Mapped[str] = mapped_column(String, nullable=False)
    message: Mapped[str] = mapped_column(String, nullable=False, default="", server_default="")


class BackfillProgress(Base):
    """One `tailwatch backfill` run: its clock range and the last step it completed."""

    __tablename__ = "backfill_progress"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    since: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    until: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    step_seconds: Mapped[int] = mapped_column(Integer, nullable=False)
    reached: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)  # clock of the last step done
    status: Mapped[str] = mapped_column(String, nullable=False)  # running | done
    staging: Mapped[str] = mapped_column(String, nullable=False)  # directory of the replayed files
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


# --- leader lock (migration 0010) ---

# The view the PostgreSQL leader holds locked in SHARE UPDATE EXCLUSIVE mode (storage.lock); a view, so that
# VACUUM, ANALYZE and pg_dump never wait for it. Neither it nor leader_fence is granted to the SQL reader.
LEADER_LOCK_VIEW = "leader_lock"


class LeaderFence(Base):
    """The leadership term (one row, PostgreSQL only): each leader transaction holds it FOR SHARE; a new
    leader increments it, which waits for the old leader's open transactions."""

    __tablename__ = "leader_fence"
    __table_args__ = {"info": {"leader": True}}  # left out of table_names(): never granted to the reader

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    term: Mapped[int] = mapped_column(BigInteger, nullable=False)
