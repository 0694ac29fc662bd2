"""The generation service's replays of `bench/incidents.py --short`, in a module of their own so the test
workers share them out with the churn scenarios' (tests/alerts/test_incidents_bench.py): its segment-only
slowdown live and as a backlog, and two healthy diurnal days as a backlog (36 h in one tick, then live: ~80 s;
live from the start takes ~200 s and runs in `bench/incidents.py --short`)."""

from __future__ import annotations

import pytest
from test_incidents_bench import bench

RUNS = [("generation-slower-de", "live"), ("generation-slower-de", "backlog"), ("generation-healthy-2d", "backlog")]


@pytest.mark.slow
@pytest.mark.parametrize("scenario, mode", RUNS)
def test_generation_replay_meets_every_target(scenario, mode, monkeypatch):
    """Onset within a window, the segment named, no premature resolve, the right verdict on >= 95% of the
    fault's windows and none of the opposite kind, no false page (the healthy days: none at all)."""
    from alerts_support import TOKEN

    monkeypatch.setenv("TW_SLACK_TOKEN", TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    truth, s, incidents, _ = bench.replay(scenario, bench.Plan.of(scenario, short=True), mode)
    assert bench.misses(truth, s) == [], (bench.row(scenario, mode, truth, s),
                                          [bench.describe(i) for i in incidents])
