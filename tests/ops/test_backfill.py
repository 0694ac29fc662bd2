"""`tailwatch backfill` replays history as live ticks would: the same stored partials, findings and
quarantine as ticks over a directory growing with a stepping clock; resumable after an interruption
(a step limit, or kill -9 mid-step); and the daemon goes on after `until` without reading a row twice."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest
from opsfeed import (
    START,
    append_until,
    feed_lines,
    finding_table,
    partial_table,
    quarantine_total,
    stop,
    tailwatch,
    wait_for,
    write_all,
    write_config,
)

from monitor import backfill, jobs
from monitor import config as config_mod
from storage.store import Store

STEP = timedelta(minutes=5)
SINCE, UNTIL, LATER = START, START + timedelta(minutes=40), START + timedelta(minutes=75)


@pytest.fixture(scope="module")
def feed():
    return feed_lines(minutes=60, per_minute=20, seed=21)


def _setup(work, feed, everything: bool):
    cfg_path = write_config(work, interval="5m")
    if everything:
        write_all(work / "logs" / "predictions", feed[0], "predictions")
        write_all(work / "logs" / "timings", feed[1], "timings")
    cfg = config_mod.load(cfg_path)
    store = Store(cfg.storage.url)
    store.upgrade()
    return cfg_path, cfg, store


@pytest.fixture(scope="module")
def live(tmp_path_factory, feed):
    """Live ticks every 5 minutes while the logs grow, to UNTIL; then one tick at LATER with everything."""
    work = tmp_path_factory.mktemp("live")
    _, cfg, store = _setup(work, feed, everything=False)
    prev, now = None, SINCE
    while now < UNTIL:
        now += STEP
        for kind, lines in zip(("predictions", "timings"), feed, strict=True):
            append_until(work / "logs" / kind, lines, kind, prev, now)
        jobs.tick_job(cfg, store, now)
        prev = now
    at_until = (partial_table(store), finding_table(store), quarantine_total(store))
    for kind, lines in zip(("predictions", "timings"), feed, strict=True):
        append_until(work / "logs" / kind, lines, kind, prev, LATER)
    jobs.tick_job(cfg, store, LATER)
    return at_until, (partial_table(store), finding_table(store), quarantine_total(store))


def _tables(store):
    return partial_table(store), finding_table(store), quarantine_total(store)


def test_backfill_stores_what_live_ticks_stored_and_the_daemon_goes_on_exactly_once(tmp_path, feed, live):
    _, cfg, store = _setup(tmp_path, feed, everything=True)
    result = backfill.run(cfg, store, SINCE, UNTIL, step=STEP)
    assert result.done and result.steps == 8
    assert _tables(store) == live[0] and live[0][0] and live[0][1]
    assert not (tmp_path / "tw.db.backfill").exists()  # staging removed after the handover
    # The daemon's next tick reads the real files from where the backfill stopped.
    jobs.tick_job(cfg, store, LATER)
    assert _tables(store) == live[1]


def test_backfill_resumes_after_a_step_limit(tmp_path, feed, live):
    _, cfg, store = _setup(tmp_path, feed, everything=True)
    first = backfill.run(cfg, store, SINCE, UNTIL, step=STEP, max_steps=3)
    assert not first.done and first.reached == SINCE + 3 * STEP
    with pytest.raises(backfill.BackfillError, match="rerun it with those arguments"):
        backfill.run(cfg, store, SINCE, UNTIL + STEP, step=STEP)
    second = backfill.run(cfg, store, SINCE, UNTIL, step=STEP)
    assert second.done and second.resumed_from == first.reached and second.steps == 5
    assert _tables(store) == live[0]


@pytest.mark.reliability
def test_backfill_killed_mid_step_resumes_to_the_same_tables(tmp_path, feed, live):
    cfg_path, cfg, store = _setup(tmp_path, feed, everything=True)
    proc = tailwatch(cfg_path, "backfill", "--since", SINCE.isoformat(), "--until", UNTIL.isoformat(), "--step", "5m")
    try:
        def reached():
            with store.transaction() as session:
                run = store.open_backfill(session)
            return run is not None and run["reached"] is not None and run["reached"] >= SINCE + 2 * STEP

        wait_for(lambda: proc.poll() is not None or reached(), timeout=90, every=0.02, what="two backfill steps")
        time.sleep(0.15)  # into the next step
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        proc.send_signal(signal.SIGKILL)
    finally:
        stop(proc)
    result = backfill.run(cfg, store, SINCE, UNTIL, step=STEP)
    assert result.done and result.resumed_from is not None and result.resumed_from < UNTIL
    assert _tables(store) == live[0]
    jobs.tick_job(cfg, store, LATER)
    assert _tables(store) == live[1]
