"""Cache: the hit rate against the trailing baseline."""

from __future__ import annotations

from dataclasses import dataclass

from checks.base import Finding, check
from checks.stats import wilson
from monitor.partials import Partial
from monitor.profile import Profile


@dataclass(frozen=True)
class CacheThreshold:
    """Breach when the window's hit rate is, with 95% confidence, more than `max_drop` below baseline."""

    max_drop: float = 0.05  # absolute, share of lookups
    min_n: int = 100  # lookups (hits + misses) below which the check says 'insufficient'


@check("cache_hit_rate", CacheThreshold)
def cache_hit_rate(window: Partial, profile: Profile | None, baseline: Partial | None,
                   params: CacheThreshold) -> list[Finding]:
    """Share (0..1) of cache lookups that hit, vs the trailing baseline. Nothing when no row had
    `cache_hit`; 'insufficient' without a baseline with enough lookups."""
    hits, misses = window.counts["cache:hit"], window.counts["cache:miss"]
    n = hits + misses
    b_hits = baseline.counts["cache:hit"] if baseline is not None else 0
    b_n = b_hits + (baseline.counts["cache:miss"] if baseline is not None else 0)
    if n == 0 and b_n == 0:
        return []
    value = hits / n if n else None
    base = b_hits / b_n if b_n else None
    low, high = wilson(hits, n)
    if n < params.min_n or b_n < params.min_n:
        status = "insufficient"
    else:
        status = "breach" if high < base - params.max_drop else "ok"
    return [Finding("cache_hit_rate", {}, value, status, n, baseline=base,
                    effect=None if value is None or base is None else value - base,
                    interval=(low, high) if n else None, detail={"hits": hits, "misses": misses,
                                                                 "baseline_lookups": b_n})]
