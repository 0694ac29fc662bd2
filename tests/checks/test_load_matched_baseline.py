"""The trailing baseline follows load: a window is compared with the trailing buckets that carried at least
LOAD_MATCH of its load. A service whose latency grows with load (an LLM server's larger batches at the
afternoon peak) is not a regression at its peak, while a slowdown at the same peak still is, and a window no
busier than the day keeps the whole day."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

START = datetime(2026, 3, 8, tzinfo=UTC)
HOUR = timedelta(hours=1)
WINDOW = timedelta(minutes=15)


def load(h: float) -> float:
    """Requests per second: 0.5 at 03:00, 2.0 at 15:00."""
    return 1.25 + 0.75 * math.sin(2 * math.pi * (h - 9) / 24)


def store_day(store, slow_from: float | None = None, factor: float = 1.0) -> None:
    """Sixteen hours from midnight of a service whose latency is 4x at the peak what it is at night (queueing);
    `factor` times slower from hour `slow_from` on."""
    from monitor.aggregate.fold import fold
    from monitor.aggregate.partial import merge_bytes

    rng = np.random.default_rng(3)
    frames = []
    for q in range(16 * 4):
        h = q / 4
        n = int(rng.poisson(load(h) * 900))
        busy = (load(h) - 0.5) / 1.5  # 0 at the low, 1 at the peak
        slow = factor if slow_from is not None and h >= slow_from else 1.0
        frames.append(pd.DataFrame({
            "request_id": [f"{q}-{i}" for i in range(n)],
            "ts": pd.Timestamp(START + q * WINDOW) + pd.to_timedelta(np.sort(rng.uniform(0, 899, n)), unit="s"),
            "model_version": "v1", "status": "ok", "joined": True, "stage_rows": 1,
            "latency_ms": 400.0 * (1 + 3.0 * busy) * slow * rng.lognormal(0, 0.6, n)}))
    rows = fold(pd.concat(frames, ignore_index=True), timedelta(minutes=5), [], timed=False)
    with store.transaction() as session:
        store.partials.upsert(session, "svc", rows, merge_bytes)


def total(store, at: datetime, quantile: str):
    from monitor.verdicts.windows import score

    [scored] = score(store, "svc", None, [(at, at + WINDOW)])
    return next(f for f in scored.findings
                if f.labels == {"stage": "total", "quantile": quantile})


@pytest.mark.parametrize("quantile", ["p50", "p99"])
def test_the_peak_is_judged_against_the_busy_hours(store, quantile):
    store_day(store)
    at = START + timedelta(hours=15)
    f = total(store, at, quantile)
    # Against the whole day (the night averaged in) the peak is over 1.5x: a page every afternoon.
    assert f.status == "ok", (f.value, f.baseline)
    # The busy hours' latency, not the day's: within 15% of the peak's own
    assert f.baseline == pytest.approx(f.value, rel=0.15)


def test_a_slowdown_at_the_peak_still_breaches(store):
    store_day(store, slow_from=15.0, factor=1.8)
    f = total(store, START + timedelta(hours=15), "p50")
    assert f.status == "breach" and f.effect > 1.5, (f.value, f.baseline)


def test_a_quiet_window_keeps_the_whole_day(store):
    """At 05:00 (load 0.56 /s, under the day's) every trailing bucket carried at least as much: the baseline is
    all five hours before, whose p50 lies above the window's own."""
    store_day(store)
    f = total(store, START + timedelta(hours=5), "p50")
    assert f.status == "ok" and f.detail["baseline_n"] > 4 * f.n
