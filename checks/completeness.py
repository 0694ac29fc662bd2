"""Completeness: how often a field has no value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from checks.base import Finding
from checks.contract import Count, Share, check, decide
from checks.stats import wilson
from monitor.aggregate import keys
from monitor.aggregate.partial import Partial
from monitor.aggregate.profile import Profile


@dataclass(frozen=True)
class RateIncrease:
    """Breach when the window's rate is, with 95% confidence, more than `max_increase` above the top of
    the expected rate's band: with band `learned`, the 95% interval of the reference's (or history's) own
    rate (a small reference's rate is an estimate too); `none`, the rate itself. baseline
    `serving_history`: compared with the trailing history instead of the reference."""

    max_increase: Share = 0.05  # absolute, as a share of rows
    min_n: Count = 100  # rows below which the check says 'insufficient'
    band: Literal["learned", "none"] = "learned"
    baseline: Literal["reference", "serving_history"] = "reference"


@check("missing_rate", RateIncrease, "completeness", "share of rows (0..1)", "rows")
def missing_rate(window: Partial, profile: Profile | None, baseline: Partial | None,
                 params: RateIncrease) -> list[Finding]:
    """Share of rows (0..1) with no value, per feature and signal, against the reference's rate.

    Without a profile the trailing baseline's rate is the expected one; with neither, 'insufficient'.
    Fields: those of the profile and those with missing values in window or baseline.
    """
    names = set(profile.fields) if profile is not None else set()
    for part in (window, baseline):
        if part is not None:
            names |= {f for k in part.counts if (f := keys.field_of(k, keys.missing)) is not None}
    out = []
    for name in sorted(names):
        n, k = window.rows, window.counts[keys.missing(name)]
        ref = profile.fields.get(name) if profile is not None else None
        if ref is not None and ref.n and params.baseline == "reference":
            expected, source, (ek, en) = ref.missing_rate, "reference", (ref.missing, ref.n)
        elif baseline is not None and baseline.rows:
            ek, en = baseline.counts[keys.missing(name)], baseline.rows
            expected, source = ek / en, "baseline"
        else:
            expected, source, (ek, en) = None, None, (0, 0)
        value = k / n if n else None
        band = None if expected is None else wilson(ek, en) if params.band == "learned" else (expected, expected)
        (low, high), status = decide(k, n, None if band is None else band[1] + params.max_increase,
                                         n >= params.min_n)
        out.append(Finding("missing_rate", {"field": name}, value, status, n, baseline=expected,
                           effect=None if value is None or expected is None else value - expected,
                           interval=(low, high) if n else None,
                           detail={"missing": k, "expected_from": source,
                                   "band": list(band) if band is not None else None}))
    return out
