"""The quantile sketch: quantiles and bins equal ddsketch's, non-finite values skipped."""

from __future__ import annotations

import numpy as np
import pytest
from ddsketch import DDSketch

from monitor.aggregate.sketch import Sketch


@pytest.mark.parametrize("values", [
    np.random.default_rng(0).lognormal(3, 1, 5000),
    np.concatenate([np.zeros(100), np.random.default_rng(1).uniform(0, 50, 900)]),
    np.random.default_rng(2).normal(0, 10, 2000),
    np.array([7.0]),
])
def test_sketch_quantiles_match_ddsketch(values):
    ours, ref = Sketch.of(values), DDSketch(0.01)
    for v in values:
        ref.add(float(v))
    for q in (0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 1.0):
        assert ours.quantile(q) == pytest.approx(ref.get_quantile_value(q), rel=1e-9, abs=1e-12)
        exact = float(np.quantile(values, q, method="lower"))
        assert abs(ours.quantile(q) - exact) <= 0.0101 * abs(exact) + 1e-12
    assert ours.count == len(values) and ours.sum == pytest.approx(values.sum())


@pytest.mark.parametrize("values", [
    np.random.default_rng(0).lognormal(3, 1, 500),
    np.concatenate([np.zeros(10), np.random.default_rng(1).uniform(0, 50, 90)]),
    np.random.default_rng(2).normal(0, 10, 300),
    np.array([7.0]),
])
def test_sketch_bin_at_rank_holds_the_value_of_that_rank(values):
    # A bin spans (1 + 1%) / (1 - 1%): at most 2.02% of the values it holds.
    sketch, ordered = Sketch.of(values), np.sort(values)
    for rank, value in enumerate(ordered):
        low, high = sketch.bin_at_rank(rank)
        assert low <= value <= high and high - low <= 0.0203 * abs(value) + 1e-12, (rank, value, low, high)
    assert sketch.bin_at_rank(0)[0] == ordered[0] and sketch.bin_at_rank(len(values) - 1)[1] == ordered[-1]
    assert sketch.bin_at_rank(-1) is None and sketch.bin_at_rank(len(values)) is None


def test_sketch_skips_non_finite_and_empty_is_none():
    s = Sketch.of(np.array([np.nan, np.inf, -np.inf, 1.0]))
    assert s.count == 1 and s.quantile(0.5) == pytest.approx(1.0, rel=0.01)
    assert Sketch().quantile(0.5) is None and Sketch().mean is None and Sketch.of(np.array([])).count == 0
