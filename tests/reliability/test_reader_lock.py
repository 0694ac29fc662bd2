"""The SQL reader role (`query sql`'s) cannot take the leader lock nor keep the daemon from it: advisory locks
on the daemon's keys do nothing to it, LOCK TABLE on the lock's relations is refused, and the locks a role
without privileges can still hold (a PREPARE locks before its privilege check) never conflict with the
leader's. The lock's own transaction holds no snapshot and no transaction id (vacuum is never held back)."""

from __future__ import annotations

import threading

import psycopg
import pytest
import yaml
from ops.opsfeed import wait_for, write_config
from sqlalchemy import create_engine, text

from monitor import config as config_mod
from monitor.daemon.service import Daemon
from storage.database import SQL_READER_ROLE
from storage.lock import for_store
from storage.store import Store

KEY = 0x7461696C  # daemon.lock_key's default
# What the reader tries with the daemon's key (the lock) and the key next to it (the fence it used).
ADVISORY = [f"SELECT pg_advisory_lock({KEY})", f"SELECT pg_advisory_lock({KEY + 1})"]
LOCKS = [f"LOCK TABLE {relation} IN {mode} MODE NOWAIT" for relation in ("leader_lock", "leader_fence")
         for mode in ("ACCESS SHARE", "SHARE UPDATE EXCLUSIVE", "ACCESS EXCLUSIVE")]
# Parsed, never run: each keeps its relation locked (ACCESS SHARE, ROW EXCLUSIVE) until the transaction ends.
PREPARED = ["PREPARE held_lock AS SELECT * FROM leader_lock",
            "PREPARE held_fence AS UPDATE leader_fence SET term = 0"]


def _pg_url(pg_schema) -> str:
    url, connect_args = pg_schema
    return f"{url}?options={connect_args['options'].replace('=', '%3D')}"


def _holder(url: str) -> tuple[int, object, object]:
    """(pid, backend_xmin, backend_xid) of the one connection holding the leader lock of `url`'s schema."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            [row] = conn.execute(text(
                "SELECT a.pid, a.backend_xmin, a.backend_xid FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                "WHERE l.locktype = 'relation' AND l.granted AND l.mode = 'ShareUpdateExclusiveLock' "
                "AND l.relation = 'leader_lock'::regclass")).all()
            return tuple(row)
    finally:
        engine.dispose()


def _terminate(url: str, pid: int) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:p, 30000)"), {"p": pid}).scalar()
    engine.dispose()


@pytest.mark.postgres
@pytest.mark.reliability
def test_the_reader_role_neither_takes_nor_blocks_the_leader_lock(tmp_path, pg_schema, record_property):
    url = _pg_url(pg_schema)
    store = Store(url)
    store.upgrade(sql_role=SQL_READER_ROLE)
    cfg_path = write_config(tmp_path, interval="0.3s", heartbeat_interval="0.2s", leader_check="0.2s",
                            lock_retry="0.2s")
    raw = yaml.safe_load(cfg_path.read_text())
    raw["storage"]["url"] = url
    cfg_path.write_text(yaml.safe_dump(raw))
    cfg = config_mod.load(cfg_path)
    assert cfg.daemon.lock_key == KEY
    daemon, thread, refused = None, None, []
    with store.reader_connection(SQL_READER_ROLE) as reader:
        reader.autocommit = True
        # Read-only is only the role's default: a session may turn it off, so privileges must be the barrier.
        reader.execute("SET default_transaction_read_only = off")
        try:
            for statement in ADVISORY:  # granted (PUBLIC may call them) and held for the session
                assert reader.execute(statement).fetchone() is not None
            daemon = Daemon(cfg, store)
            # Once its lock connection is killed the daemon's own retries wait until the rival holds the lock
            # (left to timing, they sometimes take it first); from then on it asks the database for real.
            terminated, rival_holds = threading.Event(), threading.Event()
            real_acquire = daemon.lock.acquire
            daemon.lock.acquire = lambda: False if terminated.is_set() and not rival_holds.is_set() else real_acquire()
            thread = threading.Thread(target=daemon.run, daemon=True)
            thread.start()
            wait_for(lambda: daemon.metrics.is_leader._value.get() == 1, timeout=30, what="the daemon to lead")
            wait_for(lambda: _ticks(store) >= 2, timeout=30, what="the leader's ticks stored")
            for statement in LOCKS:
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
                    with reader.transaction():
                        reader.execute(statement)
                refused.append(statement)
            for statement in ["SELECT * FROM leader_fence FOR SHARE", "SELECT * FROM leader_lock"]:
                with pytest.raises(psycopg.errors.InsufficientPrivilege), reader.transaction():
                    reader.execute(statement)
                refused.append(statement)
            reader.execute("BEGIN")
            for statement in PREPARED:
                reader.execute(statement)

            pid, xmin, xid = _holder(url)
            assert (xmin, xid) == (None, None)  # the lock's open transaction never holds back vacuum

            # A new leader takes over from a dead one while the reader still holds what it holds.
            rival_store = Store(url)
            rival = for_store(rival_store, KEY)
            try:
                terminated.set()
                _terminate(url, pid)
                wait_for(rival.acquire, timeout=30, every=0.05, what="a new leader to take the lock")
                rival_holds.set()
                wait_for(lambda: daemon.metrics.is_leader._value.get() == 0, timeout=10,
                         what="the old leader to step down")
                rival.release()
                wait_for(lambda: daemon.metrics.is_leader._value.get() == 1, timeout=30,
                         what="the daemon to lead again")
                ticks = _ticks(store)
                wait_for(lambda: _ticks(store) > ticks, timeout=30, what="a tick of the new term")
            finally:
                rival.release()
                rival_store.dispose()
        finally:
            if daemon is not None:
                daemon.request_stop()
                thread.join(30)
            reader.execute("ROLLBACK")
    store.dispose()
    assert thread is not None and not thread.is_alive()
    record_property("rel_inputs", len(ADVISORY) + len(refused) + len(PREPARED))
    record_property("rel_faults", len(ADVISORY) + len(refused) + len(PREPARED) + 1)  # + the killed lock connection


def _ticks(store: Store) -> int:
    with store.engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM ticks WHERE status = 'ok'")).scalar()
