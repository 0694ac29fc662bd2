"""Exactly once: a tick killed with SIGKILL at random moments, then restarted until it completes, stores the
same partials, findings and quarantine as one uninterrupted tick."""

from __future__ import annotations

import random
import signal
import time
from datetime import UTC, datetime

import pytest
from opsfeed import (
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

from monitor import config as config_mod
from monitor.daemon import jobs
from storage.store import Store

NOW = "2026-11-02T12:00:00Z"


def _prepare(work, preds, timings):
    cfg_path = write_config(work, chunk_rows=60)
    write_all(work / "logs" / "predictions", preds, "predictions")
    write_all(work / "logs" / "timings", timings, "timings")
    cfg = config_mod.load(cfg_path)
    store = Store(cfg.storage.url)
    store.upgrade()
    return cfg_path, store


def _committed_lines(store) -> int:
    with store.transaction() as session:
        return sum(s.line for source in ("svc/predictions", "svc/timings")
                   for s in store.offsets.load(session, source).values())


def _tick(cfg_path, timeout=120):
    proc = tailwatch(cfg_path, "run", "--once", "--now", NOW)
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        stop(proc)
    return proc.returncode, err


@pytest.mark.reliability
def test_kill_9_at_random_moments_then_restart_equals_an_uninterrupted_tick(tmp_path, record_property):
    preds, timings = feed_lines(minutes=45, per_minute=25, seed=11)
    ref_path, ref = _prepare(tmp_path / "ref", preds, timings)
    # The uninterrupted run: the same tick job, in this process.
    reports = jobs.tick_job(config_mod.load(ref_path), ref, datetime(2026, 11, 2, 12, tzinfo=UTC))
    assert [r.status for r in reports] == ["ok"]

    cfg_path, store = _prepare(tmp_path / "killed", preds, timings)
    total = len(preds) + len(timings)
    rng = random.Random(20261203)
    kills, interrupted = 0, set()
    for _attempt in range(4):
        proc = tailwatch(cfg_path, "run", "--once", "--now", NOW)
        # A random point of the tick: once a random share of the lines is committed, plus up to 50 ms, so
        # the kill lands between steps as well as inside a step's transaction.
        before = _committed_lines(store)
        target = before + rng.uniform(0.1, 0.9) * (total - before)
        try:
            wait_for(lambda p=proc, t=target: p.poll() is not None or _committed_lines(store) >= t, timeout=60,
                     every=0.01, what="tick progress")
            time.sleep(rng.uniform(0, 0.05))
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            stop(proc)
        if proc.returncode == 0:
            break
        with store.transaction() as session:
            interrupted |= {t.id for t in store.ticks.running(session)}
        if kills >= 3:
            break
    if proc.returncode != 0:
        code, err = _tick(cfg_path)
        assert code == 0, err.decode()[-2000:]
    assert kills >= 2 and len(interrupted) >= 2, (kills, interrupted)

    # For `make reliability`'s summary: rows of the all-traffic partials missing or counted twice.
    got, want = partial_table(store), partial_table(ref)
    rows = {k: (got.get(k, (0,))[0], want.get(k, (0,))[0]) for k in got.keys() | want.keys() if not k[3]}
    record_property("rel_inputs", _attempt + 1)
    record_property("rel_rows", total)
    record_property("rel_faults", kills)
    record_property("rel_crashes", kills)
    record_property("rel_rows_lost", sum(max(w - g, 0) for g, w in rows.values()))
    record_property("rel_duplicates", sum(max(g - w, 0) for g, w in rows.values()))
    assert partial_table(store) == partial_table(ref)
    assert finding_table(store) == finding_table(ref)
    assert quarantine_total(store) == quarantine_total(ref) > 0
    with store.transaction() as session:
        assert not store.ticks.running(session)  # every killed tick was closed by the recovery
        statuses = [t.status for t in store.ticks.last(session, "svc", limit=50)]
    assert statuses.count("error") == len(interrupted) and statuses[0] == "ok"
