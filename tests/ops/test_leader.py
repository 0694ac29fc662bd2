"""One leader: two daemons on one database (SQLite file lock, PostgreSQL table lock), exactly one
schedules; killing it hands leadership over within a bound; a leader whose lock connection drops stops."""

from __future__ import annotations

import secrets
import signal
import threading
import time
from datetime import UTC, datetime

import pytest
import yaml
from opsfeed import stop, tailwatch, wait_for, write_config
from sqlalchemy import create_engine, text
from test_daemon import free_port, get, metric, samples

from monitor import config as config_mod
from monitor.daemon.leader import Fenced
from monitor.daemon.service import Daemon
from storage.lock import FileLeaderLock, LeaderLost, TableLock, for_store
from storage.store import Store

HANDOVER_BOUND_S = 10  # lock_retry 0.5 s, plus a follower's start-up under a loaded CI machine


def _pg_url(pg_schema) -> str:
    url, connect_args = pg_schema
    return f"{url}?options={connect_args['options'].replace('=', '%3D')}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tw.db'}"
    return _pg_url(request.getfixturevalue("pg_schema"))


def _is_leader(port: int) -> float | None:
    status, body = get(port, "/metrics")
    return metric(samples(body), "tailwatch_is_leader") if status == 200 else None


@pytest.mark.reliability
def test_two_daemons_one_leader_and_handover_on_kill_9(tmp_path, db_url):
    ports, procs = [free_port(), free_port()], []
    key = secrets.randbits(62)  # this test's own lock: parallel tests never share it
    for i, port in enumerate(ports):
        work = tmp_path / f"d{i}"
        cfg = write_config(work, interval="1s", heartbeat_interval="0.5s", lock_retry="0.5s", leader_check="0.5s",
                           lock_key=key, health={"host": "127.0.0.1", "port": port})
        raw = yaml.safe_load(cfg.read_text())
        raw["storage"]["url"] = db_url
        cfg.write_text(yaml.safe_dump(raw))
        if i == 0:
            Store(config_mod.load(cfg).storage.url).upgrade()
        procs.append(tailwatch(cfg, "run"))
    try:
        roles = wait_for(lambda: (r := [_is_leader(p) for p in ports]) and None not in r and sum(r) == 1 and r,
                         timeout=60, what="two daemons up, one leader")
        time.sleep(2)  # several lock retries later, still exactly one
        assert sorted(_is_leader(p) for p in ports) == [0, 1]
        leader = roles.index(1)
        procs[leader].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: _is_leader(ports[1 - leader]) == 1, timeout=HANDOVER_BOUND_S, every=0.05,
                 what="the follower to take over")
        took = time.monotonic() - killed
        # The new leader ticks.
        wait_for(lambda: metric(samples(get(ports[1 - leader], "/metrics")[1]), "tailwatch_ticks_total") >= 1,
                 timeout=20, what="a tick by the new leader")
    finally:
        for proc in procs:
            stop(proc)
    assert took < HANDOVER_BOUND_S


def test_file_lock_excludes_a_second_holder_and_frees_on_release(tmp_path):
    a, b = FileLeaderLock(tmp_path / "tw.db.lock"), FileLeaderLock(tmp_path / "tw.db.lock")
    assert a.acquire() and not b.acquire()
    # Checked from another thread (the scheduler's), the lock is still held.
    seen = []
    thread = threading.Thread(target=lambda: seen.append(a.alive()))
    thread.start()
    thread.join()
    assert seen == [True]
    a.release()
    assert not a.alive() and b.acquire()
    b.release()


@pytest.mark.postgres
def test_table_lock_lost_with_its_connection(pg_schema):
    url = _pg_url(pg_schema)
    store = Store(url)
    store.upgrade()
    key = secrets.randbits(62)
    a, b = TableLock(store, key), TableLock(store, key)
    try:
        assert a.acquire() and a.alive() and not b.acquire()
        _terminate_holder(url, key)
        assert not a.alive()  # the leader notices at its next check
        assert b.acquire() and b.alive()
    finally:
        a.release()
        b.release()
        store.dispose()


def _terminate_holder(url: str, key: int) -> None:
    """End the connection holding the leader lock of `url`'s schema (`key` plays no part on PostgreSQL)."""
    engine = create_engine(url)
    with engine.begin() as conn:
        pids = conn.execute(text(
            "SELECT pid FROM pg_locks WHERE locktype = 'relation' AND granted AND mode = 'ShareUpdateExclusiveLock' "
            "AND relation = 'leader_lock'::regclass")).scalars().all()
        assert len(pids) == 1
        # Wait (up to 30 s) until the backend is gone and its locks with it: on a loaded machine the
        # signalled backend can still hold the lock when the next statement runs.
        assert conn.execute(text("SELECT pg_terminate_backend(:p, 30000)"), {"p": pids[0]}).scalar()
    engine.dispose()


@pytest.mark.postgres
def test_leader_whose_lock_connection_drops_stops_scheduling(tmp_path, pg_schema):
    url = _pg_url(pg_schema)
    cfg_path = write_config(tmp_path, interval="0.3s", heartbeat_interval="0.2s", leader_check="0.2s",
                            lock_retry="0.2s", lock_key=secrets.randbits(62))
    raw = yaml.safe_load(cfg_path.read_text())
    raw["storage"]["url"] = url
    cfg_path.write_text(yaml.safe_dump(raw))
    cfg = config_mod.load(cfg_path)
    store = Store(cfg.storage.url)
    store.upgrade()
    daemon = Daemon(cfg, store)
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    rival = for_store(Store(url), cfg.daemon.lock_key)
    # Another process takes the freed lock before this daemon retries. Left to timing, the daemon's own retry
    # sometimes wins that race, so its retries wait until the rival holds the lock; from then on the daemon
    # asks the database for real and must be refused.
    terminated, rival_holds = threading.Event(), threading.Event()
    real_acquire = daemon.lock.acquire
    daemon.lock.acquire = lambda: False if terminated.is_set() and not rival_holds.is_set() else real_acquire()
    try:
        wait_for(lambda: daemon.metrics.is_leader._value.get() == 1 and _ticks(daemon) >= 2, timeout=20,
                 what="leader ticking")
        terminated.set()
        _terminate_holder(url, cfg.daemon.lock_key)
        # (An acquire waits, up to its 5 s statement timeout, for the old leader's open transactions: the fence.)
        wait_for(rival.acquire, timeout=15, every=0.01, what="the rival to take the lock")
        rival_holds.set()
        wait_for(lambda: daemon.metrics.is_leader._value.get() == 0, timeout=5, what="the leader to step down")
        time.sleep(0.5)  # a running tick may finish
        frozen = _ticks(daemon)
        time.sleep(1.5)  # five intervals: no tick while another process holds the lock
        assert _ticks(daemon) == frozen
        with store.transaction() as session:
            events = store.job_events.load(session, datetime(2000, 1, 1, tzinfo=UTC))
        assert any(e["job"] == "leader" and "lost" in e["message"] for e in events)
    finally:
        daemon.request_stop()
        thread.join(10)
        rival.release()
        store.dispose()
    assert not thread.is_alive()


def _ticks(daemon: Daemon) -> float:
    return sum(s.value for m in daemon.metrics.ticks.collect() for s in m.samples if s.name.endswith("_total"))


@pytest.mark.postgres
def test_a_new_leader_waits_for_the_old_leaders_open_transaction_and_the_old_one_cannot_commit(pg_schema):
    url = _pg_url(pg_schema)
    store_a, store_b = Store(url), Store(url)
    store_a.upgrade()
    key = secrets.randbits(62)
    a, b = TableLock(store_a, key), TableLock(store_b, key)
    old = Fenced(store_a, a)
    inside, finish, taken = threading.Event(), threading.Event(), []

    def old_tick():  # a tick step of the old leader, open when its lock connection dies
        with old.transaction() as session:
            store_a.job_events.add(session, datetime.now(UTC), "tick", "error", "old", "written by the old leader")
            inside.set()
            finish.wait(10)

    try:
        assert a.acquire()
        writer = threading.Thread(target=old_tick)
        writer.start()
        assert inside.wait(10)
        _terminate_holder(url, key)
        taker = threading.Thread(target=lambda: taken.append((b.acquire(), time.monotonic())))
        taker.start()
        time.sleep(1.0)
        assert not taken  # the new leader waits for the old leader's open transaction
        finish.set()
        committed = time.monotonic()
        writer.join(10)
        taker.join(10)
        assert taken and taken[0][0] and taken[0][1] >= committed
        with pytest.raises(LeaderLost), old.transaction() as session:  # the old leader's next step
            store_a.job_events.add(session, datetime.now(UTC), "tick", "error", "old", "must not commit")
        with store_b.transaction() as session:
            messages = [e["message"] for e in store_b.job_events.load(session, datetime(2000, 1, 1, tzinfo=UTC))]
        assert messages == ["written by the old leader"]
    finally:
        finish.set()
        a.release()
        b.release()
        store_a.dispose()
        store_b.dispose()
