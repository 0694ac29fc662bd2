"""`tailwatch backfill` replays history as live ticks would: the same stored partials, findings and
quarantine as ticks over a directory growing with a stepping clock; resumable after an interruption
(a step limit, or kill -9 mid-step); and the daemon goes on after `until` without reading a row twice.
Labels are replayed by `label_ts` (else with their prediction), timings without `start_ts` with their
prediction, a Parquet file from the latest event time it holds; the step is `--step`, else the smallest window."""

from __future__ import annotations

import json
import signal
import time
from datetime import timedelta

import numpy as np
import pandas as pd
import pytest
import yaml
from opsfeed import (
    START,
    append_until,
    config_dict,
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
from sqlalchemy import text
from typer.testing import CliRunner

from monitor import config as config_mod
from monitor.cli import app
from monitor.daemon import backfill, jobs
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
                run = store.backfills.open(session)
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


# --- labels, timings without start_ts, a Parquet labels file ---------------------------------------------------

LABELLED_UNTIL = START + timedelta(hours=2)
LABEL_STEP = timedelta(minutes=15)  # the smallest window below: the default step


def _labelled_feed(minutes: int = 100, per_minute: int = 6, seed: int = 5):
    """(predictions, timings, labels, parquet labels): lists of (visible_at, bytes) and one frame with its
    visibility. Timings carry no start_ts (written with their prediction); labels arrive 10-40 minutes late
    by label_ts, every fifth has no label_ts (written with its prediction); a few labels come in one Parquet
    file, written when its last label was known."""
    rng = np.random.default_rng(seed)
    n = minutes * per_minute
    offsets = np.sort(rng.uniform(0, minutes * 60, n))
    preds, timings, labels, parquet = [], [], [], []
    for i, off in enumerate(offsets):
        ts = START + timedelta(seconds=float(off))
        yes = rng.random() < 0.4
        score = float(np.clip((0.7 if yes else 0.3) + rng.normal(0, 0.2), 0, 1))
        rid = f"q{seed}-{i:05d}"
        row = {"request_id": rid, "ts": _iso(ts), "model_version": "v1", "status": "ok",
               "tenure": int(rng.integers(0, 72)), "Contract": ["Month-to-month", "One year", "Two year"][i % 3],
               "latency_ms": float(round(rng.gamma(4, 10), 3)), "prediction": "Yes" if score >= 0.5 else "No",
               "score_Yes": round(score, 4)}
        preds.append((ts, json.dumps(row).encode() + b"\n"))
        for stage in ("preprocess", "model"):
            t = {"request_id": rid, "stage": stage, "duration_ms": float(round(rng.gamma(3, 5), 3))}
            timings.append((ts, json.dumps(t).encode() + b"\n"))
        known = ts + timedelta(minutes=float(rng.uniform(10, 40)))
        label = {"request_id": rid, "label": "Yes" if yes else "No"}
        if 300 <= i < 330:
            parquet.append({**label, "label_ts": _iso(known)})
        elif i % 5 == 0:
            labels.append((ts, json.dumps(label).encode() + b"\n"))
        else:
            labels.append((known, json.dumps({**label, "label_ts": _iso(known)}).encode() + b"\n"))
    frame = pd.DataFrame(parquet)
    return preds, timings, labels, (pd.to_datetime(frame["label_ts"]).max().to_pydatetime(), frame)


def _iso(ts) -> str:
    return ts.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _labelled_setup(work):
    raw = config_dict(work / "tw.db", interval="15m")  # the smallest window too: either is the step
    service = raw["services"][0]
    service["sources"]["labels"] = {"kind": "files", "path": "./logs/labels"}
    service["schema"] |= {"classes": ["No", "Yes"], "positive_class": "Yes"}
    service["quality"] = {"windows": ["1h"], "min_n": 10, "coverage_threshold": 0.5, "maturity_horizon": "2h",
                          "label_horizon": "2h", "bootstrap_samples": 50, "seed": 1}
    for kind in ("predictions", "timings", "labels"):
        (work / "logs" / kind).mkdir(parents=True, exist_ok=True)
    path = work / "tailwatch.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = config_mod.load(path)
    store = Store(cfg.storage.url)
    store.upgrade()
    return path, cfg, store


def _write_parquet(work, parquet):
    parquet[1].to_parquet(work / "logs" / "labels" / "labels-batch.parquet", index=False)


def _labelled_tables(store):
    with store.transaction() as session:
        reasons = store.quarantine.counts(session, "svc")
    with store.engine.connect() as conn:
        labels = conn.execute(text("select count(*) from labels")).scalar()
        joined, unmatched = conn.execute(text("select sum(joined), sum(unmatched) from ticks")).one()
    return partial_table(store), finding_table(store), reasons, labels, (joined, unmatched)


@pytest.fixture(scope="module")
def labelled_feed():
    return _labelled_feed()


@pytest.fixture(scope="module")
def labelled_live(tmp_path_factory, labelled_feed):
    """Live ticks every 15 minutes while predictions, timings and labels are written as they happened."""
    work = tmp_path_factory.mktemp("labelled-live")
    _, cfg, store = _labelled_setup(work)
    preds, timings, labels, parquet = labelled_feed
    prev, now = None, START
    while now < LABELLED_UNTIL:
        now += LABEL_STEP
        for kind, lines in (("predictions", preds), ("timings", timings), ("labels", labels)):
            append_until(work / "logs" / kind, lines, kind, prev, now)
        if prev is not None and prev < parquet[0] <= now or prev is None and parquet[0] <= now:
            _write_parquet(work, parquet)
        jobs.tick_job(cfg, store, now)
        prev = now
    return _labelled_tables(store)


def test_backfill_replays_labels_by_label_ts_and_timings_without_start_ts_with_their_prediction(
        tmp_path, labelled_feed, labelled_live):
    _, cfg, store = _labelled_setup(tmp_path)
    preds, timings, labels, parquet = labelled_feed
    for kind, lines in (("predictions", preds), ("timings", timings), ("labels", labels)):
        write_all(tmp_path / "logs" / kind, lines, kind)
    _write_parquet(tmp_path, parquet)
    result = backfill.run(cfg, store, START, LABELLED_UNTIL)  # default step: the smallest window, 15m
    assert result.done and result.steps == 8
    tables = _labelled_tables(store)
    partials, findings, reasons, stored_labels, (joined, unmatched) = tables
    # No label is from the future of the clock that reads it; every one known by `until` is stored.
    assert "future_timestamp" not in reasons and "orphan_label" not in reasons
    known = sum(at <= LABELLED_UNTIL for at, _ in labels) + len(parquet[1])
    assert 0 < known < len(labels) + len(parquet[1]) and stored_labels == known
    # Timings without start_ts meet their predictions: every prediction is joined, none left an orphan.
    assert "orphan_timing" not in reasons
    assert (joined, unmatched) == (len(preds), 0)
    # Quality is scored from the replayed labels for the labelled hours.
    quality = {k for k, v in findings.items() if k[0].startswith("quality") and v[1]}
    assert {k[2] for k in quality} >= {START + timedelta(hours=h) for h in (0, 1)}, sorted(findings)
    # And all of it is what live ticks at the same clocks stored.
    assert tables == labelled_live


def _tick_clocks(store) -> list:
    with store.engine.connect() as conn:
        return [pd.Timestamp(t).tz_localize(None) if pd.Timestamp(t).tzinfo else pd.Timestamp(t)
                for t in conn.execute(text("select distinct now from ticks order by now")).scalars()]


def test_backfill_step_is_its_own_option_independent_of_the_daemon_interval(tmp_path, feed):
    cfg_path = write_config(tmp_path, interval="1m")
    write_all(tmp_path / "logs" / "predictions", feed[0], "predictions")
    write_all(tmp_path / "logs" / "timings", feed[1], "timings")
    store = Store(config_mod.load(cfg_path).storage.url)
    store.upgrade()
    result = CliRunner().invoke(app, ["--config", str(cfg_path), "backfill", "--since", SINCE.isoformat(),
                                      "--until", UNTIL.isoformat(), "--step", "10m"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "4 steps of 10m" in result.output
    assert _tick_clocks(store) == [pd.Timestamp(SINCE + timedelta(minutes=10 * i)).tz_localize(None)
                                   for i in range(1, 5)]
    with store.engine.connect() as conn:
        assert conn.execute(text("select step_seconds from backfill_progress")).scalar() == 600


def test_backfill_default_step_is_the_smallest_window_not_the_daemon_interval(tmp_path, feed):
    _, cfg, store = _setup(tmp_path, feed, everything=True)  # daemon.interval 5m, windows 15m and 1h
    assert cfg.daemon.interval == timedelta(minutes=5)
    result = backfill.run(cfg, store, SINCE, UNTIL)
    assert result.done and result.steps == 3 and result.step == timedelta(minutes=15)
    assert _tick_clocks(store) == [pd.Timestamp(SINCE + timedelta(minutes=15 * i)).tz_localize(None)
                                   for i in (1, 2)] + [pd.Timestamp(UNTIL).tz_localize(None)]


def test_backfill_joins_timings_without_start_ts_to_their_predictions(tmp_path, labelled_feed):
    _, cfg, store = _setup(tmp_path, labelled_feed, everything=True)  # predictions and timings, no labels
    backfill.run(cfg, store, START, LABELLED_UNTIL)
    with store.transaction() as session:
        reasons = store.quarantine.counts(session, "svc")
    with store.engine.connect() as conn:
        joined, unmatched = conn.execute(text("select sum(joined), sum(unmatched) from ticks")).one()
    assert "orphan_timing" not in reasons
    assert (joined, unmatched) == (len(labelled_feed[0]), 0)
    # So every bucket knows its stages' durations.
    stages = {key for p in partial_table(store).values() for key in p[3] if "model" in key}
    assert stages, "no stage sketch stored"


def test_files_that_cannot_be_cut_appear_whole_at_the_latest_time_they_hold(tmp_path, labelled_feed):
    import gzip

    _, cfg, store = _labelled_setup(tmp_path)
    preds, timings, labels, parquet = labelled_feed
    with gzip.open(tmp_path / "logs" / "predictions" / "predictions.jsonl.gz", "wb") as fh:
        fh.writelines(line for _, line in preds[:50])
    with gzip.open(tmp_path / "logs" / "timings" / "timings.jsonl.gz", "wb") as fh:
        fh.writelines(line for _, line in timings[:100])  # no start_ts: their predictions' times
    _write_parquet(tmp_path, parquet)
    plan = {f.real.name: f for f in backfill._plan(cfg, tmp_path / "staging", store, [LABELLED_UNTIL])}
    last_prediction = max(at for at, _ in preds[:50])
    for name, latest in (("predictions.jsonl.gz", last_prediction), ("timings.jsonl.gz", last_prediction),
                         ("labels-batch.parquet", parquet[0])):
        f = plan[name]
        size = f.real.stat().st_size
        assert f.cut(latest - timedelta(milliseconds=1)) == 0, name
        assert f.cut(latest) == size, name
