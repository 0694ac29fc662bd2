"""Baselines: trailing 24 h or the same hour over the last 7 days, through monitor.windows.score."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from monitor.partials import ALL, fold, merge_bytes
from monitor.windows import baseline_ranges, score

DAY, HOUR = timedelta(days=1), timedelta(hours=1)
START = datetime(2026, 3, 8, 14, tzinfo=UTC)


def test_baseline_ranges():
    assert baseline_ranges(START, START + HOUR) == [(START - DAY, START)]
    same = baseline_ranges(START, START + HOUR, "same_hour_7d")
    assert same == [(START - d * DAY, START - d * DAY + HOUR) for d in range(7, 0, -1)]
    # a day-long window: the seven days before it, never the window itself
    assert baseline_ranges(START, START + DAY, "same_hour_7d")[-1] == (START - DAY, START)
    with pytest.raises(ValueError, match="unknown baseline"):
        baseline_ranges(START, START + HOUR, "yesterday")


def hour_of(start: datetime, latency_ms: float, n: int, rng) -> pd.DataFrame:
    return pd.DataFrame({"request_id": [f"{start:%d%H}-{i}" for i in range(n)],
                         "ts": pd.Timestamp(start) + pd.to_timedelta(np.linspace(0, 3599, n), unit="s"),
                         "model_version": "v1", "status": "ok", "joined": True, "stage_rows": 1,
                         "latency_ms": latency_ms * rng.lognormal(0, 0.1, n)})


def test_a_busy_hour_is_slow_against_the_day_but_not_against_its_own_hour(store):
    rng = np.random.default_rng(0)
    frames = [hour_of(START - d * DAY, 100.0, 200, rng) for d in range(1, 8)]  # 14:00 was always slow
    frames += [hour_of(START - h * HOUR, 10.0, 200, rng) for h in range(1, 23)]  # the rest of the day is fast
    frames.append(hour_of(START, 100.0, 200, rng))
    rows = fold(pd.concat(frames, ignore_index=True), HOUR, [], timed=False)
    with store.transaction() as session:
        store.upsert_partials(session, "svc", rows, merge_bytes)

    def p50(kind):
        [scored] = score(store, "svc", None, [(START, START + HOUR)], baseline_kind=kind)
        assert scored.segment == ALL and scored.rows == 200
        return next(f for f in scored.findings if f.labels == {"stage": "total", "quantile": "p50"})

    trailing, same_hour = p50("trailing_24h"), p50("same_hour_7d")
    assert trailing.status == "breach" and trailing.baseline < 15
    assert same_hour.status == "ok" and same_hour.baseline == pytest.approx(100, rel=0.05)
    assert same_hour.detail["baseline_n"] == 7 * 200
