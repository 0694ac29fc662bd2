"""Thresholds learned from the reference's own variation (bands), and the intervals of histogram statistics.

A band is what a statistic does when the window and the reference come from one distribution: the
statistic is run over resamples of the reference (a window of the window's size and a reference of the
reference's size, both drawn from the reference histogram by the Poisson bootstrap), and its band is mean +- `sd` standard
deviations of those runs (NannyML's StandardDeviationThreshold). A range has an exact band: the share of
new values outside the range of N reference values is Beta(2, N - 1) distributed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats

from checks.stats import psi_rows


@dataclass(frozen=True)
class StandardDeviationThreshold:
    """Band of mean +- `sd` standard deviations of a statistic's runs over the reference, clipped to
    [`lower_limit`, `upper_limit`]."""

    sd: float = 3.0
    lower_limit: float = 0.0
    upper_limit: float = math.inf

    def band(self, runs: np.ndarray) -> tuple[float, float]:
        """(low, high) of `runs` (one value per run); (lower_limit, lower_limit) when there are none."""
        runs = np.asarray(runs, dtype=float)
        runs = runs[np.isfinite(runs)]
        if not len(runs):
            return self.lower_limit, self.lower_limit
        mean, spread = float(runs.mean()), float(runs.std(ddof=1)) if len(runs) > 1 else 0.0
        return (max(self.lower_limit, mean - self.sd * spread), min(self.upper_limit, mean + self.sd * spread))


def psi_null(reference: tuple[int, ...], n: int, runs: int, seed: int) -> np.ndarray:
    """PSI of `runs` windows of about `n` values against references of the reference's size, both drawn
    from the reference histogram (seeded, so a window scores the same every time). `n` is taken to two
    significant digits: windows of one length hold about as many values, and share the runs."""
    return _psi_null(reference, int(float(f"{n:.2g}")) if n > 0 else 0, runs, seed)


@lru_cache(maxsize=4096)
def _psi_null(reference: tuple[int, ...], n: int, runs: int, seed: int) -> np.ndarray:
    counts = np.asarray(reference, dtype=float)
    total = int(counts.sum())
    if not total or n <= 0:
        return np.zeros(0)
    rng = np.random.default_rng(seed)
    p = counts / total
    return psi_rows(_redrawn(rng, total * p, runs), _redrawn(rng, n * p, runs))


def psi_interval(reference: tuple[int, ...], window: tuple[int, ...], runs: int, seed: int) -> tuple[float, float]:
    """95% bootstrap interval of PSI(reference, window): both histograms redrawn from their own shares
    (seeded), the 2.5 and 97.5 percentiles moved down by the bootstrap's bias (redrawn histograms differ
    more than the two they come from), and held to contain the estimate. (0, 0) when either is empty."""
    ref, cur = np.asarray(reference, dtype=float), np.asarray(window, dtype=float)
    if not ref.sum() or not cur.sum():
        return 0.0, 0.0
    value = float(psi_rows(ref[None, :], cur[None, :])[0])
    rng = np.random.default_rng(seed)
    runs_ = psi_rows(_redrawn(rng, ref, runs), _redrawn(rng, cur, runs))
    runs_ = runs_[np.isfinite(runs_)]
    if not len(runs_):
        return value, value
    bias = float(runs_.mean()) - value
    low, high = np.quantile(runs_, [0.025, 0.975]) - bias
    return max(0.0, min(float(low), value)), max(float(high), value)


def _redrawn(rng: np.random.Generator, expected: np.ndarray, runs: int) -> np.ndarray:
    """`runs` histograms redrawn around `expected` counts: each bin Poisson (the Poisson bootstrap; its
    shares are a multinomial's, and it is several times faster to draw)."""
    return rng.poisson(np.broadcast_to(expected, (runs, len(expected))))


@lru_cache(maxsize=4096)
def range_band(present: int, alpha: float) -> tuple[float, float]:
    """Band of the share of new values outside the range (min..max) of `present` reference values:
    (mean, the 1 - alpha quantile) of Beta(2, present - 1). (0, 1) for fewer than two values."""
    if present < 2:
        return 0.0, 1.0
    return 2 / (present + 1), float(stats.beta.ppf(1 - alpha, 2, present - 1))


def range_rows_needed(max_rate: float, alpha: float) -> int:
    """Reference values needed for range_band's upper end to stay within `max_rate`."""
    lo, hi = 2, 2
    while range_band(hi, alpha)[1] > max_rate:
        lo, hi = hi, hi * 2
    while lo < hi:  # the band narrows as the reference grows
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if range_band(mid, alpha)[1] > max_rate else (lo, mid)
    return lo


def rise_p(k: int, n: int, k0: int, n0: int) -> float:
    """One-sided p-value that the rate k / n is above the rate k0 / n0 (two-proportion z-test, pooled);
    1.0 when either has no trials or the pooled rate is 0 or 1."""
    if not n or not n0:
        return 1.0
    pooled = (k + k0) / (n + n0)
    if pooled in (0.0, 1.0):
        return 1.0
    z = (k / n - k0 / n0) / math.sqrt(pooled * (1 - pooled) * (1 / n + 1 / n0))
    return float(stats.norm.sf(z))
