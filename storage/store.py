"""The store: engine, migrations, transactions, and the reads and writes the pipeline needs.

Every method that touches data takes the Session of a `Store.transaction()`, so one tick's offsets,
partials, findings and quarantine commit together or not at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, delete, event, func, insert, select, update
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from storage.models import (
    EXCERPT_MAX_CHARS,
    BucketPartial,
    FindingRow,
    JoinPending,
    QuarantineRow,
    ReferenceProfile,
    SourceOffset,
    Tick,
    finite_or_none,
    labels_key,
)

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_S = 10

TICK_STATUSES = ("running", "ok", "error")
TICK_COUNTS = ("rows_read", "accepted", "quarantined", "joined", "unmatched", "duplicates")
FINDING_REQUIRED = ("service", "check", "model_version", "window_start", "window_end", "status")
FINDING_OPTIONAL = (
    "tick_id", "labels", "labels_key", "value", "baseline", "effect", "interval_low", "interval_high",
    "p_value", "n", "detail", "created_at",
)
FINDING_FLOATS = ("value", "baseline", "effect", "interval_low", "interval_high", "p_value")


class StoreError(RuntimeError):
    """The database cannot be reached or used; the message never contains a password."""


class SchemaError(StoreError):
    """The database schema is missing, behind, or newer than this tailwatch."""


@dataclass(frozen=True, slots=True)
class OffsetState:
    """How far one file (or SQL source) has been read: bytes, lines/rows, and the SQL cursor."""

    file_key: str
    path: str
    offset: int = 0
    line: int = 0
    cursor: str | None = None
    fingerprint: str | None = None
    size: int | None = None


@dataclass(frozen=True, slots=True)
class PartialRow:
    """One bucket's partial aggregate for one model version and segment ('' = all rows)."""

    model_version: str
    bucket_start: datetime
    bucket_seconds: int
    segment: str
    rows: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class TickRecord:
    """A stored tick: when it ran, against which clock, how it ended, and its row counts."""

    id: int
    service: str
    started_at: datetime
    finished_at: datetime | None
    now: datetime
    status: str
    counts: dict[str, int]
    summary: Any


def utc(value: datetime) -> datetime:
    """An aware datetime as a plain UTC `datetime` (so it hashes like the values read back)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value.isoformat()} given; pass a timezone-aware datetime")
    value = value.astimezone(UTC)
    return datetime(
        value.year, value.month, value.day, value.hour, value.minute, value.second, value.microsecond,
        tzinfo=UTC,
    )


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Store:
    """A tailwatch database (SQLite file or PostgreSQL) and the operations the pipeline runs on it."""

    def __init__(
        self,
        url: str,
        password: str | None = None,
        *,
        connect_args: dict[str, Any] | None = None,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self._secrets = [password] if password else []
        try:
            parsed = make_url(url)
        except Exception:
            # make_url's own message quotes the whole string, password included.
            parsed = None
        if parsed is None:
            raise StoreError("cannot parse the database URL (not shown: it may hold a password)")
        if parsed.password:
            self._secrets.append(str(parsed.password))
        if password is not None:
            parsed = parsed.set(password=password)
        self.url: URL = parsed
        self.safe_url = parsed.render_as_string(hide_password=True)
        self.clock = clock
        self.engine = self._create_engine(connect_args or {})
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def __repr__(self) -> str:
        return f"Store({self.safe_url!r})"

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    # -- engine and connections ---------------------------------------------------------------

    def _create_engine(self, connect_args: dict[str, Any]) -> Engine:
        url = self.url
        error = None
        try:
            if url.get_backend_name() == "sqlite":
                engine = self._create_sqlite(url, connect_args)
            else:
                if url.get_backend_name() == "postgresql":
                    # A tick must fail fast on a dead server rather than hang on connect.
                    connect_args = {"connect_timeout": PG_CONNECT_TIMEOUT_S, **connect_args}
                engine = create_engine(url, connect_args=connect_args, pool_pre_ping=True)
        except Exception as exc:
            error = self._scrub(exc)
        if error is not None:
            raise StoreError(f"cannot create an engine for {self.safe_url}: {error}")
        return engine

    @staticmethod
    def _create_sqlite(url: URL, connect_args: dict[str, Any]) -> Engine:
        database = url.database or ""
        is_uri = str(url.query.get("uri", "")).lower() in ("true", "1")
        if database and database != ":memory:" and not database.startswith("file:") and not is_uri:
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args=connect_args)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # pysqlite's own transaction handling skips BEGIN before SELECTs; take control of it so a
            # read-then-write upsert sees one snapshot (the SQLAlchemy-documented recipe).
            dbapi_conn.isolation_level = None
            cursor = dbapi_conn.cursor()
            try:
                cursor.execute("PRAGMA journal_mode=WAL")  # readers (CLI) never block the daemon
                cursor.execute("PRAGMA foreign_keys=ON")
                cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            finally:
                cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN")

        return engine

    def _scrub(self, exc: BaseException | str) -> str:
        """An error message on one line, with any password replaced by ***."""
        if isinstance(exc, DBAPIError) and exc.orig is not None:
            text = f"{type(exc.orig).__name__}: {exc.orig}"
        elif isinstance(exc, BaseException):
            text = f"{type(exc).__name__}: {exc}"
        else:
            text = exc
        for secret in self._secrets:
            for form in {secret, quote(secret, safe=""), quote_plus(secret)}:
                text = text.replace(form, "***")
        return " ".join(text.split())

    def _connect(self) -> Connection:
        error = None
        try:
            return self.engine.connect()
        except Exception as exc:
            error = self._scrub(exc)
        # Raised outside the except block so the driver's exception is not chained (__context__).
        raise StoreError(f"cannot connect to {self.safe_url}: {error}")

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A Session that commits when the block ends and rolls back if it raises."""
        session = self._sessions()
        error = None
        try:
            session.connection()  # connect now, so a dead server fails here with a clean message
        except Exception as exc:
            error = self._scrub(exc)
        if error is not None:
            session.close()
            raise StoreError(f"cannot connect to {self.safe_url}: {error}")
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    # -- migrations ---------------------------------------------------------------------------

    def _alembic_config(self) -> Config:
        cfg = Config()
        # Found from the installed package, never from the cwd; % is configparser's escape.
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
        return cfg

    def upgrade(self, revision: str = "head") -> None:
        """Apply migrations up to `revision` (default: the newest this code knows)."""
        cfg = self._alembic_config()
        with self._connect() as conn, conn.begin():
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)

    def stamp(self, revision: str) -> None:
        """Record `revision` as applied without running anything (repairs, tests)."""
        with self._connect() as conn, conn.begin():
            MigrationContext.configure(conn).stamp(ScriptDirectory.from_config(self._alembic_config()), revision)

    def current_revision(self) -> str | None:
        """The revision the database is at; None when it has no tailwatch schema."""
        with self._connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def head_revision(self) -> str:
        """The newest revision this code knows."""
        head = ScriptDirectory.from_config(self._alembic_config()).get_current_head()
        if head is None:
            raise StoreError(f"no migrations found in {MIGRATIONS_DIR}")
        return head

    def ensure_current(self) -> None:
        """Raise SchemaError unless the database is exactly at this code's head revision."""
        current = self.current_revision()
        script = ScriptDirectory.from_config(self._alembic_config())
        head = script.get_current_head()
        if current == head:
            return
        if current is None:
            raise SchemaError(f"database {self.safe_url} has no tailwatch schema; run `tailwatch db upgrade`")
        known = {rev.revision for rev in script.walk_revisions()}
        if current not in known:
            raise SchemaError(
                f"database {self.safe_url} is at revision {current}, newer than this tailwatch "
                f"(knows up to {head}); upgrade tailwatch"
            )
        raise SchemaError(
            f"database {self.safe_url} is at revision {current}, behind {head}; run `tailwatch db upgrade`"
        )

    # -- offsets ------------------------------------------------------------------------------

    def load_offsets(self, session: Session, source: str) -> dict[str, OffsetState]:
        """Every stored offset of `source`, by file key (empty for a new source)."""
        rows = session.scalars(select(SourceOffset).where(SourceOffset.source == source)).all()
        return {
            r.file_key: OffsetState(r.file_key, r.path, r.offset, r.line, r.cursor, r.fingerprint, r.size)
            for r in rows
        }

    def save_offsets(self, session: Session, source: str, states: Iterable[OffsetState]) -> None:
        """Insert or overwrite the offsets of `source` for the given files."""
        by_key = {s.file_key: s for s in states}
        if not by_key:
            return
        existing = set(
            session.scalars(select(SourceOffset.file_key).where(SourceOffset.source == source)).all()
        )
        now = self.clock()
        values = [
            {
                "source": source, "file_key": s.file_key, "path": s.path, "offset": int(s.offset),
                "line": int(s.line), "cursor": s.cursor, "fingerprint": s.fingerprint,
                "size": None if s.size is None else int(s.size),
                "updated_at": now,
            }
            for s in by_key.values()
        ]
        updates = [v for v in values if v["file_key"] in existing]
        inserts = [v for v in values if v["file_key"] not in existing]
        if updates:
            session.execute(update(SourceOffset), updates)
        if inserts:
            session.execute(insert(SourceOffset), inserts)

    # -- ticks --------------------------------------------------------------------------------

    def start_tick(self, session: Session, service: str, now: datetime) -> int:
        """Record a tick as running against clock `now`; returns its id."""
        tick = Tick(service=service, started_at=self.clock(), now=now, status="running")
        session.add(tick)
        session.flush()
        return tick.id

    def finish_tick(
        self, session: Session, tick_id: int, status: str, counts: dict[str, int], summary: Any
    ) -> None:
        """Close a tick with its final status ('ok' or 'error'), row counts and JSON summary."""
        if status not in TICK_STATUSES:
            raise ValueError(f"tick status {status!r} is not one of {TICK_STATUSES}")
        unknown = set(counts) - set(TICK_COUNTS)
        if unknown:
            raise ValueError(f"unknown tick counts {sorted(unknown)}; known: {TICK_COUNTS}")
        tick = session.get(Tick, tick_id)
        if tick is None:
            raise LookupError(f"no tick with id {tick_id}")
        tick.status = status
        tick.finished_at = self.clock()
        for name, value in counts.items():
            setattr(tick, name, int(value))
        tick.summary = summary
        session.flush()

    def last_ticks(self, session: Session, service: str, limit: int = 10) -> list[TickRecord]:
        """The `limit` most recent ticks of `service`, newest first."""
        rows = session.scalars(
            select(Tick).where(Tick.service == service).order_by(Tick.id.desc()).limit(limit)
        ).all()
        return [
            TickRecord(
                id=t.id, service=t.service, started_at=t.started_at, finished_at=t.finished_at, now=t.now,
                status=t.status, counts={name: getattr(t, name) for name in TICK_COUNTS}, summary=t.summary,
            )
            for t in rows
        ]

    # -- bucket partials ----------------------------------------------------------------------

    def upsert_partials(
        self,
        session: Session,
        service: str,
        rows: list[PartialRow],
        merge: Callable[[bytes, bytes], bytes],
    ) -> None:
        """Add partials: a stored key gets merge(stored, new) and summed rows; a new key is inserted."""
        batch: dict[tuple[str, datetime, int, str], PartialRow] = {}
        for row in rows:
            key = (row.model_version, utc(row.bucket_start), int(row.bucket_seconds), row.segment)
            prev = batch.get(key)
            batch[key] = row if prev is None else replace(
                prev, rows=prev.rows + row.rows, payload=merge(prev.payload, row.payload)
            )
        if not batch:
            return
        starts = [k[1] for k in batch]
        # One SELECT for every possibly-stored key: the batch's bounding box, matched in Python.
        # A range (not an IN of tuples) keeps the bind-parameter count flat for any batch size.
        stored = session.execute(
            select(
                BucketPartial.model_version, BucketPartial.bucket_start, BucketPartial.bucket_seconds,
                BucketPartial.segment, BucketPartial.rows, BucketPartial.payload,
            ).where(
                BucketPartial.service == service,
                BucketPartial.model_version.in_({k[0] for k in batch}),
                BucketPartial.bucket_start >= min(starts),
                BucketPartial.bucket_start <= max(starts),
                BucketPartial.bucket_seconds.in_({k[2] for k in batch}),
                BucketPartial.segment.in_({k[3] for k in batch}),
            )
        ).all()
        old = {(r[0], utc(r[1]), r[2], r[3]): (r[4], r[5]) for r in stored}
        now = self.clock()
        updates, inserts = [], []
        for key, row in batch.items():
            values = {
                "service": service, "model_version": key[0], "bucket_start": key[1],
                "bucket_seconds": key[2], "segment": key[3], "updated_at": now,
            }
            if key in old:
                old_rows, old_payload = old[key]
                merged = merge(old_payload, row.payload)
                updates.append({**values, "rows": old_rows + int(row.rows), "payload": merged})
            else:
                inserts.append({**values, "rows": int(row.rows), "payload": row.payload})
        if updates:
            session.execute(update(BucketPartial), updates)
        if inserts:
            session.execute(insert(BucketPartial), inserts)

    def load_partials(
        self,
        session: Session,
        service: str,
        since: datetime,
        until: datetime,
        model_version: str | None = None,
        bucket_seconds: int | None = None,
        segment: str | None = None,
    ) -> list[PartialRow]:
        """Partials of `service` with bucket_start in [since, until), oldest first; empty if none."""
        query = select(BucketPartial).where(
            BucketPartial.service == service,
            BucketPartial.bucket_start >= since,
            BucketPartial.bucket_start < until,
        )
        if model_version is not None:
            query = query.where(BucketPartial.model_version == model_version)
        if bucket_seconds is not None:
            query = query.where(BucketPartial.bucket_seconds == bucket_seconds)
        if segment is not None:
            query = query.where(BucketPartial.segment == segment)
        query = query.order_by(
            BucketPartial.bucket_start, BucketPartial.model_version, BucketPartial.bucket_seconds,
            BucketPartial.segment,
        )
        return [
            PartialRow(p.model_version, p.bucket_start, p.bucket_seconds, p.segment, p.rows, p.payload)
            for p in session.scalars(query)
        ]

    # -- quarantine ---------------------------------------------------------------------------

    def add_quarantine(self, session: Session, rows: list[dict[str, Any]]) -> None:
        """Bulk-insert quarantined rows (keys: service, kind, source, position, reason; optional
        tick_id, excerpt (cut to 512 chars), created_at)."""
        if not rows:
            return
        now = self.clock()
        values = [
            {
                "tick_id": None if r.get("tick_id") is None else int(r["tick_id"]),
                "service": r["service"],
                "kind": str(r["kind"]),
                "source": r["source"],
                "position": str(r["position"]),
                "reason": str(r["reason"]),
                "excerpt": (r.get("excerpt") or "")[:EXCERPT_MAX_CHARS],
                "created_at": r.get("created_at") or now,
            }
            for r in rows
        ]
        session.execute(insert(QuarantineRow.__table__), values)

    def quarantine_counts(self, session: Session, service: str, tick_id: int | None = None) -> dict[str, int]:
        """Quarantined rows by reason code, for one tick or (tick_id None) all time."""
        query = select(QuarantineRow.reason, func.count()).where(QuarantineRow.service == service)
        if tick_id is not None:
            query = query.where(QuarantineRow.tick_id == tick_id)
        return {reason: int(n) for reason, n in session.execute(query.group_by(QuarantineRow.reason))}

    # -- join buffer --------------------------------------------------------------------------

    def load_pending(self, session: Session, service: str, kind: str) -> list[bytes]:
        """The Parquet blobs waiting to be joined for `service` and `kind`, oldest first."""
        query = (
            select(JoinPending.payload)
            .where(JoinPending.service == service, JoinPending.kind == kind)
            .order_by(JoinPending.id)
        )
        return list(session.scalars(query))

    def replace_pending(
        self, session: Session, service: str, kind: str, payload: bytes | None, rows: int
    ) -> None:
        """Replace the waiting rows of `service`/`kind` by one blob (or by nothing when None)."""
        session.execute(delete(JoinPending).where(JoinPending.service == service, JoinPending.kind == kind))
        if payload is not None:
            session.add(
                JoinPending(service=service, kind=kind, created_at=self.clock(), rows=int(rows), payload=payload)
            )
            session.flush()

    # -- reference profiles ---------------------------------------------------------------------

    def save_profile(self, session: Session, service: str, fingerprint: str, source: str, rows: int,
                     profile_json: str) -> None:
        """Store (or replace) the reference profile of `service`."""
        row = session.get(ReferenceProfile, service)
        if row is None:
            row = ReferenceProfile(service=service)
            session.add(row)
        row.fingerprint, row.source, row.rows = fingerprint, source, int(rows)
        row.built_at, row.profile = self.clock(), profile_json
        session.flush()

    def load_profile(self, session: Session, service: str) -> ReferenceProfile | None:
        """The stored reference profile of `service`, or None when none was built."""
        return session.get(ReferenceProfile, service)

    # -- findings -----------------------------------------------------------------------------

    def upsert_findings(self, session: Session, rows: list[dict[str, Any]]) -> None:
        """Insert findings, or overwrite the stored one with the same service, check, model version,
        window and labels (created_at of the first write is kept). NaN floats are stored as NULL."""
        batch: dict[tuple[str, str, str, datetime, datetime, str], dict[str, Any]] = {}
        for raw in rows:
            missing = [k for k in FINDING_REQUIRED if raw.get(k) is None]
            unknown = set(raw) - set(FINDING_REQUIRED) - set(FINDING_OPTIONAL) - {"id"}
            if missing or unknown:
                raise ValueError(f"finding with missing fields {missing} / unknown fields {sorted(unknown)}")
            row = {k: raw.get(k) for k in FINDING_REQUIRED + FINDING_OPTIONAL}
            row["window_start"], row["window_end"] = utc(row["window_start"]), utc(row["window_end"])
            if row["labels"] is not None or row["labels_key"] is None:
                row["labels_key"] = labels_key(row["labels"])
            for name in FINDING_FLOATS:
                row[name] = finite_or_none(row[name])
            row["n"] = int(row["n"] or 0)
            key = (
                row["service"], row["check"], row["model_version"], row["window_start"], row["window_end"],
                row["labels_key"],
            )
            batch[key] = row  # within one call, the last write of a key wins
        if not batch:
            return
        starts = [k[3] for k in batch]
        stored = session.execute(
            select(
                FindingRow.id, FindingRow.service, FindingRow.check, FindingRow.model_version,
                FindingRow.window_start, FindingRow.window_end, FindingRow.labels_key,
            ).where(
                FindingRow.service.in_({k[0] for k in batch}),
                FindingRow.check.in_({k[1] for k in batch}),
                FindingRow.window_start >= min(starts),
                FindingRow.window_start <= max(starts),
            )
        ).all()
        ids = {(r[1], r[2], r[3], utc(r[4]), utc(r[5]), r[6]): r[0] for r in stored}
        now = self.clock()
        updates, inserts = [], []
        for key, row in batch.items():
            if key in ids:
                updates.append({**{k: v for k, v in row.items() if k != "created_at"}, "id": ids[key]})
            else:
                inserts.append({**row, "created_at": row["created_at"] or now})
        if updates:
            session.execute(update(FindingRow), updates)
        if inserts:
            session.execute(insert(FindingRow), inserts)

    def load_findings(
        self,
        session: Session,
        service: str,
        since: datetime | None = None,
        until: datetime | None = None,
        check: str | None = None,
        model_version: str | None = None,
    ) -> list[dict[str, Any]]:
        """Findings of `service` with window_start in [since, until), oldest first, as dicts with the
        keys upsert_findings takes plus id; empty if none."""
        query = select(FindingRow).where(FindingRow.service == service)
        if since is not None:
            query = query.where(FindingRow.window_start >= since)
        if until is not None:
            query = query.where(FindingRow.window_start < until)
        if check is not None:
            query = query.where(FindingRow.check == check)
        if model_version is not None:
            query = query.where(FindingRow.model_version == model_version)
        query = query.order_by(
            FindingRow.window_start, FindingRow.window_end, FindingRow.check, FindingRow.model_version,
            FindingRow.labels_key,
        )
        fields = ("id",) + FINDING_REQUIRED + FINDING_OPTIONAL
        return [{name: getattr(f, name) for name in fields} for f in session.scalars(query)]

    # --- labels and quality (issue 5) ---

    # --- verdicts, alerts, silences and notifications (issue 6) ---

    # --- operations: leader, heartbeat, retention (issue 7) ---
