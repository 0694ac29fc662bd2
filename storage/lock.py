"""The leader lock: only the process holding it schedules ticks.

PostgreSQL: a lock on the view `leader_lock` (SHARE UPDATE EXCLUSIVE) held in an open transaction of a
dedicated connection; the server drops it when that connection dies, so a leader checks the connection and
stops scheduling when it is gone. The SQL reader role has no privilege on that view or on `leader_fence`, so
it can neither take the lock nor hold one that would keep it from the daemon. SQLite: an exclusive file lock
beside the database file (one host by construction).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Protocol

from filelock import FileLock, Timeout
from sqlalchemy import Connection, create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from storage.database import Database
from storage.models import LEADER_LOCK_VIEW

log = logging.getLogger(__name__)

PG_LOCK_TIMEOUT_S = 5  # connect and statement timeout of the lock connection's own queries
# How long a take waits for the lock (s): held by a leader, it fails then; held for an instant by anyone else
# (a refused statement of another role locks before its privilege check), the queued request goes first.
PG_LOCK_WAIT_S = 1
# daemon.lock_key's default: any other value is reported as unused on PostgreSQL.
DEFAULT_LOCK_KEY = 0x7461696C
_LOCK_MODE = "SHARE UPDATE EXCLUSIVE"  # self-exclusive; not in conflict with the modes a role without
# privileges can hold (ACCESS SHARE, ROW SHARE, ROW EXCLUSIVE: a PREPARE locks before any privilege check),
# nor with pg_dump's ACCESS SHARE
_LOCK_NOT_AVAILABLE = "55P03"


class LeaderLost(RuntimeError):
    """This process no longer holds the leader lock: its transaction must not commit."""


class Lock(Protocol):
    kind: str

    def acquire(self) -> bool:
        """Take the lock if free; False (never an exception) when another process holds it or the database
        cannot be reached."""

    def alive(self) -> bool:
        """Whether the lock is still held (the lock connection answers and still owns it)."""

    def release(self) -> None:
        """Give the lock up (idempotent)."""

    def fence(self, session: Session) -> None:
        """Raise LeaderLost unless the lock is still held; called first in every transaction of the leader."""


class TableLock:
    """The PostgreSQL leader lock: `LOCK TABLE leader_lock IN SHARE UPDATE EXCLUSIVE MODE` in a READ COMMITTED
    transaction left open on its own connection (not from the Store's pool). That transaction takes no
    snapshot between statements and no transaction id, so it never holds back vacuum.

    Fencing: each leader transaction reads the term in `leader_fence` FOR SHARE and checks it is its own; a
    new leader increments the term once before it schedules, which waits for the transactions the old leader
    still has open. So the old leader's writes end before the new leader's begin, and its next transaction
    sees another term. The lock is per schema: one schema serves one deployment.
    """

    kind = "postgresql"

    def __init__(self, store: Database, key: int = DEFAULT_LOCK_KEY) -> None:
        if key != DEFAULT_LOCK_KEY:
            log.warning("daemon.lock_key is not used on PostgreSQL: the leader lock is the %s view of "
                        "tailwatch's schema (two deployments sharing a database use two schemas)", LEADER_LOCK_VIEW)
        self._mutex = threading.Lock()  # the lock connection is used from the scheduler's threads
        self._engine = create_engine(
            store.url, poolclass=NullPool,
            connect_args={**store._connect_args, "connect_timeout": PG_LOCK_TIMEOUT_S,
                          # Keepalives notice a dead peer on an idle connection; the timeout bounds each check.
                          "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
                          # Never prepared: a prepared statement's portal keeps its snapshot until the
                          # transaction ends (see _alive).
                          "prepare_threshold": None})

        @event.listens_for(self._engine, "connect")
        def _session_settings(dbapi_conn: Any, _record: Any) -> None:
            # SET, not the `options` connect argument, which would replace the store's (its search_path).
            # The lock transaction stays idle for the whole term: no idle-in-transaction timeout may end it.
            with dbapi_conn.cursor() as cursor:
                cursor.execute(f"SET statement_timeout = {PG_LOCK_TIMEOUT_S * 1000}")
                cursor.execute("SET idle_in_transaction_session_timeout = 0")
            dbapi_conn.commit()

        self.scrub = store.scrub
        self._conn: Connection | None = None
        self.held = False
        self.term: int | None = None

    def acquire(self) -> bool:
        with self._mutex:
            if self.held:
                return True
            try:
                if self._conn is None:
                    self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                self._conn.exec_driver_sql("BEGIN ISOLATION LEVEL READ COMMITTED")
                self._conn.exec_driver_sql(f"SET LOCAL lock_timeout = {PG_LOCK_WAIT_S * 1000}")
                self._conn.exec_driver_sql(f"LOCK TABLE {LEADER_LOCK_VIEW} IN {_LOCK_MODE} MODE")
            except Exception as exc:
                if isinstance(exc, DBAPIError) and getattr(exc.orig, "sqlstate", None) == _LOCK_NOT_AVAILABLE:
                    self._rollback()  # another process leads: keep the connection for the next try
                    return False
                log.warning("leader lock: cannot take it: %s", self.scrub(exc))
                self._drop()
                return False
            try:
                # Own short transaction (the lock's must never get a transaction id); waits, up to the statement
                # timeout, for a previous leader's open transactions.
                with self._engine.begin() as conn:
                    self.term = conn.execute(text(
                        "INSERT INTO leader_fence (id, term) VALUES (1, 1) "
                        "ON CONFLICT (id) DO UPDATE SET term = leader_fence.term + 1 RETURNING term")).scalar()
            except Exception as exc:
                log.warning("leader lock: cannot fence the previous leader: %s", self.scrub(exc))
                self._drop()
                return False
            self.held = True
            return True

    def fence(self, session: Session) -> None:
        term = session.execute(text("SELECT term FROM leader_fence WHERE id = 1 FOR SHARE")).scalar()
        if term is None or term != self.term or not self.alive():
            raise LeaderLost("the leader lock was lost; this transaction is not committed")

    def alive(self) -> bool:
        with self._mutex:
            return self._alive()

    def _alive(self) -> bool:
        if self._conn is None or not self.held:
            return False
        try:
            # Sent as a simple query (no parameters, never prepared): a bound statement's portal outlives it
            # until the transaction ends, and with it its snapshot (the lock's would hold back vacuum).
            owned = self._conn.exec_driver_sql(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND pid = pg_backend_pid() "
                f"AND granted AND mode = 'ShareUpdateExclusiveLock' AND relation = '{LEADER_LOCK_VIEW}'::regclass"
            ).scalar()
        except Exception as exc:
            log.error("leader lock: lock connection lost: %s", self.scrub(exc))
            self._drop()
            return False
        if not owned:
            self._drop()
        return bool(owned)

    def release(self) -> None:
        with self._mutex:
            self._drop()

    def _rollback(self) -> None:
        try:
            self._conn.exec_driver_sql("ROLLBACK")
        except Exception:  # a dead connection: drop it, the next try opens another
            self._drop()

    def _drop(self) -> None:
        # Closing the connection ends its transaction, and the lock with it.
        self.held = False
        self.term = None
        if self._conn is not None:
            try:
                self._conn.invalidate()
                self._conn.close()
            except Exception:  # already dead: nothing to close
                pass
            self._conn = None


class FileLeaderLock:
    """An exclusive lock on `<database>.lock`, held by an open file descriptor (released by the kernel
    when the process dies, kill -9 included)."""

    kind = "file"

    def __init__(self, path: Path) -> None:
        self.path = path
        # Not thread-local: the leader check runs on a scheduler thread, not on the thread that acquired.
        self._lock = FileLock(str(path), timeout=0, thread_local=False)
        self._inode: int | None = None

    def acquire(self) -> bool:
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            return False
        self._inode = os.stat(self.path).st_ino
        return True

    def alive(self) -> bool:
        if not self._lock.is_locked:
            return False
        try:
            # A lock file deleted (or replaced) under us no longer excludes a second daemon.
            return os.stat(self.path).st_ino == self._inode
        except FileNotFoundError:
            return False

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release(force=True)

    def fence(self, session: Session) -> None:
        # One host, one kernel lock: only a deleted lock file loses it.
        if not self.alive():
            raise LeaderLost("the leader lock file was removed; this transaction is not committed")


def for_store(store: Database, key: int) -> Lock:
    """The leader lock that fits the store's database."""
    backend = store.url.get_backend_name()
    if backend == "postgresql":
        return TableLock(store, key)
    if backend == "sqlite":
        database = store.url.database or ""
        if not database or database == ":memory:" or database.startswith("file:"):
            raise ValueError("the daemon needs a SQLite database file (not :memory:) to hold its leader lock")
        return FileLeaderLock(Path(database).expanduser().resolve().with_name(Path(database).name + ".lock"))
    raise ValueError(f"no leader lock for database backend {backend!r} (use PostgreSQL or SQLite)")
