"""What failed counts: a classifier served with a 250 ms deadline whose requests start timing out (6%, from
0.3%) while successful latency stays flat comes out `slower` from the fault's first window, with the timeout
rate in its summary and the timed-out requests in total latency, in each shape a service logs a timeout."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.neighbors import NearestCentroid

from monitor import config as config_mod
from monitor.alerts.evaluate import after_tick
from monitor.daemon.runner import tick
from storage.store import Store

START = datetime(2026, 3, 2, tzinfo=UTC)
DEADLINE_MS = 250.0
PER_HOUR = 600
HEALTHY_HOURS = 24
FAULT_WINDOWS = 3  # of 15 minutes
# Stage times (ms) as gamma (shape, scale): a CPU model behind a small HTTP layer.
GAMMA = {"parse": (2.0, 0.15), "preprocess": (3.0, 0.6), "model": (4.0, 2.0), "postprocess": (2.0, 0.1)}


def _serve(root, shape: str) -> list[datetime]:
    """Digits requests, one every 6 s: every 333rd times out for a day, then 3 of every 50 (spread evenly,
    so the rate does not depend on a draw), written under `root`/staged/<tick>/ as each tick will find them.
    Returns the clock of each tick: the healthy day's end, then each fault window's."""
    x, y = load_digits(return_X_y=True)
    model = NearestCentroid().fit(x[:1000], y[:1000])
    n = PER_HOUR * HEALTHY_HOURS + PER_HOUR // 4 * FAULT_WINDOWS
    rng = np.random.default_rng(35)
    i = np.arange(n)
    ts = i * 3600.0 / PER_HOUR + rng.uniform(0, 1, n)
    fault = ts >= HEALTHY_HOURS * 3600
    timeout = np.where(fault, i % 50 < 3, i % 333 == 100)
    rows = x[1000:][rng.integers(0, len(x) - 1000, n)]
    pred = model.predict(rows)
    stages = {s: rng.gamma(*g, n) for s, g in GAMMA.items()}
    release = np.maximum(0, (ts - HEALTHY_HOURS * 3600) // 900 + 1).astype(int)  # the tick that reads it
    for name in ("p", "t"):
        (root / name).mkdir(exist_ok=True)
    for w in range(FAULT_WINDOWS + 1):
        (root / "staged" / str(w)).mkdir(parents=True)
    for w in range(FAULT_WINDOWS + 1):
        staged = root / "staged" / str(w)
        with open(staged / "p.jsonl", "w") as p, open(staged / "t.jsonl", "w") as t:
            for k in np.flatnonzero(release == w):
                _write(k, p, t, ts, timeout, rows, pred, stages, shape)
    onset = START + timedelta(hours=HEALTHY_HOURS)
    return [onset + timedelta(minutes=15 * w, seconds=30) for w in range(FAULT_WINDOWS + 1)]


def _write(k, p, t, ts, timeout, rows, pred, stages, shape: str) -> None:
    """Request k's prediction line and its stage timing lines, in `shape`."""
    rid = f"digits-{k:06d}"
    row = {"request_id": rid, "ts": (START + timedelta(seconds=float(ts[k]))).isoformat(),
           "model_version": "v1", "status": "timeout" if timeout[k] else "ok",
           "pixel_3_3": float(rows[k][27]), "pixel_4_4": float(rows[k][36])}
    spent = {"parse": stages["parse"][k], "preprocess": stages["preprocess"][k]}
    if timeout[k]:
        # The server gave up in the model stage at the deadline; postprocess never ran.
        spent["model"] = DEADLINE_MS - spent["parse"] - spent["preprocess"]
        if shape == "latency_at_deadline":
            row["latency_ms"] = DEADLINE_MS
        if shape == "no_latency_no_stages":
            spent = {}
    else:
        spent["model"], spent["postprocess"] = stages["model"][k], stages["postprocess"][k]
        row["latency_ms"] = round(sum(spent.values()) + 0.1, 3)
        row["prediction"] = str(pred[k])
    p.write(json.dumps(row) + "\n")
    t.writelines(json.dumps({"request_id": rid, "stage": s, "duration_ms": round(d, 3)}) + "\n"
                 for s, d in spent.items())


CASES = [
    # shape, service config, the total latency p95 of a fault window at least, untimed timeouts
    ("latency_at_deadline", {}, DEADLINE_MS, 0),
    ("no_latency", {"deadline": "250ms"}, DEADLINE_MS, 0),
    ("no_latency_no_stages", {"deadline": "250ms"}, DEADLINE_MS, 0),
    ("no_latency", {}, None, 9),
]


@pytest.mark.filterwarnings("ignore:self.within_class_std_dev_")  # constant pixels in a class: harmless here
@pytest.mark.parametrize(("shape", "extra", "p95_at_least", "untimed"), CASES)
def test_timeouts_at_the_deadline_come_out_slower_from_the_first_window(tmp_path, shape, extra, p95_at_least,
                                                                        untimed):
    clocks = _serve(tmp_path, shape)
    service = {"name": "digits",
               "sources": {"predictions": {"kind": "files", "path": str(tmp_path / "p")},
                           "timings": {"kind": "files", "path": str(tmp_path / "t")}},
               "schema": {"features": {"pixel_3_3": "numeric", "pixel_4_4": "numeric"},
                          "classes": [str(c) for c in range(10)]},
               "buckets": {"size": "5m", "windows": ["15m"]}, "join": {"lateness": "0s"}} | extra
    cfg = config_mod.parse({"services": [service], "storage": {"url": f"sqlite:///{tmp_path}/tw.db"}})
    store = Store(cfg.storage.url)
    store.upgrade()
    try:
        for w, now in enumerate(clocks):
            for kind in ("p", "t"):
                (tmp_path / "staged" / str(w) / f"{kind}.jsonl").rename(tmp_path / kind / f"{w}.jsonl")
            tick(cfg, store, now)
            after_tick(cfg, store, now)
        onset = clocks[0] - timedelta(seconds=30)
        with store.transaction() as session:
            verdicts = [v for v in store.verdicts.load(session, "digits") if v["window_start"] >= onset]
            findings = store.findings.load(session, "digits", since=onset)
    finally:
        store.dispose()
    assert [v["verdict"] for v in verdicts] == ["slower"] * FAULT_WINDOWS
    for v in verdicts:
        # The failing share, against its baseline, in the line a person reads first and in the evidence.
        assert "timeout rate 6% vs 0.299%" in v["summary"]
        rate = next(e for e in v["evidence"] if e["labels"] == {"rate": "timeout"})
        assert rate["status"] == "breach" and rate["value"] == pytest.approx(0.06)
        assert ("logged none" in v["summary"]) == bool(untimed)
    totals = [f for f in findings if f["labels"] == {"stage": "total", "quantile": "p95"}]
    assert len(totals) == FAULT_WINDOWS
    for f in totals:
        if p95_at_least is not None:
            assert f["value"] >= p95_at_least * 0.99  # the timed-out requests are in it, at the deadline
        # Without a deadline the total says how many timed-out requests it lacks.
        assert f["detail"].get("untimed_timeouts", 0) == untimed
