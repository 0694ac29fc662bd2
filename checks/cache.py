"""Cache: the hit rate against the trailing baseline (also per cold / warm state), and stale hits."""

from __future__ import annotations

from dataclasses import dataclass

from checks.base import Finding, widen
from checks.contract import Count, Share, check, decide
from checks.stats import mover, wilson
from monitor.aggregate import keys
from monitor.aggregate.fold_service import CACHE_STATES
from monitor.aggregate.keys import STALE
from monitor.aggregate.partial import Partial
from monitor.aggregate.profile import Profile


@dataclass(frozen=True)
class CacheThreshold:
    """Breach when the window's hit rate is, with 95% confidence, more than `max_drop` below baseline: the
    interval of the difference (Newcombe's, from both rates' Wilson intervals) lies below -max_drop."""

    max_drop: Share = 0.05  # absolute, share of lookups
    min_n: Count = 100  # lookups (hits + misses) below which the check says 'insufficient'


@check("cache_hit_rate", CacheThreshold, "cache", "share of lookups that hit (0..1)", "lookups")
def cache_hit_rate(window: Partial, profile: Profile | None, baseline: Partial | None,
                   params: CacheThreshold) -> list[Finding]:
    """Share (0..1) of cache lookups that hit, vs the trailing baseline; also per cache state (label
    `state` cold / warm) when the log says which. Nothing when no row had `cache_hit`; 'insufficient'
    without a baseline with enough lookups."""
    out = _hit_rate(window, baseline, params, keys.cache_hit(), keys.cache_miss(), {})
    for state in CACHE_STATES:
        out += _hit_rate(window, baseline, params, keys.cache_hit(state), keys.cache_miss(state), {"state": state})
    return out


def _hit_rate(window: Partial, baseline: Partial | None, params: CacheThreshold, hit_key: str, miss_key: str,
              labels: dict[str, str]) -> list[Finding]:
    hits, misses = window.counts[hit_key], window.counts[miss_key]
    n = hits + misses
    b_hits = baseline.counts[hit_key] if baseline is not None else 0
    b_n = b_hits + (baseline.counts[miss_key] if baseline is not None else 0)
    if n == 0 and b_n == 0:
        return []
    value = hits / n if n else None
    base = b_hits / b_n if b_n else None
    low, high = wilson(hits, n)
    # The baseline is an estimate too; hit rates that vary between its buckets more than chance carry less.
    spread = widen(baseline, hit_key)
    diff = mover(value, (low, high), base, wilson(b_hits / spread, b_n / spread)) \
        if value is not None and base is not None else None
    if n < params.min_n or b_n < params.min_n or diff is None:
        status = "insufficient"
    else:
        status = "breach" if diff[1] < -params.max_drop else "ok"
    return [Finding("cache_hit_rate", labels, value, status, n, baseline=base,
                    effect=None if value is None or base is None else value - base,
                    interval=(low, high) if n else None,
                    detail={"hits": hits, "misses": misses, "baseline_lookups": b_n,
                            "baseline_interval": list(wilson(b_hits / spread, b_n / spread)) if b_n else None,
                            "difference_interval": None if diff is None else list(diff)})]


@dataclass(frozen=True)
class StaleThreshold:
    """Breach when the share of versioned hits that are stale is, with 95% confidence, above `max_rate`:
    a cache whose key has the version serves none, so any steady share is a key that forgot it."""

    max_rate: Share = 0.005  # share of cache hits that carry cache_version
    min_n: Count = 30  # hits with cache_version below which the check says 'insufficient'


@check("stale_cache", StaleThreshold, "cache", "share of versioned hits (0..1)", "hits with cache_version")
def stale_cache(window: Partial, profile: Profile | None, baseline: Partial | None,
                params: StaleThreshold) -> list[Finding]:
    """Share (0..1) of cache hits with `cache_version` whose result was made by another version: the
    cache_version names neither the serving model_version nor its preprocess_version (nor
    `<model>/<preprocess>`). `detail.top`: the stale cache_version values. Nothing when no hit in
    window or baseline carried cache_version; the baseline's share is shown, not compared with."""
    n, k = window.counts[keys.VERSIONED_HIT], window.counts[keys.STALE_HITS]
    b_n = baseline.counts[keys.VERSIONED_HIT] if baseline is not None else 0
    if n == 0 and b_n == 0:
        return []
    base = baseline.counts[keys.STALE_HITS] / b_n if b_n else None
    value = k / n if n else None
    (low, high), status = decide(k, n, params.max_rate, n >= params.min_n)
    top = sorted(window.unseen.get(STALE, {}).items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    return [Finding("stale_cache", {}, value, status, n, baseline=base,
                    effect=None if value is None or base is None else value - base,
                    interval=(low, high) if n else None,
                    detail={"stale": k, "hits_with_version": n, "hits": window.counts[keys.cache_hit()],
                            "top": [list(t) for t in top], "baseline_hits_with_version": b_n})]
