"""latency: quantiles per stage vs baseline, zero-duration stages, tail sample rule, status rates."""

from __future__ import annotations

import numpy as np

from checks.latency import LatencyThreshold, latency
from monitor.partials import Partial


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
    w = window(sample(500, np.random.default_rng(9)))
    findings = latency(w, None, trailing, LatencyThreshold())
    assert find(findings, stage="total", quantile="p95").status == "ok"
    assert find(findings, stage="total", quantile="p99").status == "insufficient"  # needs 1000 values
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
