"""Ranges: numeric values outside the reference's range, categories the reference never had."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from checks.base import Finding
from checks.contract import Count, Share, check, decide
from checks.stats import wilson
from checks.thresholds import range_band, rise_p
from monitor.aggregate import keys
from monitor.aggregate.partial import Partial
from monitor.aggregate.profile import FieldProfile, Profile

Band = Literal["learned", "none"]
Against = Literal["reference", "serving_history"]


@dataclass(frozen=True)
class RateLimit:
    """Breach when the window's rate is, with 95% confidence, above `max_rate` plus the top of the
    expected rate's band.

    band `learned`: the band is what the reference's own size leaves open (out of range: the 1 -
    `band_alpha` quantile of the share of new values outside the range of its values; unseen: the
    Good-Turing share of categories seen once, with its interval); `none`: the expected rate alone.
    baseline `serving_history`: every field is compared with the service's trailing history instead of
    the reference (breach: at least `max_rate` above history's rate, one-sided two-proportion p below
    `band_alpha`). degenerate `serving_history`: a field constant in the reference is (the reference says
    nothing about how it varies); `reference`: it is compared with the reference like the others.
    """

    max_rate: Share = 0.01  # share of present values
    min_n: Count = 100  # present values below which the check says 'insufficient'
    band: Band = "learned"
    band_alpha: Share = 1e-4
    baseline: Against = "reference"
    degenerate: Against = "serving_history"


def _rate_finding(name: str, labels: dict, k: int, n: int, expected: float | None,
                  band: tuple[float, float] | None, params: RateLimit, detail: dict,
                  history: tuple[int, int] | None = None) -> Finding:
    """Against the reference: breach when the window's interval is above the band's top plus max_rate.
    Against `history` (its k, n): when the window's rate is at least max_rate above history's and the
    one-sided two-proportion p-value is below band_alpha (both rates are estimates)."""
    value = k / n if n else None
    p = rise_p(k, n, *history) if history is not None else None
    enough = n >= params.min_n and expected is not None
    (low, high), status = decide(k, n, None if band is None else band[1] + params.max_rate, enough)
    if history is not None and status != "insufficient":
        status = "breach" if value - expected >= params.max_rate and p < params.band_alpha else "ok"
    return Finding(name, labels, value, status, n, baseline=expected,
                   effect=None if value is None or expected is None else value - expected,
                   interval=(low, high) if n else None, p_value=p,
                   detail={**detail, "band": list(band) if band is not None else None})


def _history(baseline: Partial | None, count_keys: tuple[str, ...], name: str) -> tuple[float | None, tuple | None, dict,
                                                                                  tuple[int, int] | None]:
    """The trailing history's rate of `count_keys` over its present values of `name`, its 95% interval as the
    band, what the detail says, and its (k, n); rate, band and (k, n) None without history."""
    if baseline is None or not baseline.rows:
        return None, None, {"against": "serving_history", "note": "no serving history yet"}, None
    k = sum(baseline.counts[key] for key in count_keys)
    n = baseline.rows - baseline.counts[keys.missing(name)]
    if not n:
        return None, None, {"against": "serving_history", "note": "no value of the field in serving history"}, None
    return k / n, wilson(k, n), {"against": "serving_history", "history_n": n}, (k, n)


def _against(ref: FieldProfile, params: RateLimit) -> Against:
    if params.baseline == "serving_history" or params.degenerate == "serving_history" and ref.constant:
        return "serving_history"
    return "reference"


@check("out_of_range", RateLimit, "ranges", "share of present values (0..1)", "present values")
def out_of_range(window: Partial, profile: Profile | None, baseline: Partial | None,
                 params: RateLimit) -> list[Finding]:
    """Share (0..1) of present numeric values below the reference min or above its max (inf included).

    Expected rate: 2 / (reference values + 1), the chance a new value from the same distribution falls
    outside the sample's range; its band see RateLimit. Nothing without a profile.
    """
    if profile is None:
        return []
    out = []
    for name, ref in sorted(profile.fields.items()):
        if ref.kind != "numeric" or ref.min is None:
            continue
        below, above = window.counts[keys.below(name)], window.counts[keys.above(name)]
        n = window.rows - window.counts[keys.missing(name)]
        detail = {"below": below, "above": above, "min": ref.min, "max": ref.max}
        if _against(ref, params) == "serving_history":
            expected, band, note, history = _history(baseline, (keys.below(name), keys.above(name)), name)
            detail |= note | ({"constant_in_reference": True} if ref.constant else {})
        else:
            history = None
            mean, top = range_band(ref.present, params.band_alpha)
            expected, band = mean, (mean, top if params.band == "learned" else mean)
            detail["against"] = "reference"
        out.append(_rate_finding("out_of_range", {"field": name}, below + above, n, expected, band, params, detail,
                                 history))
    return out


@check("unseen_categories", RateLimit, "ranges", "share of present values (0..1)", "present values")
def unseen_categories(window: Partial, profile: Profile | None, baseline: Partial | None,
                      params: RateLimit) -> list[Finding]:
    """Share (0..1) of present categorical values the reference never had, with the most frequent of them.

    Expected rate 0; with the learned band, up to the Good-Turing share of new categories (reference
    categories seen once) and its interval. `detail.top`: up to 10 (value, count) among the retained
    unseen values. Nothing without a profile.
    """
    if profile is None:
        return []
    out = []
    for name, ref in sorted(profile.fields.items()):
        if ref.kind != "categorical":
            continue
        k = window.counts[keys.unseen(name)]
        n = window.rows - window.counts[keys.missing(name)]
        retained = window.unseen.get(name, {})
        top = sorted(retained.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
        # A truncated reference holds only its most frequent values: rare reference values count as unseen.
        detail = {"unseen": k, "top": [list(t) for t in top], "reference_truncated": ref.truncated}
        if params.baseline == "serving_history":
            expected, band, note, history = _history(baseline, (keys.unseen(name),), name)
            detail |= note
        else:
            history = None
            once = sum(1 for c in ref.counts[:-1] if c == 1)
            expected = 0.0
            band = (0.0, wilson(once, ref.present)[1] if params.band == "learned" and ref.present else 0.0)
            detail |= {"against": "reference", "seen_once": once}
        out.append(_rate_finding("unseen_categories", {"field": name}, k, n, expected, band, params, detail, history))
    return out
