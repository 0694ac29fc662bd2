"""SLO rules: parsing, measuring on partials, and the multi-window burn rate."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from checks.rules import above, evaluate, measure, parse_objective
from monitor.aggregate.partial import Partial
from monitor.aggregate.sketch import Sketch
from monitor.config import SloRule

END = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("text,kind,op,threshold,stage,quantile,budget", [
    ("p95 total latency <= 100 ms", "latency", "<=", 100.0, "total", 0.95, 0.05),
    ("p99 model latency < 0.2 s", "latency", "<", 200.0, "model", 0.99, 0.01),
    ("P99.9 latency <= 1s", "latency", "<=", 1000.0, "total", 0.999, 0.001),
    ("mean batch_wait latency <= 5 ms", "latency", "<=", 5.0, "batch_wait", None, None),
    ("timeout rate <= 0.5%", "rate", "<=", 0.005, "total", None, 0.005),
    ("cache hit rate >= 80%", "rate", ">=", 0.8, "total", None, 0.2),
    ("non-ok rate < 0.02", "rate", "<", 0.02, "total", None, 0.02),
])
def test_parse(text, kind, op, threshold, stage, quantile, budget):
    o = parse_objective(text)
    assert (o.kind, o.op, o.stage, o.quantile) == (kind, op, stage, quantile)
    assert o.threshold == pytest.approx(threshold)
    assert o.budget == (None if budget is None else pytest.approx(budget))


@pytest.mark.parametrize("text", ["p95 latency", "latency <= 100 ms", "p95 total latency <= 100 parsecs",
                                  "timeout rate <= 150%", "teapot rate <= 1%", "p100 latency <= 1 ms"])
def test_parse_refuses(text):
    with pytest.raises(ValueError):
        parse_objective(text)


def test_rule_config_validates_the_slo():
    with pytest.raises(ValueError, match="cannot read SLO"):
        SloRule(name="x", slo="fast enough please")


def part(rows: int, timeouts: int = 0, latency_ms: float = 50.0, slow_share: float = 0.0) -> Partial:
    slow = int(rows * slow_share)
    values = np.r_[np.full(rows - slow, latency_ms), np.full(slow, latency_ms * 10)]
    return Partial(Counter({"rows": rows, "status:timeout": timeouts, "status:ok": rows - timeouts}),
                   sketches={"latency_ms": Sketch.of(values)})


def test_measure_latency_and_rates():
    p = part(1000, timeouts=7, latency_ms=50.0, slow_share=0.1)
    m = measure(parse_objective("p95 total latency <= 100 ms"), p)
    assert m.value == pytest.approx(500, rel=0.02) and m.bad_share == pytest.approx(0.1) and m.enough
    assert above(p.sketches["latency_ms"], 100.0) == 100
    r = measure(parse_objective("timeout rate <= 0.5%"), p)
    assert r.value == pytest.approx(0.007) and r.n == 1000 and r.enough
    thin = measure(parse_objective("timeout rate <= 0.5%"), part(50, timeouts=5))
    assert not thin.enough
    cached = Partial(Counter({"rows": 300, "cache:hit": 60, "cache:miss": 140}))
    c = measure(parse_objective("cache hit rate >= 50%"), cached)
    assert c.value == pytest.approx(0.3) and c.n == 200 and c.bad_share == pytest.approx(0.7) and c.enough


def loader(parts: dict[timedelta, Partial]):
    """load(start, end) answering by the stretch's length."""
    return lambda start, end: parts[end - start]


def rule(**kw) -> SloRule:
    return SloRule.model_validate({"name": "r", "slo": "timeout rate <= 1%", **kw})


def test_threshold_rule_fires_resolves_and_holds_on_thin_data():
    assert evaluate(rule(), loader({timedelta(minutes=15): part(1000, 30)}), END, timedelta(minutes=15)).active
    ok = evaluate(rule(), loader({timedelta(minutes=15): part(1000, 5)}), END, timedelta(minutes=15))
    assert ok.active is False and "0.50%" in ok.text
    assert evaluate(rule(), loader({timedelta(minutes=15): part(20, 5)}), END, timedelta(minutes=15)).active is None


@pytest.mark.parametrize("long_timeouts,short_timeouts,active", [
    (200, 20, True),   # 1h at 20x budget and 5m at 20x: fast burn on both windows
    (200, 0, False),   # the burst is over: the short window clears it
    (20, 20, False),   # 2x on the long window: budget spent slowly, not a page
])
def test_multi_window_burn_rate(long_timeouts, short_timeouts, active):
    r = rule(burn_rate=[{"long": "1h", "short": "5m", "factor": 14.4}])
    parts = {timedelta(hours=1): part(1000, long_timeouts), timedelta(minutes=5): part(100, short_timeouts),
             timedelta(minutes=15): part(300, 0)}
    result = evaluate(r, loader(parts), END, timedelta(minutes=15))
    assert result.active is active
    assert result.burn["1h"] == pytest.approx(long_timeouts / 1000 / 0.01)
    assert "burn rate" in result.text


def test_latency_burn_rate_counts_requests_over_the_threshold():
    r = SloRule.model_validate({"name": "lat", "slo": "p95 total latency <= 100 ms",
                                "burn_rate": [{"long": "1h", "short": "5m", "factor": 2}]})
    slow = {timedelta(hours=1): part(2000, slow_share=0.2), timedelta(minutes=5): part(400, slow_share=0.2),
            timedelta(minutes=15): part(600)}
    result = evaluate(r, loader(slow), END, timedelta(minutes=15))
    assert result.active and result.burn == {"1h": pytest.approx(4.0), "5m": pytest.approx(4.0)}
