"""Every service-check finding that has a value says how sure it is: its n and a 95% interval."""

from __future__ import annotations

import numpy as np
import pytest

from checks.evaluate import evaluate
from checks.routing import HotspotThreshold, hotspot
from checks.signals import SignalThreshold, service_signal

SERVICE_CHECKS = ("cache_hit_rate", "stale_cache", "hotspot", "service_signal")


@pytest.mark.parametrize("n, seed", [(600, 1), (120, 2), (3000, 3)])
def test_every_service_finding_with_a_value_has_n_and_an_interval(sample, window, schema, reference_profile,
                                                                  trailing, n, seed) -> None:
    rng = np.random.default_rng(seed)
    frame = sample(n, rng, cache_version=rng.choice(["v1", "v0"], n, p=[0.98, 0.02]),
                   route=rng.choice(["a", "b"], n), expert=rng.choice(["e1", "e2", "e3"], n))
    found = evaluate(window(frame, schema), reference_profile, trailing, only=SERVICE_CHECKS)
    assert {f.check for f in found} == set(SERVICE_CHECKS)
    valued = [f for f in found if f.value is not None]
    assert len(valued) >= 9  # hit rate, stale share, share and latency of three routing fields, a signal
    for f in valued:
        assert f.n > 0 and f.interval is not None, f
        lo, hi = f.interval
        assert lo <= hi and np.isfinite([lo, hi]).all(), f


def test_hotspot_latency_interval_holds_the_true_quantile(make, window) -> None:
    """The busiest replica's p95 bounds (binomial ranks read from the sketch) hold the population p95 in
    at least 93% of 200 windows; a replica slower by less than its uncertainty does not breach."""
    true_p95 = float(np.exp(3 + 0.3 * 1.6448536269514722))
    hits = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        replica = np.where(rng.random(800) < 0.5, "a", "b")
        f = hotspot(window(make(800, replica=replica, latency_ms=rng.lognormal(3, 0.3, 800))), None, None,
                    HotspotThreshold())[1]
        lo, hi = f.interval
        hits += lo * 0.99 <= true_p95 <= hi * 1.01  # the sketch reads values within 1%
    assert hits / 200 >= 0.93
    assert f.detail["interval_confidence"] >= 0.95 and f.detail["baseline_interval"] is not None
    from checks.latency import quantile_interval
    from monitor.aggregate.sketch import Sketch

    # Too few values for 95%: the interval is min..max and its confidence says so.
    assert quantile_interval(Sketch.of(np.arange(1.0, 11.0)), 0.95) == ((1.0, 10.0), pytest.approx(1 - 0.95 ** 10 - 0.05 ** 10))


def test_signal_interval_is_students_t(make, window, schema, trailing) -> None:
    from scipy import stats

    values = np.array([3.0, 5.0, 4.0, 6.0, 2.0, 4.0])
    [f] = service_signal(window(make(6, queue_depth=values), schema), None, trailing, SignalThreshold())
    expect = stats.t.interval(0.95, len(values) - 1, values.mean(), stats.sem(values))
    assert f.interval == pytest.approx(expect) and f.n == 6
