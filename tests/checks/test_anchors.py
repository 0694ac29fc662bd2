"""Baselines that hold their ground (monitor.verdicts.windows.Anchors): a new version is compared with the accepted
one before it, an open incident's windows with the history before its onset, and a backlog scored in one
call with the history before its first breaching window; a lagged trailing baseline catches slow drift."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from monitor.aggregate.fold import fold
from monitor.aggregate.partial import ALL, merge_bytes
from monitor.verdicts.windows import Anchors, baseline_ranges, score, store_scored

DAY, HOUR = timedelta(days=1), timedelta(hours=1)
DEPLOY = datetime(2026, 3, 8, 12, tzinfo=UTC)


def hour_of(start: datetime, latency_ms: float, version: str = "v1", n: int = 200, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed + int(start.timestamp()) // 3600)
    return pd.DataFrame({"request_id": [f"{version}-{start:%d%H}-{i}" for i in range(n)],
                         "ts": pd.Timestamp(start) + pd.to_timedelta(np.linspace(0, 3599, n), unit="s"),
                         "model_version": version, "status": "ok", "joined": True, "stage_rows": 1,
                         "latency_ms": latency_ms * rng.lognormal(0, 0.1, n)})


def stored(store, frames: list[pd.DataFrame]) -> None:
    rows = fold(pd.concat(frames, ignore_index=True), HOUR, [], timed=False)
    with store.transaction() as session:
        store.partials.upsert(session, "svc", rows, merge_bytes)


def p50(scored) -> dict[datetime, object]:
    """Each window's all-traffic total p50 latency finding, by window start."""
    return {s.start: next(f for f in s.findings if f.labels == {"stage": "total", "quantile": "p50"})
            for s in scored if s.segment == ALL}


def slower_v2(store, hours: int = 16) -> None:
    """v1 at 10 ms for a day, then v2 at 30 ms from DEPLOY for `hours` (v1 gone)."""
    stored(store, [hour_of(DEPLOY - h * HOUR, 10.0) for h in range(1, 25)]
           + [hour_of(DEPLOY + h * HOUR, 30.0, "v2") for h in range(hours)])


def test_a_new_version_is_compared_with_the_accepted_one_until_it_is_accepted(store):
    slower_v2(store)
    window = [(DEPLOY + 15 * HOUR, DEPLOY + 16 * HOUR)]
    sightings = (("model_version", "v1", DEPLOY - DAY), ("model_version", "v2", DEPLOY + timedelta(seconds=3)))
    # Its own trailing history is 15 hours of the regression: compared with it, v2 looks fine.
    [own] = p50(score(store, "svc", None, window)).values()
    assert own.status == "ok" and own.baseline > 25
    held = Anchors(accepted=frozenset({"v1"}), sightings=sightings)
    [finding] = p50(score(store, "svc", None, window, anchors=held)).values()
    assert finding.status == "breach" and finding.baseline == pytest.approx(10, rel=0.1)
    assert finding.detail["baseline_n"] == 24 * 200  # the day before v2 first appeared
    # Accepted (by `tailwatch accept` or the config), v2 is its own baseline again.
    [accepted] = p50(score(store, "svc", None, window, anchors=Anchors(
        accepted=frozenset({"v1", "v2"}), sightings=sightings))).values()
    assert accepted == own
    # A soak accepts it, unless an incident is open on it.
    soaked = Anchors(accepted=frozenset({"v1"}), sightings=sightings, soak=12 * HOUR)
    assert p50(score(store, "svc", None, window, anchors=soaked))[window[0][0]] == own
    held_open = Anchors(accepted=frozenset({"v1"}), sightings=sightings, soak=12 * HOUR,
                        incidents=(("v2", DEPLOY),))
    assert p50(score(store, "svc", None, window, anchors=held_open))[window[0][0]].status == "breach"


def test_with_none_accepted_a_new_version_is_compared_with_the_traffic_before_it(store):
    slower_v2(store)
    sightings = (("model_version", "v1", DEPLOY - DAY), ("model_version", "v2", DEPLOY + timedelta(seconds=3)),
                 ("preprocess_version", "pp1", DEPLOY - DAY))
    [finding] = p50(score(store, "svc", None, [(DEPLOY + 15 * HOUR, DEPLOY + 16 * HOUR)],
                          anchors=Anchors(sightings=sightings))).values()
    assert finding.status == "breach" and finding.baseline == pytest.approx(10, rel=0.1)
    # v1, there from the start, has nothing before it: its own history, as without anchors.
    first = [(DEPLOY - 2 * HOUR, DEPLOY - HOUR)]
    assert (p50(score(store, "svc", None, first, anchors=Anchors(sightings=sightings)))
            == p50(score(store, "svc", None, first)))


def same_version_fault(store, hours: int = 16, after: int = 0) -> None:
    """v1 at 10 ms for a day, 30 ms from DEPLOY for `hours`, then 10 ms again for `after` hours."""
    stored(store, [hour_of(DEPLOY - h * HOUR, 10.0) for h in range(1, 25)]
           + [hour_of(DEPLOY + h * HOUR, 30.0) for h in range(hours)]
           + [hour_of(DEPLOY + (hours + h) * HOUR, 10.0) for h in range(after)])


def test_an_open_incident_holds_its_baseline_at_its_onset(store):
    same_version_fault(store)
    window = [(DEPLOY + 15 * HOUR, DEPLOY + 16 * HOUR)]
    [absorbed] = p50(score(store, "svc", None, window)).values()
    assert absorbed.status == "ok"
    for on in ("v1", None):  # the version's incident, or a service-wide one
        [held] = p50(score(store, "svc", None, window, anchors=Anchors(incidents=((on, DEPLOY),)))).values()
        assert held.status == "breach" and held.baseline == pytest.approx(10, rel=0.1)
    # Another version's incident holds nothing of v1's; one opened later than the window neither.
    for other in (("v2", DEPLOY), ("v1", DEPLOY + 16 * HOUR)):
        assert p50(score(store, "svc", None, window, anchors=Anchors(incidents=(other,))))[window[0][0]] == absorbed
    # A value there from the start (nothing before it) is no anchor: the incident's onset still holds.
    initial = Anchors(sightings=(("config_hash", "c1", DEPLOY - DAY), ("preprocess_version", "pp1", DEPLOY - DAY)),
                      incidents=(("v1", DEPLOY),))
    assert p50(score(store, "svc", None, window, anchors=initial))[window[0][0]].status == "breach"
    # A config change first seen at the onset and not accepted holds it too.
    change = Anchors(accepted=frozenset({"v1"}), sightings=(("model_version", "v1", DEPLOY - DAY),
                                                            ("config_hash", "c1", DEPLOY - DAY),
                                                            ("config_hash", "c2", DEPLOY + timedelta(seconds=1))))
    assert p50(score(store, "svc", None, window, anchors=change))[window[0][0]].status == "breach"


def test_a_backlog_scored_in_one_call_holds_the_baseline_before_its_first_breach(store):
    same_version_fault(store, hours=16, after=3)
    windows = [(DEPLOY + h * HOUR, DEPLOY + (h + 1) * HOUR) for h in range(19)]
    together = p50(score(store, "svc", None, windows))
    fault = [together[DEPLOY + h * HOUR] for h in range(16)]
    assert all(f.status == "breach" and f.baseline == pytest.approx(10, rel=0.1) for f in fault)
    assert all(f.detail["baseline_n"] == 24 * 200 for f in fault)  # every one: the day before the onset
    # Alone, the last fault window is compared with a day that is mostly the fault.
    assert p50(score(store, "svc", None, windows[15:16]))[windows[15][0]].status == "ok"
    # Back to normal: clean against the held baseline, and the trailing one resumes after it.
    back = [together[DEPLOY + h * HOUR] for h in range(16, 19)]
    assert [f.status for f in back] == ["ok"] * 3
    # The trailing day again, without the fault's 16 hours: a regression's windows are no baseline once it
    # has ended, or the traffic that came back would be judged against the fault's.
    assert back[1].detail["baseline_n"] == 8 * 200 and back[1].baseline == pytest.approx(10, rel=0.1)


def test_a_regression_scored_by_earlier_ticks_stays_out_of_the_trailing_baseline(store):
    same_version_fault(store, hours=16, after=3)
    windows = [(DEPLOY + h * HOUR, DEPLOY + (h + 1) * HOUR) for h in range(19)]
    scored = score(store, "svc", None, windows[:17])
    store_scored(store, "svc", scored, None)
    alone = p50(score(store, "svc", None, windows[17:18]))[windows[17][0]]
    assert alone.status == "ok"
    assert alone.detail["baseline_n"] == 8 * 200 and alone.baseline == pytest.approx(10, rel=0.1)
    # Live equals the backlog: one call over every window gives that window the same finding.
    assert p50(score(store, "svc", None, windows))[windows[17][0]] == alone


def test_windows_scored_by_successive_ticks_hold_the_baseline_before_their_first_breach(store):
    """Live, one window a tick, before any incident opens: the run of breaching windows the earlier ticks
    stored holds the baseline as a backlog scored in one call does."""
    same_version_fault(store, hours=16, after=3)
    got = {}
    for h in range(19):
        scored = score(store, "svc", None, [(DEPLOY + h * HOUR, DEPLOY + (h + 1) * HOUR)])
        store_scored(store, "svc", scored, None)
        got |= p50(scored)
    assert all(got[DEPLOY + h * HOUR].status == "breach" for h in range(16))
    assert got[DEPLOY + 15 * HOUR].detail["baseline_n"] == 24 * 200
    assert [got[DEPLOY + h * HOUR].status for h in range(16, 19)] == ["ok"] * 3


def test_a_days_window_is_held_at_the_day_before_a_run_with_fewer_rows_than_it(store):
    """Daily windows on a 24 h baseline: the day held is about the window's size, here a little smaller;
    it still holds, rather than the trailing day that is the regression."""
    day0 = datetime(2026, 3, 9, tzinfo=UTC)
    stored(store, [hour_of(day0 - h * HOUR, 10.0) for h in range(1, 25)]
           + [hour_of(day0 + h * HOUR, 30.0) for h in range(24)]
           + [hour_of(day0 + h * HOUR, 30.0, n=220) for h in range(24, 48)])
    for k in range(2):
        scored = score(store, "svc", None, [(day0 + k * DAY, day0 + (k + 1) * DAY)])
        store_scored(store, "svc", scored, None)
    second = p50(scored)[day0 + DAY]
    assert second.status == "breach" and second.baseline == pytest.approx(10, rel=0.1)
    assert second.detail["baseline_n"] == 24 * 200 < second.n


def test_a_lagged_trailing_baseline_catches_a_slow_drift(store):
    # 10 ms two days ago, 20 ms yesterday, 25 ms now: against the day before, the last step looks small.
    stored(store, [hour_of(DEPLOY - h * HOUR, 20.0 if h <= 24 else 10.0) for h in range(1, 49)]
           + [hour_of(DEPLOY, 25.0)])
    window = [(DEPLOY, DEPLOY + HOUR)]
    [near] = p50(score(store, "svc", None, window)).values()
    [lagged] = p50(score(store, "svc", None, window, anchors=Anchors(lag=DAY))).values()
    assert near.status == "ok" and near.baseline == pytest.approx(20, rel=0.1)
    assert lagged.status == "breach" and lagged.baseline == pytest.approx(10, rel=0.1)
    assert baseline_ranges(DEPLOY, DEPLOY + HOUR, lag=DAY) == [(DEPLOY - 2 * DAY, DEPLOY - DAY)]


def test_same_hour_baselines_held_at_an_anchor_are_the_days_before_it():
    from monitor.verdicts.windows import _before

    start = DEPLOY + 30 * HOUR
    ranges = _before(start, start + HOUR, "same_hour_7d", DEPLOY)
    assert len(ranges) == 7 and all(b <= DEPLOY and b - a == HOUR for a, b in ranges)
    assert ranges[-1] == (start - 2 * DAY, start - 2 * DAY + HOUR)
    assert _before(start, start + HOUR, "same_hour_7d", start) == baseline_ranges(start, start + HOUR, "same_hour_7d")


def test_a_burst_of_rejects_in_one_bucket_is_one_event_not_a_reject_rate(store):
    # A client's burst cut by its rate limit puts ~5% of a window's requests in one 5-minute bucket; the
    # same count spread over the window is a reject rate.
    five = timedelta(minutes=5)
    rng = np.random.default_rng(3)

    def minutes(start: datetime, n: int, rejected: int, tag: str) -> pd.DataFrame:
        status = np.array(["ok"] * n, dtype=object)
        status[rng.choice(n, rejected, replace=False)] = "rejected"
        return pd.DataFrame({"request_id": [f"{tag}-{start:%d%H%M}-{i}" for i in range(n)],
                             "ts": pd.Timestamp(start) + pd.to_timedelta(np.linspace(0, 299, n), unit="s"),
                             "model_version": "v1", "status": status, "joined": True, "stage_rows": 1,
                             "latency_ms": rng.lognormal(2, 0.1, n)})

    day = [minutes(DEPLOY - (k + 1) * five, 600, 1 if k % 4 == 0 else 0, "b") for k in range(288)]
    later = DEPLOY + HOUR
    spread = [minutes(DEPLOY + k * five, 600, 32, "s") for k in range(3)]
    burst = [minutes(later, 600, 95, "w"), minutes(later + five, 600, 0, "w"), minutes(later + 2 * five, 600, 0, "w")]
    rows = fold(pd.concat(day + burst + spread, ignore_index=True), five, [], timed=False)
    with store.transaction() as session:
        store.partials.upsert(session, "svc", rows, merge_bytes)

    def reject(start):
        [scored] = [s for s in score(store, "svc", None, [(start, start + 3 * five)]) if s.segment == ALL]
        return next(f for f in scored.findings if f.labels == {"rate": "reject"})

    clumped, steady = reject(later), reject(DEPLOY)
    assert clumped.value == pytest.approx(steady.value, rel=0.02)
    assert clumped.status == "ok" and clumped.detail["dispersion"] > 10
    assert steady.status == "breach"


def test_an_anchored_baseline_is_read_once_per_call_however_many_windows_use_it(store, monkeypatch):
    from monitor.aggregate.partial import Partial

    same_version_fault(store, hours=16)
    windows = [(DEPLOY + h * HOUR, DEPLOY + (h + 1) * HOUR) for h in range(16)]
    decoded = []
    real = Partial.from_bytes
    monkeypatch.setattr(Partial, "from_bytes", staticmethod(lambda b: decoded.append(1) or real(b)))
    held = score(store, "svc", None, windows, anchors=Anchors(incidents=((None, DEPLOY),)))
    assert all(f.status == "breach" for f in p50(held).values())
    stored_buckets = 24 + 16  # hour buckets, all traffic only (no segments)
    assert len(decoded) <= stored_buckets + 24  # the trailing span once, the day before the onset once more
