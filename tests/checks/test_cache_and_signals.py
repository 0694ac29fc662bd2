"""cache_hit_rate and service_signal vs the trailing baseline."""

from __future__ import annotations

import numpy as np

from checks.cache import CacheThreshold, cache_hit_rate
from checks.signals import SignalThreshold, service_signal
from monitor.aggregate.partial import Partial


def test_cache_hit_rate_drop_breaches(make, window, trailing):
    w = window(make(400, cache_hit=[True] * 100 + [False] * 300))
    [f] = cache_hit_rate(w, None, trailing, CacheThreshold())
    assert f.status == "breach" and f.value == 0.25 and f.baseline > 0.55 and f.n == 400


def test_cache_ok_insufficient_and_absent(sample, make, window, trailing):
    [ok] = cache_hit_rate(window(sample(500, np.random.default_rng(10))), None, trailing, CacheThreshold())
    assert ok.status == "ok"
    [alone] = cache_hit_rate(window(make(300, cache_hit=[True] * 300)), None, None, CacheThreshold())
    assert alone.status == "insufficient" and alone.value == 1.0
    assert cache_hit_rate(window(make(10)), None, None, CacheThreshold()) == []
    assert cache_hit_rate(Partial(), None, trailing, CacheThreshold())[0].status == "insufficient"


def test_service_signal_mean_shift(make, window, schema, trailing):
    rng = np.random.default_rng(11)
    [f] = service_signal(window(make(300, queue_depth=rng.poisson(12, 300).astype(float)), schema), None, trailing,
                         SignalThreshold())
    assert f.status == "breach" and f.labels == {"signal": "queue_depth"} and f.effect > 1 and f.p_value < 1e-6
    assert f.detail["p95"] > f.detail["baseline_p95"]


def test_service_signal_ok_insufficient_and_nan(sample, make, window, schema, trailing):
    [ok] = service_signal(window(sample(500, np.random.default_rng(12)), schema), None, trailing, SignalThreshold())
    assert ok.status == "ok"
    [few] = service_signal(window(make(5, queue_depth=[1.0, np.nan, np.inf, 2.0, 3.0]), schema), None, trailing,
                           SignalThreshold())
    assert few.status == "insufficient" and few.n == 3 and few.value == 2.0
    [none] = service_signal(Partial(), None, trailing, SignalThreshold())
    assert none.status == "insufficient" and none.value is None
