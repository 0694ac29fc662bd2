"""The leader lock: only the process holding it schedules ticks.

PostgreSQL: a session advisory lock (`pg_try_advisory_lock`) held on a dedicated connection; the server
drops it when that connection dies, so a leader checks the connection and stops scheduling when it is
gone. SQLite: an exclusive file lock beside the database file (one host by construction).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Protocol

from filelock import FileLock, Timeout
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from storage.database import Database

log = logging.getLogger(__name__)

PG_LOCK_TIMEOUT_S = 5  # connect and statement timeout of the lock connection's own queries


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


class AdvisoryLock:
    """A PostgreSQL session advisory lock on its own connection (not from the Store's pool).

    Fencing: each leader transaction holds `fence_key` shared (`pg_advisory_xact_lock_shared`) and checks the
    lock connection; a new leader takes `fence_key` exclusively once before it schedules, which waits for the
    transactions the old leader still has open. So the old leader's writes end before the new leader's begin,
    and its next transaction fails the check.
    """

    kind = "postgresql-advisory"

    def __init__(self, store: Database, key: int) -> None:
        self.key = key
        self.fence_key = key + 1 if key < 2**63 - 1 else key - 1
        self._mutex = threading.Lock()  # the lock connection is used from the scheduler's threads
        self._engine = create_engine(
            store.url, poolclass=NullPool,
            connect_args={"connect_timeout": PG_LOCK_TIMEOUT_S,
                          # Keepalives notice a dead peer on an idle connection; the timeout bounds each check.
                          "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
                          "options": f"-c statement_timeout={PG_LOCK_TIMEOUT_S * 1000}"})
        self.scrub = store.scrub
        self._conn: Connection | None = None
        self.held = False

    def acquire(self) -> bool:
        with self._mutex:
            try:
                if self._conn is None:
                    self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                self.held = bool(self._conn.execute(text("SELECT pg_try_advisory_lock(:k)"),
                                                    {"k": self.key}).scalar())
                if self.held:
                    # Wait (up to the statement timeout) for a previous leader's open transactions.
                    self._conn.execute(text("SELECT pg_advisory_lock(:f)"), {"f": self.fence_key})
                    self._conn.execute(text("SELECT pg_advisory_unlock(:f)"), {"f": self.fence_key})
            except Exception as exc:
                log.warning("leader lock: cannot take it: %s", self.scrub(exc))
                self._drop()
            return self.held

    def fence(self, session: Session) -> None:
        session.execute(text("SELECT pg_advisory_xact_lock_shared(:f)"), {"f": self.fence_key})
        if not self.alive():
            raise LeaderLost("the leader lock was lost; this transaction is not committed")

    def alive(self) -> bool:
        with self._mutex:
            return self._alive()

    def _alive(self) -> bool:
        if self._conn is None or not self.held:
            return False
        # The advisory lock of a bigint key k shows in pg_locks as classid = k >> 32, objid = k & 0xffffffff.
        unsigned = self.key & 0xFFFFFFFFFFFFFFFF
        try:
            owned = self._conn.execute(text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
                "AND granted AND objsubid = 1 AND classid::bigint = :hi AND objid::bigint = :lo"),
                {"hi": unsigned >> 32, "lo": unsigned & 0xFFFFFFFF}).scalar()
        except Exception as exc:
            log.error("leader lock: lock connection lost: %s", self.scrub(exc))
            self._drop()
            return False
        if not owned:
            self.held = False
        return bool(owned)

    def release(self) -> None:
        with self._mutex:
            self._release()

    def _release(self) -> None:
        if self._conn is not None and self.held:
            try:
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
            except Exception as exc:
                log.warning("leader lock: unlock failed (the server drops it with the connection): %s",
                            self.scrub(exc))
        self._drop()

    def _drop(self) -> None:
        self.held = False
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
        return AdvisoryLock(store, key)
    if backend == "sqlite":
        database = store.url.database or ""
        if not database or database == ":memory:" or database.startswith("file:"):
            raise ValueError("the daemon needs a SQLite database file (not :memory:) to hold its leader lock")
        return FileLeaderLock(Path(database).expanduser().resolve().with_name(Path(database).name + ".lock"))
    raise ValueError(f"no leader lock for database backend {backend!r} (use PostgreSQL or SQLite)")
