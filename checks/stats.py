"""Shared math of the checks: proportion intervals, histogram distances and tests, multiple testing."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.spatial import distance
from scipy.stats import contingency

Z95 = 1.959963984540054


def wilson(k: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of the proportion k/n (95% by default); (0, 1) when n is 0. k and n may be
    effective (fractional) counts: both divided by a dispersion."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At k = 0 (or k = n) the bound is exactly 0 (1); the subtraction leaves a rounding error.
    return 0.0 if k <= 0 else max(0.0, centre - half), 1.0 if k >= n else min(1.0, centre + half)


def mover(value: float, interval: tuple[float, float], base: float,
          base_interval: tuple[float, float]) -> tuple[float, float]:
    """Interval of the difference value - base of two independent estimates, from each one's own interval
    (MOVER, Zou & Donner 2008): with Wilson intervals it is Newcombe's hybrid score interval."""
    (lo, hi), (b_lo, b_hi) = interval, base_interval
    d = value - base
    return d - math.hypot(value - lo, b_hi - base), d + math.hypot(hi - value, base - b_lo)


def mean_interval(mean: float, var: float | None, n: int) -> tuple[float, float] | None:
    """Student-t 95% interval of a mean from its sample variance; None below two values."""
    if var is None or n < 2:
        return None
    half = float(stats.t.ppf(0.975, n - 1)) * math.sqrt(var / n)
    return mean - half, mean + half


def quantile_ranks(n: int, q: float, level: float = 0.95) -> tuple[int, int] | None:
    """0-based ranks (low, high) of the order statistics that hold the q-quantile of n values with
    probability >= `level`, each tail <= (1 - level) / 2 (distribution-free: the count of values below the
    quantile is binomial(n, q)); None when n < quantile_needed(q, level)."""
    if n < quantile_needed(q, level):
        return None
    tail = (1 - level) / 2
    k = int(stats.binom.ppf(tail, n, q))
    low = k if stats.binom.cdf(k, n, q) <= tail else k - 1
    high = int(stats.binom.ppf(1 - tail, n, q))
    return max(low, 0), min(high, n - 1)


def quantile_needed(q: float, level: float = 0.95) -> int:
    """The fewest values whose order statistics bound the q-quantile on both sides at `level`: the
    smallest and largest of n values each miss it with probability max(q, 1 - q) ** n."""
    tail = (1 - level) / 2
    return max(1, math.ceil(math.log(tail) / math.log(max(q, 1 - q)) - 1e-12))


def quantile_level(n: int, q: float) -> float:
    """The probability that the smallest and largest of n values hold the q-quantile between them."""
    return max(0.0, 1 - q ** n - (1 - q) ** n) if n else 0.0


def poisson_interval(k: float) -> tuple[float, float]:
    """Exact (Garwood) 95% interval of a Poisson mean from one count k: the events expected in the same
    exposure. (0, 3.69) when k is 0."""
    low = float(stats.chi2.ppf(0.025, 2 * k) / 2) if k > 0 else 0.0
    return low, float(stats.chi2.ppf(0.975, 2 * k + 2) / 2)


def rate_ratio_interval(value: float, k_num: int, k_den: int) -> tuple[float, float] | None:
    """95% interval of a ratio of two event rates, each estimated as (k - 1) events over the span between
    its first and last event (a Poisson process: span x rate ~ Gamma(k - 1)), so the ratio of the
    estimates over the true ratio is F(2(k_num - 1), 2(k_den - 1)). Treats the two spans as independent,
    which widens the interval when they share requests. None below 2 events on either side."""
    if k_num < 2 or k_den < 2:
        return None
    f = stats.f(2 * (k_num - 1), 2 * (k_den - 1))
    return value / float(f.ppf(0.975)), value / float(f.ppf(0.025))


def dispersion(pairs: list[tuple[int, int]]) -> float:
    """How many times more a rate varies between buckets than independent draws would: Pearson chi-square
    of the (k, n) buckets over its degrees of freedom (the quasi-binomial scale), at least 1. 1 with
    fewer than two non-empty buckets or no events; events that come in clumps (a burst) raise it.

    The sum is the closed form of `pearson` on the buckets x (event, no event) table (scipy's statistic,
    equal to 1e-15): one pass over the pairs, without building a table per count key, bucket run and tick."""
    pairs = [(k, n) for k, n in pairs if n > 0]
    k_all, n_all = sum(k for k, _ in pairs), sum(n for _, n in pairs)
    if len(pairs) < 2 or k_all == 0 or k_all == n_all:
        return 1.0
    p = k_all / n_all
    chi2 = sum((k - n * p) ** 2 / (n * p * (1 - p)) for k, n in pairs)
    return max(1.0, chi2 / (len(pairs) - 1))


def table_dispersion(rows: list[tuple[int, ...]]) -> float:
    """The same for histograms: Pearson chi-square of the buckets x bins table over its degrees of
    freedom, at least 1; 1 with fewer than two non-empty buckets or bins. Repeated requests (retries,
    reloads) put the same value in a bucket twice and raise it."""
    t = np.asarray([r for r in rows if sum(r)], dtype=float)
    if t.ndim != 2 or len(t) < 2:
        return 1.0
    t = t[:, t.sum(axis=0) > 0]
    if t.shape[1] < 2:
        return 1.0
    chi2, dof = pearson(t)
    return max(1.0, chi2 / dof)


def shares(counts) -> np.ndarray:
    c = np.asarray(counts, dtype=float)
    total = c.sum()
    return c / total if total else c


def psi(reference, current) -> float:
    """Population stability index of two histograms on the same bins (empty bins smoothed as Evidently);
    NaN when either histogram is empty."""
    if not np.sum(reference) or not np.sum(current):
        return math.nan
    return float(psi_rows(np.asarray(reference, float)[None, :], np.asarray(current, float)[None, :])[0])


def psi_rows(reference: np.ndarray, current: np.ndarray) -> np.ndarray:
    """PSI of each row pair of two (runs x bins) count arrays; NaN for a row where either is empty."""
    ref, cur = _smoothed(reference), _smoothed(current)
    return np.sum((ref - cur) * np.log(ref / cur), axis=1)


def _smoothed(counts: np.ndarray) -> np.ndarray:
    # As Evidently's get_binned_data: empty bins get 1e-4, or 1e-6 of the smallest share if that is smaller.
    counts = np.asarray(counts, dtype=float)
    total = counts.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = counts / total
    nonzero = np.where(p > 0, p, np.inf).min(axis=1, keepdims=True)
    floor = np.where(nonzero <= 1e-4, nonzero / 1e6, 1e-4)
    return np.where(p == 0, floor, p)


def jensen_shannon(reference, current) -> float:
    """Jensen-Shannon distance (natural log, 0..sqrt(ln 2)) of two histograms on the same bins; NaN when
    either histogram is empty."""
    if not np.sum(reference) or not np.sum(current):
        return math.nan
    return float(distance.jensenshannon(shares(reference), shares(current)))


def chi2_two_sample(reference, current, dispersion: float = 1.0) -> tuple[float, float]:
    """Chi-square test that two histograms come from one distribution: (statistic, p-value).

    Both samples count as samples (a contingency table), so a small reference is not taken as truth.
    Bins empty in both are dropped, and adjacent bins are pooled until each holds an expected count of at
    least MIN_EXPECTED in both rows (a lone value where the reference has none would otherwise weigh as a
    large shift); (0, 1) when fewer than two bins remain. The p-value is of the statistic divided by
    `dispersion` (values that come in clumps carry less evidence than their count).
    """
    table = np.vstack([np.asarray(reference, float), np.asarray(current, float)])
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2 or (table.sum(axis=1) == 0).any():
        return 0.0, 1.0
    table = _pool_sparse(table)
    if table.shape[1] < 2:
        return 0.0, 1.0
    statistic, dof = pearson(table)
    return statistic, float(stats.chi2.sf(statistic / max(dispersion, 1.0), dof))


def pearson(table: np.ndarray) -> tuple[float, int]:
    """Pearson's chi-square statistic of an r x k contingency table with no zero row or column, and its
    degrees of freedom: `scipy.stats.chi2_contingency(table, correction=False)`'s statistic.

    Built on scipy's expected frequencies rather than calling chi2_contingency: its result object costs
    ~1.5 ms a call, 40x this, and a tick makes one call per field, window and segment (~3% of a tick)."""
    expected = contingency.expected_freq(table)
    return float(((table - expected) ** 2 / expected).sum()), (table.shape[0] - 1) * (table.shape[1] - 1)


MIN_EXPECTED = 5.0  # Cochran's rule: a cell expecting fewer values is far from its chi-square term


def _pool_sparse(table: np.ndarray) -> np.ndarray:
    """A 2 x k table with adjacent columns merged, left to right, until each column's smaller expected
    count reaches MIN_EXPECTED; a short last group joins the one before it."""
    rows = table.sum(axis=1)
    need = MIN_EXPECTED * rows.sum() / rows.min()  # the column total that gives the smaller row that count
    columns = table.sum(axis=0)
    if columns.min() >= need:
        return table
    group, filled, labels = 0, 0.0, np.empty(len(columns), dtype=int)
    for j, total in enumerate(columns):
        labels[j] = group
        filled += total
        if filled >= need:
            group, filled = group + 1, 0.0
    if filled and group:
        labels[labels == group] = group - 1
    pooled = np.zeros((2, int(labels.max()) + 1))
    np.add.at(pooled.T, labels, table.T)
    return pooled


def bh(p_values: list[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (scipy.stats.false_discovery_control)."""
    if not p_values:
        return []
    return [float(p) for p in stats.false_discovery_control(np.asarray(p_values, dtype=float), method="bh")]


def welch_p(mean_a: float, var_a: float, n_a: int, mean_b: float, var_b: float, n_b: int) -> float:
    """Two-sided p-value of Welch's t-test from summary statistics; 1.0 when it cannot be computed."""
    if n_a < 2 or n_b < 2:
        return 1.0
    se = math.sqrt(var_a / n_a + var_b / n_b)
    if se == 0:
        return 1.0 if mean_a == mean_b else 0.0
    res = stats.ttest_ind_from_stats(mean_a, math.sqrt(var_a), n_a, mean_b, math.sqrt(var_b), n_b, equal_var=False)
    return float(res.pvalue)


@dataclass(frozen=True)
class Comparison:
    """A window histogram against a reference histogram on the same bins."""

    psi: float
    js: float
    chi2: float
    p_value: float
    n: int  # window count


def compare(reference, current, dispersion: float = 1.0) -> Comparison:
    cur = np.asarray(current, dtype=float)
    chi2, p = chi2_two_sample(reference, cur, dispersion)
    return Comparison(psi(reference, cur), jensen_shannon(reference, cur), chi2, p, int(cur.sum()))
