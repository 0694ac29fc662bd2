"""Thresholds learned from the reference's own variation (bands), and the intervals of histogram statistics.

A band is what a statistic does when the window and the reference come from one distribution: the
statistic is run over resamples of the reference (a window of the window's size and a reference of the
reference's size, both drawn from the reference histogram), and its band is mean +- `sd` standard
deviations of those runs (NannyML's StandardDeviationThreshold). A range has an exact band: the share of
new values outside the range of N reference values is Beta(2, N - 1) distributed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats


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


def psi_rows(reference: np.ndarray, current: np.ndarray) -> np.ndarray:
    """PSI of each row pair of two (runs x bins) count arrays, empty bins smoothed as checks.stats.psi;
    NaN for a row where either histogram is empty."""
    ref, cur = _smoothed(reference), _smoothed(current)
    return np.sum((ref - cur) * np.log(ref / cur), axis=1)


def _smoothed(counts: np.ndarray) -> np.ndarray:
    counts = np.asarray(counts, dtype=float)
    total = counts.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = counts / total
    nonzero = np.where(p > 0, p, np.inf).min(axis=1, keepdims=True)
    floor = np.where(nonzero <= 1e-4, nonzero / 1e6, 1e-4)
    return np.where(p == 0, floor, p)


@lru_cache(maxsize=4096)
def psi_null(reference: tuple[int, ...], n: int, runs: int, seed: int) -> np.ndarray:
    """PSI of `runs` windows of `n` values against references of the reference's size, both drawn from
    the reference histogram (seeded, so a window scores the same every time)."""
    counts = np.asarray(reference, dtype=float)
    total = int(counts.sum())
    if not total or n <= 0:
        return np.zeros(0)
    rng = np.random.default_rng(seed)
    p = counts / total
    return psi_rows(rng.multinomial(total, p, size=runs), rng.multinomial(n, p, size=runs))


def psi_interval(reference: tuple[int, ...], window: tuple[int, ...], runs: int, seed: int) -> tuple[float, float]:
    """95% bootstrap interval of PSI(reference, window): both histograms redrawn from their own shares
    (seeded). (0, 0) for two empty histograms' worth of nothing; NaN-free."""
    ref, cur = np.asarray(reference, dtype=float), np.asarray(window, dtype=float)
    if not ref.sum() or not cur.sum():
        return 0.0, 0.0
    rng = np.random.default_rng(seed)
    values = psi_rows(rng.multinomial(int(ref.sum()), ref / ref.sum(), size=runs),
                      rng.multinomial(int(cur.sum()), cur / cur.sum(), size=runs))
    low, high = np.quantile(values[np.isfinite(values)], [0.025, 0.975])
    return float(low), float(high)


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
