"""The generation service's segment-only slowdown replayed as `bench/incidents.py --short` replays it (live,
a tick every 15 minutes, alerts to the fake Slack): one `slower` incident dated to the draft-model change,
naming `lang=de`, resolved after the rollback; and how the bench scores a segment fault."""

from __future__ import annotations

import importlib.util
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    if "bench_incidents" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_incidents", ROOT / "bench" / "incidents.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_incidents"] = module
        spec.loader.exec_module(module)
    return sys.modules["bench_incidents"]


@pytest.mark.slow  # ~40 s: 4 h at 3 requests a second, 17 ticks
def test_segment_slowdown_meets_every_target(monkeypatch):
    sys.path.insert(0, str(ROOT / "tests" / "alerts"))
    from alerts_support import TOKEN

    bench = _bench()
    monkeypatch.setenv("TW_SLACK_TOKEN", TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    scenario = "generation-slower-de"
    truth, s, incidents, _ = bench.replay(scenario, bench.Plan.of(scenario, short=True), "live")
    assert truth.segment == "lang=de" and truth.verdict == "slower"
    assert bench.misses(truth, s) == [], (bench.row(scenario, "live", truth, s), [bench.describe(i) for i in incidents])
    assert s.segment_named and s.false_pages == 0


def test_a_segment_fault_needs_its_segment_named():
    """An incident about a segment-only fault that does not name the segment misses; one that does meets it."""
    bench = _bench()
    t0 = datetime(2026, 11, 2, tzinfo=UTC)
    hours = lambda h: t0 + timedelta(hours=h)  # noqa: E731
    truth = bench.Truth("slower", t0, hours(4), hours(1), hours(2.5), "llm-8b-v1", "llm-8b-v1", segment="lang=de")
    windows = [{"model_version": "llm-8b-v1", "window_start": hours(1 + i / 4), "window_end": hours(1.25 + i / 4),
                "verdict": "slower"} for i in range(6)]

    def incident(summary: dict) -> dict:
        return {"id": 1, "verdict": "slower", "model_version": "llm-8b-v1", "opened_at": hours(1.25),
                "first_window_start": hours(1), "resolved_at": hours(2.75), "summary": summary}

    overall = bench.score(truth, [incident({"severity": "page", "headline": "SLOWER: p99 latency"})], windows)
    assert bench.misses(truth, overall) == ["segment lang=de not named"] and overall.segment_named is False
    named = bench.score(truth, [incident({"severity": "page", "evidence": [{"labels": {"segment": "lang=de"}}]})],
                        windows)
    assert bench.misses(truth, named) == [] and named.segment_named is True
    whole = bench.Truth("slower", t0, hours(4), hours(1), hours(2.5), "v1", "v1")  # no segment: not asked
    assert bench.score(whole, [incident({"severity": "page"})], windows).segment_named is None
