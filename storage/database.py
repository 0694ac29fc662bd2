"""The database: engine, transactions, migrations, the SQL reader role, and errors without passwords.

Every repository method takes the Session of a `Database.transaction()`, so one tick's offsets,
partials, findings and quarantine commit together or not at all.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from storage.url import parse_url

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


class StoreError(RuntimeError):
    """The database cannot be reached or used; the message never contains a password."""


class SchemaError(StoreError):
    """The database schema is missing, behind, or newer than this tailwatch."""



def utc(value: datetime) -> datetime:
    """An aware datetime as a plain UTC `datetime` (so it hashes like the values read back)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value.isoformat()} given; pass a timezone-aware datetime")
    value = value.astimezone(UTC)
    return datetime(
        value.year, value.month, value.day, value.hour, value.minute, value.second, value.microsecond,
        tzinfo=UTC,
    )


def given(*pairs: tuple[Any, Any]) -> list[Any]:
    """Filters `column == value` for each (column, value) pair whose value is not None (an unset filter)."""
    return [column == value for column, value in pairs if value is not None]


def between(column: Any, since: datetime | None, until: datetime | None) -> list[Any]:
    """Filters for `column` in [since, until); an open end when None."""
    out = []
    if since is not None:
        out.append(column >= utc(since))
    if until is not None:
        out.append(column < utc(until))
    return out


def as_dict(row: Any) -> dict[str, Any]:
    """A mapped row as a dict of every column."""
    return {c.key: getattr(row, c.key) for c in row.__table__.columns}


def table_names() -> list[str]:
    """Every tailwatch table the SQL reader may read, in dependency order (the leader lock's are not)."""
    from storage.models import Base

    return [t.name for t in Base.metadata.sorted_tables if not t.info.get("leader")]


def leader_relations() -> list[str]:
    """The relations of the leader lock (storage.lock): no privilege on them for the SQL reader."""
    from storage.models import LEADER_LOCK_VIEW, Base

    return [LEADER_LOCK_VIEW] + [t.name for t in Base.metadata.sorted_tables if t.info.get("leader")]


def utc_now() -> datetime:
    """The wall clock, in UTC (the store's default clock)."""
    return datetime.now(UTC)



class Database:
    """A tailwatch database (SQLite file or PostgreSQL): connections, transactions and migrations."""

    def __init__(
        self,
        url: str,
        password: str | None = None,
        *,
        connect_args: dict[str, Any] | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._secrets = [password] if password else []
        try:
            parsed = parse_url(url)
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
        return f"{type(self).__name__}({self.safe_url!r})"

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
            error = self.scrub(exc)
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

    def scrub(self, exc: BaseException | str) -> str:
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
            error = self.scrub(exc)
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
            error = self.scrub(exc)
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
        tailwatch table and no privilege on the leader lock's relations. Returns what could not be done, for the operator (empty when all was)."""
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
        and grant it USAGE on the tables' schema and SELECT on each tailwatch table, and revoke whatever it
        holds on the leader lock's relations (a wider grant would let it stall the leader); each step in a
        savepoint, so one the connection may not do is reported and the upgrade still commits."""
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
        tables, leader = ([name for name in names
                           if conn.execute(text("SELECT to_regclass(:t)"), {"t": name}).scalar() is not None]
                          for names in (table_names(), leader_relations()))
        try:
            with conn.begin_nested():
                conn.exec_driver_sql(f"GRANT USAGE ON SCHEMA {quote(schema)} TO {quote(role)}")
                if tables:
                    conn.exec_driver_sql(f"GRANT SELECT ON {', '.join(quote(t) for t in tables)} TO {quote(role)}")
                if leader:
                    conn.exec_driver_sql(f"REVOKE ALL ON {', '.join(quote(t) for t in leader)} FROM {quote(role)}")
        except DBAPIError as exc:
            notes.append(f"cannot grant {role} SELECT on tailwatch's tables ({self.scrub(exc)}): `query sql` on "
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
            error = self.scrub(exc)
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


class Repository:
    """Reads and writes of one aggregate; every method takes the Session of a `Database.transaction()`."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self.clock = clock
