"""Ranges: numeric values outside the reference's range, categories the reference never had."""

from __future__ import annotations

from dataclasses import dataclass

from checks.base import Finding, check
from checks.stats import wilson
from monitor.partials import Partial
from monitor.profile import Profile


@dataclass(frozen=True)
class RateLimit:
    """Breach when the window's rate is, with 95% confidence, above `max_rate` plus the expected rate."""

    max_rate: float = 0.01  # share of present values
    min_n: int = 100  # present values below which the check says 'insufficient'


def _rate_finding(name: str, labels: dict, k: int, n: int, expected: float, params: RateLimit,
                  detail: dict) -> Finding:
    low, high = wilson(k, n)
    value = k / n if n else None
    status = "insufficient" if n < params.min_n else ("breach" if low > expected + params.max_rate else "ok")
    return Finding(name, labels, value, status, n, baseline=expected,
                   effect=None if value is None else value - expected,
                   interval=(low, high) if n else None, detail=detail)


@check("out_of_range", RateLimit)
def out_of_range(window: Partial, profile: Profile | None, baseline: Partial | None,
                 params: RateLimit) -> list[Finding]:
    """Share (0..1) of present numeric values below the reference min or above its max (inf included).

    Expected rate: 2 / (reference values + 1), the chance a new value from the same distribution falls
    outside the sample's range. Nothing without a profile.
    """
    if profile is None:
        return []
    out = []
    for name, ref in sorted(profile.fields.items()):
        if ref.kind != "numeric" or ref.min is None:
            continue
        below, above = window.counts[f"below:{name}"], window.counts[f"above:{name}"]
        n = window.rows - window.counts[f"missing:{name}"]
        expected = 2 / (ref.present + 1)
        out.append(_rate_finding("out_of_range", {"field": name}, below + above, n, expected, params,
                                 {"below": below, "above": above, "min": ref.min, "max": ref.max}))
    return out


@check("unseen_categories", RateLimit)
def unseen_categories(window: Partial, profile: Profile | None, baseline: Partial | None,
                      params: RateLimit) -> list[Finding]:
    """Share (0..1) of present categorical values the reference never had, with the most frequent of them.

    `detail.top`: up to 10 (value, count) among the retained unseen values. Nothing without a profile.
    """
    if profile is None:
        return []
    out = []
    for name, ref in sorted(profile.fields.items()):
        if ref.kind != "categorical":
            continue
        k = window.counts[f"unseen:{name}"]
        n = window.rows - window.counts[f"missing:{name}"]
        retained = window.unseen.get(name, {})
        top = sorted(retained.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
        # A truncated reference holds only its most frequent values: rare reference values count as unseen.
        out.append(_rate_finding("unseen_categories", {"field": name}, k, n, 0.0, params,
                                 {"unseen": k, "top": [list(t) for t in top], "reference_truncated": ref.truncated}))
    return out
