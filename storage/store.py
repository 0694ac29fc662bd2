"""The store: engine, migrations, transactions, and the reads and writes the pipeline needs.

Every method that touches data takes the Session of a `Store.transaction()`, so one tick's offsets,
partials, findings and quarantine commit together or not at all.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from operator import itemgetter
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import (
    Connection,
    Engine,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from storage.models import (
    EXCERPT_MAX_CHARS,
    BucketPartial,
    FindingRow,
    Incident,
    JoinPending,
    QuarantineRow,
    ReferenceProfile,
    Silence,
    SourceOffset,
    Tick,
    VerdictRow,
    VersionAccepted,
    VersionSeen,
    finite_or_none,
    labels_key,
)
from storage.rows import PartialRow

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_S = 10
# The PostgreSQL role `tailwatch query sql` connects as (config: storage.query_sql.role): SELECT on tailwatch's
# tables and nothing else. A plain identifier, so it is quoted and checked the same way everywhere.
SQL_READER_ROLE = "tailwatch_reader"
SQL_READER_TIMEOUT = "30s"
_ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# Connection execution option that `transaction(durable=False)` sets (read by the SQLite begin hook).
_DURABLE = "tailwatch_durable"

TICK_STATUSES = ("running", "ok", "error")
TICK_COUNTS = ("rows_read", "accepted", "quarantined", "joined", "unmatched", "duplicates")
FINDING_REQUIRED = ("service", "check", "model_version", "window_start", "window_end", "status")
FINDING_OPTIONAL = (
    "tick_id", "labels", "labels_key", "value", "baseline", "effect", "interval_low", "interval_high",
    "p_value", "n", "detail", "created_at",
)
FINDING_FLOATS = ("value", "baseline", "effect", "interval_low", "interval_high", "p_value")
VERDICT_FIELDS = (
    "verdict", "estimated", "rows", "evidence", "attribution", "what_changed", "next_steps", "rollback_to",
    "summary", "incident_id",
)


_PARTIALS = BucketPartial.__table__
# upsert_partials' statements (see there). Expanding IN parameters: one cached statement for any batch.
_STORED_PARTIALS = select(
    _PARTIALS.c.model_version, _PARTIALS.c.bucket_start, _PARTIALS.c.bucket_seconds, _PARTIALS.c.segment,
    _PARTIALS.c.rows, _PARTIALS.c.payload,
).where(
    _PARTIALS.c.service == bindparam("service"),
    _PARTIALS.c.model_version.in_(bindparam("versions", expanding=True)),
    _PARTIALS.c.bucket_start >= bindparam("lo"),
    _PARTIALS.c.bucket_start <= bindparam("hi"),
    _PARTIALS.c.bucket_seconds.in_(bindparam("seconds", expanding=True)),
    _PARTIALS.c.segment.in_(bindparam("segments", expanding=True)),
)
_UPDATE_PARTIAL = update(_PARTIALS).where(
    _PARTIALS.c.service == bindparam("k_service"),
    _PARTIALS.c.model_version == bindparam("k_model_version"),
    _PARTIALS.c.bucket_start == bindparam("k_bucket_start"),
    _PARTIALS.c.bucket_seconds == bindparam("k_bucket_seconds"),
    _PARTIALS.c.segment == bindparam("k_segment"),
).values(rows=bindparam("rows"), payload=bindparam("payload"), updated_at=bindparam("updated_at"))
_INSERT_PARTIAL = insert(_PARTIALS)


class StoreError(RuntimeError):
    """The database cannot be reached or used; the message never contains a password."""


class SchemaError(StoreError):
    """The database schema is missing, behind, or newer than this tailwatch."""


_OFFSET_COLUMNS = ("source", "file_key", "path", "offset", "line", "cursor", "fingerprint", "size")


def _execute_many(session: Session, statement, names: tuple[str, ...], rows: list[tuple], stamp_column,
                  stamp: datetime) -> None:
    """Run `statement` once per row through the driver's executemany: `rows` hold the values of `names`, and
    `stamp_column` takes `stamp` in every row. Those values are text, integers or None, which no type
    converts: the stamp is converted once, not SQLAlchemy's per-row parameter processing (~50 us a row,
    seconds for many files)."""
    conn = session.connection()
    compiled = statement.compile(dialect=conn.dialect)
    convert = stamp_column.type.bind_processor(conn.dialect)
    value = convert(stamp) if convert else stamp
    columns = (*names, stamp_column.key)
    if compiled.positiontup is None:
        params = [dict(zip(columns, (*row, value), strict=True)) for row in rows]
    elif tuple(compiled.positiontup) == columns:
        params = [(*row, value) for row in rows]
    else:
        take = itemgetter(*(columns.index(k) for k in compiled.positiontup))
        params = [take((*row, value)) for row in rows]
    conn.exec_driver_sql(compiled.string, params)


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
        self._connect_args = dict(connect_args or {})
        self.engine = self._create_engine(self._connect_args)
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
            # WAL with FULL syncs the log at each commit; NORMAL leaves that to the next FULL commit or
            # checkpoint (see `transaction`). SQLite takes the level only outside a transaction.
            level = "FULL" if conn.get_execution_options().get(_DURABLE, True) else "NORMAL"
            if conn.info.get("synchronous") != level:
                conn.exec_driver_sql(f"PRAGMA synchronous={level}")
                conn.info["synchronous"] = level
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
    def transaction(self, durable: bool = True) -> Iterator[Session]:
        """A Session that commits when the block ends and rolls back if it raises.

        `durable=False`: the commit does not wait for the disk. It is still atomic and survives a crash of
        the process; only an OS crash or power cut can undo it, and then only together with every commit
        after it, up to the next durable commit (which makes it durable too). For work that is redone from
        what such a rollback leaves: a tick step commits its source offsets with its results.
        """
        session = self._sessions()
        error = None
        try:
            # Connect now, so a dead server fails here with a clean message.
            conn = session.connection(execution_options=None if durable else {_DURABLE: False})
        except Exception as exc:
            error = self._scrub(exc)
        if error is not None:
            session.close()
            raise StoreError(f"cannot connect to {self.safe_url}: {error}")
        try:
            if not durable and conn.dialect.name == "postgresql":
                conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")  # this transaction only
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

    def upgrade(self, revision: str = "head", *, sql_role: str | None = SQL_READER_ROLE) -> list[str]:
        """Apply migrations up to `revision` (default: the newest this code knows); on PostgreSQL also
        give `sql_role` (created when missing and this connection may create roles) SELECT on every
        tailwatch table. Returns what could not be done, for the operator (empty when all was)."""
        cfg = self._alembic_config()
        notes: list[str] = []
        with self._connect() as conn, conn.begin():
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            if sql_role is not None and conn.dialect.name == "postgresql":
                notes = self._grant_sql_reader(conn, sql_role)
        for note in notes:
            log.warning(note)
        return notes

    def _grant_sql_reader(self, conn: Connection, role: str) -> list[str]:
        """Create `role` if missing (LOGIN, no other attribute, read-only by default, statements bounded)
        and grant it USAGE on the tables' schema and SELECT on each tailwatch table; each step in a
        savepoint, so one the connection may not do is reported and the upgrade still commits."""
        from storage.models import Base

        if not _ROLE_NAME.match(role):
            raise StoreError(f"not a plain role name: {role!r} (lower-case letters, digits and _)")
        quote = conn.dialect.identifier_preparer.quote
        notes = []
        exists = conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).scalar()
        if not exists:
            may = conn.execute(text("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user")).scalar()
            if not may:
                return [f"role {role} does not exist and this connection may not create roles: `query sql` on "
                        f"PostgreSQL refuses to run until it does (the SQL to run is in docs/operations.md)"]
            with conn.begin_nested():
                # Another upgrade may create it at the same moment: the loser's error means "it exists".
                conn.exec_driver_sql(
                    f"DO $$ BEGIN CREATE ROLE {quote(role)} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT "
                    f"NOREPLICATION NOBYPASSRLS; "
                    f"ALTER ROLE {quote(role)} SET default_transaction_read_only = on; "
                    f"ALTER ROLE {quote(role)} SET statement_timeout = '{SQL_READER_TIMEOUT}'; "
                    f"EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$")
        schema = conn.execute(text("SELECT current_schema()")).scalar()
        tables = [t.name for t in Base.metadata.sorted_tables
                  if conn.execute(text("SELECT to_regclass(:t)"), {"t": t.name}).scalar() is not None]
        try:
            with conn.begin_nested():
                conn.exec_driver_sql(f"GRANT USAGE ON SCHEMA {quote(schema)} TO {quote(role)}")
                if tables:
                    conn.exec_driver_sql(f"GRANT SELECT ON {', '.join(quote(t) for t in tables)} TO {quote(role)}")
        except DBAPIError as exc:
            notes.append(f"cannot grant {role} SELECT on tailwatch's tables ({self._scrub(exc)}): `query sql` on "
                         f"PostgreSQL fails until it has it (the SQL to run is in docs/operations.md)")
        return notes

    @contextmanager
    def reader_connection(self, role: str, password: str | None = None) -> Iterator[Any]:
        """A new PostgreSQL connection (psycopg, not pooled) to this database as `role`, with this store's
        connect arguments (search_path included); closed when the block ends. StoreError when it fails."""
        secrets = [s for s in (*self._secrets, password) if s]
        url = self.url.set(username=role, password=password)
        engine = create_engine(url, poolclass=NullPool,
                               connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S, **self._connect_args})
        error = None
        try:
            conn = engine.connect()
        except Exception as exc:
            error = self._scrub(exc)
            for secret in secrets:
                error = error.replace(secret, "***")
        if error is not None:
            engine.dispose()
            raise StoreError(f"cannot connect to {self.safe_url} as {role}: {error}")
        try:
            yield conn.connection.driver_connection
        finally:
            conn.close()
            engine.dispose()

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
        # Plain rows, not ORM objects: a directory of many small files holds one row per file.
        c = SourceOffset.__table__.c
        rows = session.execute(select(c.file_key, c.path, c.offset, c.line, c.cursor, c.fingerprint, c.size)
                               .where(c.source == source)).all()
        return {r[0]: OffsetState(*r) for r in rows}

    def save_offsets(self, session: Session, source: str, states: Iterable[OffsetState]) -> None:
        """Insert or overwrite the offsets of `source` for the given files."""
        from sqlalchemy.dialects import postgresql, sqlite

        by_key = {s.file_key: s for s in states}
        if not by_key:
            return
        table = SourceOffset.__table__
        dialect = sqlite if session.get_bind().dialect.name == "sqlite" else postgresql
        # One upsert per file, new or known: no lookup of which keys are stored first.
        statement = dialect.insert(table)
        statement = statement.on_conflict_do_update(
            index_elements=[table.c.source, table.c.file_key],
            set_={k: statement.excluded[k] for k in ("path", "offset", "line", "cursor", "fingerprint", "size",
                                                    "updated_at")})
        _execute_many(session, statement, _OFFSET_COLUMNS, [
            (source, s.file_key, s.path, int(s.offset), int(s.line), s.cursor, s.fingerprint,
             None if s.size is None else int(s.size))
            for s in by_key.values()
        ], table.c.updated_at, self.clock())

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
        stored = session.execute(_STORED_PARTIALS, {
            "service": service, "versions": sorted({k[0] for k in batch}), "lo": min(starts), "hi": max(starts),
            "seconds": sorted({k[2] for k in batch}), "segments": sorted({k[3] for k in batch}),
        }).all()
        old = {(r[0], utc(r[1]), r[2], r[3]): (r[4], r[5]) for r in stored}
        now = self.clock()
        updates, inserts = [], []
        for key, row in batch.items():
            if key in old:
                old_rows, old_payload = old[key]
                updates.append({"k_service": service, "k_model_version": key[0], "k_bucket_start": key[1],
                                "k_bucket_seconds": key[2], "k_segment": key[3], "rows": old_rows + int(row.rows),
                                "payload": merge(old_payload, row.payload), "updated_at": now})
            else:
                inserts.append({"service": service, "model_version": key[0], "bucket_start": key[1],
                                "bucket_seconds": key[2], "segment": key[3], "rows": int(row.rows),
                                "payload": row.payload, "updated_at": now})
        # Core statements on the table, built once: a tick upserts a few rows, and the ORM's bulk
        # machinery (and building the statements anew) cost more than the rows themselves.
        if updates:
            session.execute(_UPDATE_PARTIAL, updates)
        if inserts:
            session.execute(_INSERT_PARTIAL, inserts)

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
        tick_id, excerpt (cut to 512 chars), created_at, field, raw (bytes))."""
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
                "field": r.get("field"),
                "raw": r.get("raw"),
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
        # The windows written, not the span between them: a tick writing an hour and its day would read
        # every finding of the day's other hours.
        stored = session.execute(
            select(
                FindingRow.id, FindingRow.service, FindingRow.check, FindingRow.model_version,
                FindingRow.window_start, FindingRow.window_end, FindingRow.labels_key,
            ).where(
                FindingRow.service.in_({k[0] for k in batch}),
                FindingRow.check.in_({k[1] for k in batch}),
                FindingRow.window_start.in_({k[3] for k in batch}),
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
        status: str | None = None,
    ) -> list[dict[str, Any]]:
        """Findings of `service` with window_start in [since, until) (and `status`, when given), oldest
        first, as dicts with the keys upsert_findings takes plus id; empty if none."""
        fields = ("id",) + FINDING_REQUIRED + FINDING_OPTIONAL
        # Columns, not ORM objects: a tick reads thousands of findings and only needs their values.
        query = select(*(getattr(FindingRow, name) for name in fields)).where(FindingRow.service == service)
        if since is not None:
            query = query.where(FindingRow.window_start >= since)
        if until is not None:
            query = query.where(FindingRow.window_start < until)
        if check is not None:
            query = query.where(FindingRow.check == check)
        if model_version is not None:
            query = query.where(FindingRow.model_version == model_version)
        if status is not None:
            query = query.where(FindingRow.status == status)
        query = query.order_by(
            FindingRow.window_start, FindingRow.window_end, FindingRow.check, FindingRow.model_version,
            FindingRow.labels_key,
        )
        return [dict(zip(fields, row, strict=True)) for row in session.execute(query)]

    # --- labels and quality ---

    @staticmethod
    def _parts(items: list, size: int) -> Iterator[list]:
        for i in range(0, len(items), size):
            yield items[i:i + size]

    def add_scored_predictions(self, session: Session, service: str, rows: list[dict[str, Any]]) -> int:
        """Insert scored predictions (keys: request_id, model_version, ts, status, prediction, scores,
        attrs); a (request_id, model_version) already stored keeps its first row. Returns rows given."""
        from sqlalchemy.dialects import postgresql, sqlite

        from storage.models import ScoredPrediction

        if not rows:
            return 0
        dialect = sqlite if session.get_bind().dialect.name == "sqlite" else postgresql
        values = [{**r, "service": service, "ts": utc(r["ts"])} for r in rows]
        for part in self._parts(values, 2000):
            session.execute(dialect.insert(ScoredPrediction).on_conflict_do_nothing(), part)
        return len(rows)

    def upsert_labels(self, session: Session, service: str, rows: list[dict[str, Any]],
                      now: datetime) -> tuple[list[str], list[str], int]:
        """Store labels (keys: request_id, label, label_ts or None) in arrival order: (request ids labelled
        for the first time, request ids whose label changed, repeats of the stored label). The latest wins
        (a label older by label_ts than the stored one does not replace it); a label that differs from the
        stored one counts as a change either way."""
        from storage.models import LabelRow

        fresh, changed, repeated = [], [], 0
        stored: dict[str, Any] = {}
        ids = list(dict.fromkeys(r["request_id"] for r in rows))
        for part in self._parts(ids, 500):
            query = select(LabelRow).where(LabelRow.service == service, LabelRow.request_id.in_(part))
            stored |= {r.request_id: r for r in session.scalars(query)}
        for r in rows:
            label_ts = None if r.get("label_ts") is None else utc(r["label_ts"])
            row = stored.get(r["request_id"])
            if row is None:
                row = LabelRow(service=service, request_id=r["request_id"], label=r["label"], label_ts=label_ts,
                               first_seen=now, updated_at=now, changes=0)
                session.add(row)
                stored[r["request_id"]] = row
                fresh.append(r["request_id"])
                continue
            older = label_ts is not None and row.label_ts is not None and label_ts < row.label_ts
            if r["label"] == row.label:
                repeated += 1
                if not older and label_ts is not None:
                    row.label_ts = label_ts
                continue
            row.changes += 1
            changed.append(r["request_id"])
            if not older:
                row.label, row.label_ts, row.updated_at = r["label"], label_ts, now
        session.flush()
        return fresh, changed, repeated

    def expire_labels(self, session: Session, service: str, cutoff: datetime) -> list[dict[str, Any]]:
        """Delete and return (as dicts) the labels first seen at or before `cutoff` whose request has no
        scored prediction: they waited their horizon in vain."""
        from storage.models import LabelRow, ScoredPrediction

        has_prediction = select(ScoredPrediction.request_id).where(
            ScoredPrediction.service == service, ScoredPrediction.request_id == LabelRow.request_id).exists()
        query = select(LabelRow).where(LabelRow.service == service, LabelRow.first_seen <= cutoff, ~has_prediction)
        expired = [{"request_id": r.request_id, "label": r.label, "label_ts": r.label_ts, "first_seen": r.first_seen}
                   for r in session.scalars(query)]
        for part in self._parts([e["request_id"] for e in expired], 500):
            session.execute(delete(LabelRow).where(LabelRow.service == service, LabelRow.request_id.in_(part)))
        return expired

    def prediction_times(self, session: Session, service: str, request_ids: list[str]) -> list[datetime]:
        """Prediction times of the scored predictions of `request_ids` (one per model version)."""
        from storage.models import ScoredPrediction

        out: list[datetime] = []
        for part in self._parts(list(dict.fromkeys(request_ids)), 500):
            out += session.scalars(select(ScoredPrediction.ts).where(
                ScoredPrediction.service == service, ScoredPrediction.request_id.in_(part))).all()
        return out

    def load_labelled(self, session: Session, service: str, since: datetime, until: datetime) -> list[tuple]:
        """Scored predictions with ts in [since, until), each with its label or None: tuples (request_id,
        model_version, ts, status, prediction, scores, attrs, label, label_changes), by ts."""
        from storage.models import LabelRow, ScoredPrediction

        sp = ScoredPrediction
        query = (
            select(sp.request_id, sp.model_version, sp.ts, sp.status, sp.prediction, sp.scores, sp.attrs,
                   LabelRow.label, LabelRow.changes)
            .outerjoin(LabelRow, (LabelRow.service == sp.service) & (LabelRow.request_id == sp.request_id))
            .where(sp.service == service, sp.ts >= since, sp.ts < until)
            .order_by(sp.ts, sp.request_id, sp.model_version)
        )
        return [tuple(r) for r in session.execute(query)]

    def scored_span(self, session: Session, service: str) -> tuple[datetime | None, datetime | None]:
        """The first and last prediction time of the stored scored predictions (None, None when none)."""
        from storage.models import ScoredPrediction

        lo, hi = session.execute(select(func.min(ScoredPrediction.ts), func.max(ScoredPrediction.ts))
                                 .where(ScoredPrediction.service == service)).one()
        return lo, hi

    def prune_labelled(self, session: Session, service: str, before: datetime) -> int:
        """Delete scored predictions made before `before` and their labels; returns predictions deleted."""
        from storage.models import LabelRow, ScoredPrediction

        old = select(ScoredPrediction.request_id).where(ScoredPrediction.service == service,
                                                         ScoredPrediction.ts < before)
        session.execute(delete(LabelRow).where(LabelRow.service == service, LabelRow.request_id.in_(old)))
        result = session.execute(delete(ScoredPrediction).where(ScoredPrediction.service == service,
                                                                ScoredPrediction.ts < before))
        return int(result.rowcount or 0)


    # --- verdicts, alerts, silences and notifications ---

    def upsert_verdicts(self, session: Session, rows: list[dict[str, Any]]) -> list[int]:
        """Insert verdicts, or overwrite the stored one of the same service, model version and window
        (created_at and incident_id of the first write are kept unless given). Returns their ids."""
        ids = []
        now = self.clock()
        for raw in rows:
            key = (raw["service"], raw["model_version"], utc(raw["window_start"]), utc(raw["window_end"]))
            row = session.scalars(select(VerdictRow).where(
                VerdictRow.service == key[0], VerdictRow.model_version == key[1],
                VerdictRow.window_start == key[2], VerdictRow.window_end == key[3])).one_or_none()
            if row is None:
                row = VerdictRow(service=key[0], model_version=key[1], window_start=key[2], window_end=key[3],
                                 created_at=raw.get("created_at") or now)
                session.add(row)
            for name in VERDICT_FIELDS:
                if name in raw and not (name == "incident_id" and raw[name] is None):
                    setattr(row, name, raw[name])
            row.updated_at = now
            session.flush()
            ids.append(row.id)
        return ids

    def load_verdicts(
        self,
        session: Session,
        service: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        model_version: str | None = None,
        incident_id: int | None = None,
    ) -> list[dict[str, Any]]:
        """Verdicts with window_end in (since, until], oldest first, as dicts of every column."""
        query = select(VerdictRow)
        if service is not None:
            query = query.where(VerdictRow.service == service)
        if since is not None:
            query = query.where(VerdictRow.window_end > since)
        if until is not None:
            query = query.where(VerdictRow.window_end <= until)
        if model_version is not None:
            query = query.where(VerdictRow.model_version == model_version)
        if incident_id is not None:
            query = query.where(VerdictRow.incident_id == incident_id)
        query = query.order_by(VerdictRow.window_end, VerdictRow.window_start, VerdictRow.model_version)
        cols = [c.key for c in VerdictRow.__table__.columns]
        return [{c: getattr(v, c) for c in cols} for v in session.scalars(query)]

    def load_incidents(self, session: Session, service: str | None = None, status: str | None = None,
                       limit: int | None = None) -> list[dict[str, Any]]:
        """Incidents, newest first, as dicts of every column."""
        query = select(Incident)
        if service is not None:
            query = query.where(Incident.service == service)
        if status is not None:
            query = query.where(Incident.status == status)
        query = query.order_by(Incident.id.desc())
        if limit is not None:
            query = query.limit(limit)
        cols = [c.key for c in Incident.__table__.columns]
        return [{c: getattr(i, c) for c in cols} for i in session.scalars(query)]

    def record_versions(self, session: Session, service: str, kind: str,
                        first_seen: dict[str, datetime]) -> list[str]:
        """Remember when each version value of `kind` was first seen (event time); an earlier sighting
        of a known value moves its first_seen back. Returns the values seen for the first time."""
        if not first_seen:
            return []
        stored = {r.value: r for r in session.scalars(select(VersionSeen).where(
            VersionSeen.service == service, VersionSeen.kind == kind,
            VersionSeen.value.in_(list(first_seen))))}
        new = []
        for value, seen in sorted(first_seen.items()):
            seen = utc(seen)
            if value in stored:
                if seen < stored[value].first_seen:
                    stored[value].first_seen = seen  # a late row of an older window
                continue
            session.add(VersionSeen(service=service, kind=kind, value=value, first_seen=seen,
                                    recorded_at=self.clock()))
            new.append(value)
        session.flush()
        return new

    def scored_since(self, session: Session, service: str, after_tick: int, until: datetime) -> tuple[
            list[tuple[str, datetime, datetime]], int]:
        """Windows (model_version, start, end) whose findings ticks after `after_tick` with clock <= until
        wrote, and the newest such tick id (after_tick when none)."""
        ticks = select(Tick.id).where(Tick.service == service, Tick.id > after_tick, Tick.now <= until)
        last = session.scalar(select(func.max(Tick.id)).where(Tick.id.in_(ticks)))
        query = (select(FindingRow.model_version, FindingRow.window_start, FindingRow.window_end)
                 .where(FindingRow.service == service, FindingRow.tick_id.in_(ticks)).distinct())
        windows = sorted((v, utc(s), utc(e)) for v, s, e in session.execute(query))
        return windows, int(last) if last is not None else after_tick

    def load_versions(self, session: Session, service: str) -> list[dict[str, Any]]:
        """Every version first-sighting of `service` (kind, value, first_seen), oldest first."""
        query = (select(VersionSeen).where(VersionSeen.service == service)
                 .order_by(VersionSeen.first_seen, VersionSeen.kind, VersionSeen.value))
        return [{"kind": v.kind, "value": v.value, "first_seen": v.first_seen} for v in session.scalars(query)]

    def accept_version(self, session: Session, service: str, value: str, at: datetime, by: str = "",
                       comment: str = "") -> bool:
        """Accept version `value` of `service` as good at `at`; False when it was accepted already."""
        if session.get(VersionAccepted, (service, value)) is not None:
            return False
        session.add(VersionAccepted(service=service, value=value, accepted_at=utc(at), accepted_by=by,
                                    comment=comment))
        session.flush()
        return True

    def load_acceptances(self, session: Session, service: str) -> list[dict[str, Any]]:
        """The version values of `service` accepted with `tailwatch accept` (value, accepted_at, accepted_by,
        comment), oldest first."""
        query = (select(VersionAccepted).where(VersionAccepted.service == service)
                 .order_by(VersionAccepted.accepted_at, VersionAccepted.value))
        return [{"value": a.value, "accepted_at": a.accepted_at, "accepted_by": a.accepted_by,
                 "comment": a.comment} for a in session.scalars(query)]

    def add_silence(self, session: Session, matchers: list[dict[str, str]], created_by: str, comment: str,
                    starts_at: datetime, ends_at: datetime) -> int:
        """Store a silence; returns its id."""
        if ends_at <= starts_at:
            raise ValueError(f"a silence must end after it starts ({starts_at} .. {ends_at})")
        if not matchers:
            raise ValueError("a silence needs at least one matcher")
        row = Silence(matchers=matchers, created_by=created_by, comment=comment, starts_at=starts_at,
                      ends_at=ends_at, created_at=self.clock())
        session.add(row)
        session.flush()
        return row.id

    def load_silences(self, session: Session, now: datetime | None = None) -> list[dict[str, Any]]:
        """Silences (only those in force at `now` when given), oldest first."""
        query = select(Silence).order_by(Silence.id)
        if now is not None:
            query = query.where(Silence.starts_at <= now, Silence.ends_at > now)
        cols = [c.key for c in Silence.__table__.columns]
        return [{c: getattr(s, c) for c in cols} for s in session.scalars(query)]

    def expire_silence(self, session: Session, silence_id: int, now: datetime) -> bool:
        """End silence `silence_id` at `now`; False when there is no such silence or it already ended."""
        row = session.get(Silence, silence_id)
        if row is None or row.ends_at <= now:
            return False
        row.ends_at = max(now, row.starts_at)
        session.flush()
        return True


    # --- operations: leader, heartbeat, retention ---

    def beat(self, session: Session, instance: str, role: str, started_at: datetime, at: datetime,
             last_tick_at: datetime | None = None, last_tick_status: str | None = None) -> None:
        """Record that daemon `instance` (host:pid) is alive as `role` at `at`."""
        from storage.models import DaemonHeartbeat

        row = session.get(DaemonHeartbeat, instance)
        if row is None:
            row = DaemonHeartbeat(instance=instance, started_at=started_at)
            session.add(row)
        row.role, row.beat_at = role, at
        if last_tick_at is not None:
            row.last_tick_at, row.last_tick_status = last_tick_at, last_tick_status
        session.flush()

    def load_heartbeats(self, session: Session) -> list[dict[str, Any]]:
        """Every daemon's last heartbeat, newest first."""
        from storage.models import DaemonHeartbeat

        rows = session.scalars(select(DaemonHeartbeat).order_by(DaemonHeartbeat.beat_at.desc()))
        return [{c: getattr(r, c) for c in ("instance", "role", "started_at", "beat_at", "last_tick_at",
                                            "last_tick_status")} for r in rows]

    def add_job_event(self, session: Session, at: datetime, job: str, kind: str, instance: str,
                      message: str) -> None:
        """Record a failed job (`kind` error) or a run the scheduler missed (`kind` missed)."""
        from storage.models import JobEvent

        session.add(JobEvent(at=at, job=job, kind=kind, instance=instance, message=message[:2000]))
        session.flush()

    def load_job_events(self, session: Session, since: datetime, until: datetime | None = None,
                        ) -> list[dict[str, Any]]:
        """Job errors and missed runs with `at` in [since, until), oldest first."""
        from storage.models import JobEvent

        query = select(JobEvent).where(JobEvent.at >= since)
        if until is not None:
            query = query.where(JobEvent.at < until)
        return [{c: getattr(e, c) for c in ("id", "at", "job", "kind", "instance", "message")}
                for e in session.scalars(query.order_by(JobEvent.id))]

    def running_ticks(self, session: Session, service: str | None = None) -> list[TickRecord]:
        """Ticks still marked running, oldest first: with the leader lock held, ticks a killed process left."""
        query = select(Tick).where(Tick.status == "running")
        if service is not None:
            query = query.where(Tick.service == service)
        return [
            TickRecord(id=t.id, service=t.service, started_at=t.started_at, finished_at=t.finished_at, now=t.now,
                       status=t.status, counts={name: getattr(t, name) for name in TICK_COUNTS}, summary=t.summary)
            for t in session.scalars(query.order_by(Tick.id))
        ]

    def partials_updated_span(self, session: Session, service: str, since: datetime,
                              ) -> tuple[datetime, datetime] | None:
        """The first bucket start and the last bucket start of `service`'s partials written at or after
        `since` (store clock); None when none were."""
        lo, hi = session.execute(
            select(func.min(BucketPartial.bucket_start), func.max(BucketPartial.bucket_start)).where(
                BucketPartial.service == service, BucketPartial.updated_at >= since)
        ).one()
        return None if lo is None else (lo, hi)

    def newest_bucket_end(self, session: Session, service: str) -> datetime | None:
        """The end of `service`'s newest stored bucket (how far its data reaches); None without data."""
        from datetime import timedelta

        row = session.execute(
            select(BucketPartial.bucket_start, BucketPartial.bucket_seconds)
            .where(BucketPartial.service == service)
            .order_by(BucketPartial.bucket_start.desc()).limit(1)
        ).first()
        return None if row is None else row[0] + timedelta(seconds=row[1])

    def partial_keys_before(self, session: Session, service: str, before: datetime, below_seconds: int,
                            ) -> list[tuple[datetime, int]]:
        """(bucket_start, bucket_seconds) of `service`'s partials finer than `below_seconds` starting before
        `before`, oldest first."""
        rows = session.execute(
            select(BucketPartial.bucket_start, BucketPartial.bucket_seconds).distinct()
            .where(BucketPartial.service == service, BucketPartial.bucket_start < before,
                   BucketPartial.bucket_seconds < below_seconds)
            .order_by(BucketPartial.bucket_start)
        ).all()
        return [(r[0], r[1]) for r in rows]

    def delete_partials(self, session: Session, service: str, since: datetime, until: datetime,
                        below_seconds: int | None = None) -> int:
        """Delete `service`'s partials with bucket_start in [since, until) (only those finer than
        `below_seconds` when given); returns how many."""
        query = delete(BucketPartial).where(
            BucketPartial.service == service, BucketPartial.bucket_start >= since, BucketPartial.bucket_start < until)
        if below_seconds is not None:
            query = query.where(BucketPartial.bucket_seconds < below_seconds)
        return session.execute(query).rowcount or 0

    def partial_services(self, session: Session) -> list[str]:
        """Every service with stored partials."""
        return list(session.scalars(select(BucketPartial.service).distinct().order_by(BucketPartial.service)))

    def expire(self, session: Session, what: str, before: datetime) -> int:
        """Delete rows of `what` (quarantine, outbox_sent, ticks, job_events) older than `before`; how many."""
        from storage.models import JobEvent, Outbox

        queries = {
            "quarantine": delete(QuarantineRow).where(QuarantineRow.created_at < before),
            "outbox_sent": delete(Outbox).where(Outbox.status == "sent", Outbox.sent_at < before),
            # A running tick is never expired: recovery looks for it.
            "ticks": delete(Tick).where(Tick.status != "running", Tick.now < before),
            "job_events": delete(JobEvent).where(JobEvent.at < before),
        }
        return session.execute(queries[what]).rowcount or 0

    def delete_offsets(self, session: Session, source: str, file_keys: Iterable[str]) -> None:
        """Forget the stored offsets of `source` for `file_keys`."""
        keys = list(file_keys)
        if keys:
            session.execute(delete(SourceOffset).where(SourceOffset.source == source,
                                                       SourceOffset.file_key.in_(keys)))

    def outbox_depth(self, session: Session) -> int:
        """Notifications written and not yet sent (status pending)."""
        from storage.models import Outbox

        return int(session.scalar(select(func.count()).select_from(Outbox).where(Outbox.status == "pending")) or 0)

    def firing_alerts(self, session: Session) -> int:
        """Alerts in state firing."""
        from storage.models import AlertState

        return int(session.scalar(select(func.count()).select_from(AlertState).where(AlertState.state == "firing"))
                   or 0)

    def start_backfill(self, session: Session, since: datetime, until: datetime, step_seconds: int,
                       staging: str) -> int:
        """Record a new backfill run; returns its id."""
        from storage.models import BackfillProgress

        now = self.clock()
        row = BackfillProgress(since=since, until=until, step_seconds=step_seconds, reached=None,
                               status="running", staging=staging, started_at=now, updated_at=now)
        session.add(row)
        session.flush()
        return row.id

    def open_backfill(self, session: Session) -> dict[str, Any] | None:
        """The unfinished backfill run, if any."""
        from storage.models import BackfillProgress

        row = session.scalars(select(BackfillProgress).where(BackfillProgress.status == "running")
                              .order_by(BackfillProgress.id.desc()).limit(1)).first()
        if row is None:
            return None
        return {c: getattr(row, c) for c in ("id", "since", "until", "step_seconds", "reached", "status",
                                             "staging", "started_at", "updated_at")}

    def advance_backfill(self, session: Session, run_id: int, reached: datetime, status: str = "running") -> None:
        """Mark a backfill's steps done up to clock `reached` (and `status` done when finished)."""
        from storage.models import BackfillProgress

        row = session.get(BackfillProgress, run_id)
        if row is None:
            raise LookupError(f"no backfill run with id {run_id}")
        row.reached, row.status, row.updated_at = reached, status, self.clock()
        session.flush()
