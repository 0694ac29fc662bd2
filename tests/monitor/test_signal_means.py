"""A signal's mean is over the requests it describes: the batch size of the requests that reached the model
(a cache hit, a reject or an error logs 0 or nothing), the queue depth of every request."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd

from monitor.aggregate.fold import fold
from monitor.aggregate.partial import Partial
from monitor.schema import Schema

T0 = pd.Timestamp("2026-03-01T00:00:00Z")


def test_batch_size_counts_only_requests_that_reached_the_model():
    frame = pd.DataFrame({
        "request_id": [f"r{i}" for i in range(6)],
        "ts": [T0 + pd.Timedelta(seconds=i) for i in range(6)],
        "model_version": ["v1"] * 6,
        "status": ["ok", "ok", "timeout", "ok", "rejected", "error"],
        "cache_hit": [False, False, False, True, False, False],
        "latency_ms": [10.0, 12.0, 500.0, 1.0, 0.5, 2.0],
        "batch_size": [8, 4, 6, 0, 0, 0],
        "queue_depth": [3, 1, 5, 2, 9, 0],
    })
    [row] = fold(frame, timedelta(minutes=5), [], timed=False, schema=Schema(signals=["batch_size", "queue_depth"]))
    sketches = Partial.from_bytes(row.payload).sketches
    assert (sketches["signal:batch_size"].count, sketches["signal:batch_size"].mean) == (3, 6.0)
    assert (sketches["signal:queue_depth"].count, sketches["signal:queue_depth"].mean) == (6, 20 / 6)
