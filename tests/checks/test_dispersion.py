"""Clumped events and near-zero signal means: the rules that keep a healthy service quiet."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from checks.base import trailing
from checks.latency import RATES, LatencyThreshold, latency
from checks.signals import SignalThreshold, service_signal
from checks.stats import dispersion, table_dispersion


def test_dispersion_is_one_for_independent_events_and_grows_with_clumps():
    rng = np.random.default_rng(5)
    independent = [(int(rng.binomial(300, 0.02)), 300) for _ in range(200)]
    assert dispersion(independent) < 1.3
    clumped = [(40 if i % 10 == 0 else 0, 300) for i in range(200)]  # one burst of 40 every 10 buckets
    assert dispersion(clumped) > 10
    assert dispersion([(0, 10), (0, 10)]) == 1.0 and dispersion([(3, 10)]) == 1.0
    assert table_dispersion([(10, 10), (10, 10), (11, 9)]) == 1.0


def test_a_reject_burst_the_baseline_has_seen_before_is_not_a_breach(make, window):
    def bucket(rejected: int, n: int = 300):
        return window(make(n, status=["rejected"] * rejected + ["ok"] * (n - rejected)))

    history = [bucket(40 if i % 10 == 0 else 0) for i in range(100)]  # bursts: 1.3% of requests overall
    burst = bucket(30, 400)  # 7.5% in a segment window: one big burst
    [plain] = [f for f in latency(burst, None, trailing(history, ()), LatencyThreshold()) if f.labels == {"rate": "reject"}]
    [wide] = [f for f in latency(burst, None, trailing(history, tuple(RATES.values())), LatencyThreshold())
              if f.labels == {"rate": "reject"}]
    assert plain.status == "breach" and wide.status == "ok" and wide.detail["dispersion"] > 10
    steady = [bucket(4) for _ in range(100)]  # the same 1.3%, spread evenly: a 7.5% window is news
    [news] = [f for f in latency(burst, None, trailing(steady, tuple(RATES.values())), LatencyThreshold())
              if f.labels == {"rate": "reject"}]
    assert news.status == "breach"


def test_signal_near_zero_mean_needs_an_effect_in_its_own_spread(make, window, schema):
    rng = np.random.default_rng(8)
    base = window(make(20000, queue_depth=(rng.random(20000) < 0.1) * rng.poisson(1.5, 20000).astype(float)), schema)
    quiet = window(make(2000, queue_depth=(rng.random(2000) < 0.07) * rng.poisson(1.5, 2000).astype(float)), schema)
    [f] = service_signal(quiet, None, base, SignalThreshold())
    assert f.effect < -0.25 and abs(f.detail["effect_sd"]) < 0.2 and f.status == "ok"
    busy = window(make(2000, queue_depth=rng.poisson(3, 2000).astype(float)), schema)
    [g] = service_signal(busy, None, base, SignalThreshold())
    assert g.status == "breach"


def test_dispersion_is_the_pearson_statistic_of_the_buckets_table():
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = rng.integers(1, 500, rng.integers(2, 20))
        k = rng.binomial(n, rng.uniform(0.01, 0.3))
        if not 0 < k.sum() < n.sum():
            continue
        table = np.column_stack([k, n - k]).astype(float)
        statistic, _, dof, _ = stats.chi2_contingency(table[table.sum(axis=1) > 0], correction=False)
        assert dispersion(list(zip(k.tolist(), n.tolist(), strict=True))) == pytest.approx(max(1.0, statistic / dof),
                                                                                          rel=1e-12)
