"""latency: quantiles per stage vs baseline with their intervals, the n an interval needs, status rates."""

from __future__ import annotations

import numpy as np
import pytest

from checks.latency import LatencyThreshold, latency
from monitor.aggregate.partial import Partial


def find(findings, **labels):
    return next(f for f in findings if f.labels == labels)


def test_slower_total_and_stage_breach_with_stage_named(make, window, trailing):
    rng = np.random.default_rng(8)
    slow = make(1200, latency_ms=rng.lognormal(3, 0.4, 1200) * 3, **{"stage.model": rng.lognormal(2.5, 0.4, 1200) * 3,
                                                                     "stage.parse": np.zeros(1200)})
    findings = latency(window(slow), None, trailing, LatencyThreshold())
    p99 = find(findings, stage="total", quantile="p99")
    assert p99.status == "breach" and p99.effect > 2 and p99.n == 1200 and p99.detail["unit"] == "ms"
    assert find(findings, stage="model", quantile="p50").status == "breach"
    parse = find(findings, stage="parse", quantile="p50")
    assert parse.status == "ok" and parse.value == 0.0 and parse.baseline == 0.0 and parse.effect is None


def test_tail_quantiles_need_enough_values_and_a_baseline(sample, window, trailing):
    w = window(sample(300, np.random.default_rng(9)))
    findings = latency(w, None, trailing, LatencyThreshold())
    assert find(findings, stage="total", quantile="p95").status == "ok"
    p99 = find(findings, stage="total", quantile="p99")
    # The 95% interval of p99 needs 368 values: with fewer, the largest value may lie below the quantile.
    assert p99.status == "insufficient" and p99.detail["needed_n"] == 368
    assert p99.interval == (w.sketches["latency_ms"].min, w.sketches["latency_ms"].max)
    assert p99.detail["interval_level"] == pytest.approx(1 - 0.99 ** 300 - 0.01 ** 300)
    alone = latency(w, None, None, LatencyThreshold())
    assert {f.status for f in alone if "queue" not in f.labels} == {"insufficient"}
    # The queue trend compares the window with itself: it needs no baseline.
    assert find(alone, queue="completions_vs_arrivals").status == "ok"


def test_rates_with_wilson_intervals(make, window, trailing):
    statuses = ["timeout"] * 100 + ["ok"] * 400
    findings = latency(window(make(500, status=statuses)), None, trailing, LatencyThreshold())
    timeout = find(findings, rate="timeout")
    assert timeout.status == "breach" and timeout.value == 0.2 and timeout.interval[0] < 0.2 < timeout.interval[1]
    assert find(findings, rate="failure").status == "ok" and find(findings, rate="failure").value == 0.0


def test_empty_window_and_single_row(make, window, trailing):
    empty = latency(Partial(), None, trailing, LatencyThreshold())
    assert empty and {f.status for f in empty} == {"insufficient"}
    assert find(empty, stage="total", quantile="p50").value is None
    one = latency(window(make(1, latency_ms=[5.0])), None, trailing, LatencyThreshold())
    assert find(one, stage="total", quantile="p50").status == "insufficient"


def low_traffic(make, rng: np.random.Generator, n: int, tail_slowdown: float = 1.0):
    """n requests (a low-traffic window) whose model stage is `tail_slowdown` times slower for the
    slowest 15% of requests only: p50 holds, p95 and p99 move."""
    model, parse = rng.lognormal(3.0, 0.5, n), rng.lognormal(1.0, 0.3, n)
    model = np.where(model > np.quantile(model, 0.85), model * tail_slowdown, model)
    return make(n, latency_ms=model + parse, **{"stage.model": model, "stage.parse": parse})


def test_a_tail_slowdown_decides_at_low_traffic_and_names_the_stage(make, window):
    from datetime import UTC, datetime, timedelta

    from monitor.verdicts.verdict import decide

    rng = np.random.default_rng(19)
    baseline = window(low_traffic(make, rng, 165))
    start = datetime(2026, 3, 2, tzinfo=UTC)
    for slowdown, verdict in ((3.0, "slower"), (1.0, "healthy"), (1.3, "healthy")):
        findings = latency(window(low_traffic(make, rng, 165, slowdown)), None, baseline, LatencyThreshold())
        p50, p95 = find(findings, stage="total", quantile="p50"), find(findings, stage="total", quantile="p95")
        assert p50.status == "ok" and 0.8 < p50.effect < 1.25, slowdown
        assert p95.status == ("breach" if slowdown == 3.0 else "ok"), (slowdown, p95)
        # p99's interval needs 368 values: it says so instead of deciding.
        p99 = find(findings, stage="total", quantile="p99")
        assert p99.status == "insufficient" and p99.detail["needed_n"] == 368
        rows = [f.to_row("svc", "v1", start, start + timedelta(days=1)) for f in findings]
        v = decide(rows, service="svc", model_version="v1", window_start=start,
                   window_end=start + timedelta(days=1), now=start + timedelta(days=2))
        assert v.verdict == verdict, (slowdown, v.summary)
        if verdict == "slower":
            assert v.attribution["quantile"] == "p95" and v.attribution["top_stage"] == "model"
    # Below the absolute floor: the same 3x tail slowdown on a service answering in about a millisecond.
    fast, slow = rng.lognormal(-1.0, 0.5, 165), rng.lognormal(-1.0, 0.5, 165)
    slow = np.where(slow > np.quantile(slow, 0.85), slow * 3, slow)
    fast, slow = make(165, latency_ms=fast), make(165, latency_ms=slow)
    tiny = find(latency(window(slow), None, window(fast), LatencyThreshold()), stage="total", quantile="p95")
    assert tiny.status == "ok" and tiny.effect > 1.5


def test_every_quantile_with_a_value_has_an_interval_holding_it(make, window, trailing):
    rng = np.random.default_rng(5)
    for n in (1, 5, 6, 71, 72, 165, 400):
        findings = latency(window(low_traffic(make, rng, n)), None, trailing, LatencyThreshold())
        quantiles = [f for f in findings if "quantile" in f.labels]
        assert quantiles
        for f in quantiles:
            if f.value is None:
                continue
            low, high = f.interval
            # The estimate is the sketch's bin value: within its 1% relative accuracy of the interval.
            assert low * 0.99 <= f.value <= high * 1.01, (n, f)
            # With fewer values than the 95% interval needs, min..max at the coverage they give.
            enough = n >= f.detail["needed_n"]
            assert (f.status == "insufficient") == (not enough), (n, f)
            q = {"p50": 0.5, "p95": 0.95, "p99": 0.99}[f.labels["quantile"]]
            assert f.detail["interval_level"] == (0.95 if enough else pytest.approx(1 - q**n - (1 - q) ** n))


def test_healthy_windows_from_one_distribution_do_not_breach():
    """Many healthy windows and baselines drawn from one distribution, at low and at ordinary traffic:
    the interval rule and the floors keep every quantile of every stage from breaching."""
    from collections import Counter

    from monitor.aggregate.sketch import Sketch

    def partial(rng, n):
        model, parse = rng.lognormal(3.0, 0.5, n), rng.lognormal(1.0, 0.3, n)
        return Partial(Counter({"rows": n, "status:ok": n}), sketches={
            "latency_ms": Sketch.of(model + parse), "stage.model": Sketch.of(model), "stage.parse": Sketch.of(parse)})

    rng = np.random.default_rng(1234)
    decided = breaches = 0
    for n in (80, 165, 400, 2000):
        for _ in range(150):
            findings = latency(partial(rng, n), None, partial(rng, n), LatencyThreshold())
            quantiles = [f for f in findings if "quantile" in f.labels]
            decided += sum(f.status != "insufficient" for f in quantiles)
            breaches += sum(f.status == "breach" for f in quantiles)
    assert decided > 3000
    assert breaches == 0
