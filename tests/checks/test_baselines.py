"""Baselines: trailing 24 h or the same hour over the last 7 days, through monitor.verdicts.windows.score."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from monitor.aggregate.fold import fold
from monitor.aggregate.partial import ALL, merge_bytes
from monitor.verdicts.windows import baseline_ranges, score

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
        store.partials.upsert(session, "svc", rows, merge_bytes)

    def p50(kind):
        [scored] = score(store, "svc", None, [(START, START + HOUR)], baseline_kind=kind)
        assert scored.segment == ALL and scored.rows == 200
        return next(f for f in scored.findings if f.labels == {"stage": "total", "quantile": "p50"})

    trailing, same_hour = p50("trailing_24h"), p50("same_hour_7d")
    assert trailing.status == "breach" and trailing.baseline < 15
    assert same_hour.status == "ok" and same_hour.baseline == pytest.approx(100, rel=0.05)
    assert same_hour.detail["baseline_n"] == 7 * 200


def test_windows_scored_together_read_each_stored_bucket_once_and_score_as_alone(store, monkeypatch):
    # A tick or a scan scores many windows whose trailing days overlap; each stored partial is decoded once
    # for all of them, and each window scores as it does alone.
    from monitor.aggregate.partial import Partial
    from monitor.verdicts import windows as windows_mod

    rng = np.random.default_rng(1)
    first = START - 26 * HOUR
    frames = [hour_of(first + h * HOUR, 10.0 + 5 * (h % 3), 60, rng) for h in range(30)]
    frames.append(hour_of(START + 3 * DAY, 40.0, 60, rng))  # a window days later: nothing held is of use
    frame = pd.concat(frames, ignore_index=True)
    frame["model_version"] = np.where(np.arange(len(frame)) % 4 == 0, "v2", "v1")
    frame["Contract"] = np.where(np.arange(len(frame)) % 3 == 0, "One year", "Month-to-month")
    rows = fold(frame, timedelta(minutes=15), ["Contract"], timed=False)
    with store.transaction() as session:
        store.partials.upsert(session, "svc", rows, merge_bytes)
    quarter = timedelta(minutes=15)
    windows = [(START + k * quarter, START + (k + 1) * quarter) for k in range(12)]
    windows += [(START + h * HOUR, START + (h + 1) * HOUR) for h in range(3)]
    windows += [(START + 3 * DAY, START + 3 * DAY + HOUR)]
    windows.reverse()  # in any order

    decoded = []
    real = Partial.from_bytes
    monkeypatch.setattr(Partial, "from_bytes", staticmethod(lambda b: decoded.append(1) or real(b)))
    together = score(store, "svc", None, windows)
    lo, hi = START - windows_mod.BASELINE, START + 3 * HOUR
    assert len(decoded) == sum(1 for r in rows if lo <= r.bucket_start < hi or r.bucket_start >= START + 3 * DAY)
    alone = [s for w in sorted(windows) for s in score(store, "svc", None, [w])]
    assert [s.start for s in together] == sorted(s.start for s in together)
    assert len(together) == len(alone) > 16 and repr(together) == repr(alone)


def test_hour_blocks_merge_as_the_buckets_do():
    # A baseline is merged an hour at a time where an hour lies whole in its range: counts, histograms,
    # sketch bins, min and max as the buckets' own merge; sums to the last bits.
    from monitor.aggregate.partial import Partial, merge_all
    from monitor.verdicts.windows import _Blocks

    rng = np.random.default_rng(2)
    frame = pd.concat([hour_of(START - h * HOUR, 10.0 + h, 40, rng) for h in range(6, 0, -1)], ignore_index=True)
    rows = sorted(fold(frame, timedelta(minutes=5), [], timed=False), key=lambda r: r.bucket_start)
    held = [(r.bucket_start, r.model_version, r.segment, Partial.from_bytes(r.payload)) for r in rows]
    lo, hi = START - 5 * HOUR - timedelta(minutes=30), START  # half an hour, then 5 whole hours
    inside = [r for r in held if lo <= r[0] < hi]
    blocks = _Blocks()
    got, want = blocks.merge(inside, [(lo, hi)]), merge_all(r[3] for r in inside)
    assert len(blocks.merged) == 5 and blocks.merge(inside, [(lo, hi)]) == got  # the cached hours again
    blocks.forget(START - 2 * HOUR)
    assert sorted(k[2] for k in blocks.merged) == [START - 2 * HOUR, START - HOUR]
    assert got.counts == want.counts and got.hists == want.hists and got.sketches.keys() == want.sketches.keys()
    for name, sk in want.sketches.items():
        mine = got.sketches[name]
        assert (mine.pos, mine.neg, mine.zero, mine.count, mine.min, mine.max) == (
            sk.pos, sk.neg, sk.zero, sk.count, sk.min, sk.max)
        assert mine.sum == pytest.approx(sk.sum, rel=1e-12) and mine.sumsq == pytest.approx(sk.sumsq, rel=1e-12)


def test_a_field_drifting_in_every_window_keeps_the_serving_baseline(store):
    # A field whose every window drifts from the reference (here a value the reference never had) breaches
    # the drift checks each hour; those findings are judged against the reference, not the serving
    # history, so they must not take the windows out of the latency baseline: a later slowdown is `slower`.
    from monitor.aggregate.profile import build_profile
    from monitor.schema import Schema
    from monitor.verdicts.verdict import decide
    from monitor.verdicts.windows import store_scored

    rng = np.random.default_rng(3)
    schema = Schema(features={"plan": "categorical", "x": "numeric"})
    reference = pd.DataFrame({"plan": rng.choice(["basic", "gold"], 2000), "x": rng.normal(0, 1, 2000)})
    profile = build_profile(reference, schema)
    first = START - 30 * HOUR
    frames = []
    for h in range(33):
        hour = hour_of(first + h * HOUR, 40.0 if h >= 30 else 10.0, 300, rng)
        frames.append(hour.assign(plan=rng.choice(["basic", "gold", "platinum"], 300), x=rng.normal(0, 1, 300)))
    rows = fold(pd.concat(frames, ignore_index=True), HOUR, [], timed=False, schema=schema, profile=profile)
    with store.transaction() as session:
        store.partials.upsert(session, "svc", rows, merge_bytes)
    verdicts = {}
    for h in range(33):  # one tick an hour, as the daemon scores them
        start = first + h * HOUR
        [scored] = score(store, "svc", profile, [(start, start + HOUR)])
        store_scored(store, "svc", [scored], None)
        findings = [f.to_row("svc", "v1", start, start + HOUR, None) for f in scored.findings]
        verdicts[h] = decide(findings, service="svc", model_version="v1", window_start=start,
                             window_end=start + HOUR, now=start + HOUR)
    assert all(any(e.check in ("unseen_categories", "feature_drift") for e in verdicts[h].evidence)
               or verdicts[h].verdict == "drift" for h in range(24, 30))
    assert [verdicts[h].verdict for h in range(30, 33)] == ["slower"] * 3, [verdicts[h].summary for h in range(30, 33)]
