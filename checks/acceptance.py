"""Acceptance rules on labelled quality: a figure against its floor, or against its baseline's figure with
both uncertainties, and the false-discovery control of a family of such decisions. Stored check name:
acceptance."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from scipy import stats as sps
from scipy.optimize import brentq

from checks.base import Finding
from checks.contract import Contract, Count, Share, declare
from checks.quality import AVERAGES, FEEDBACK_MEAN, WILSON, Measure
from checks.stats import Z95, bh, mover, wilson


@dataclass(frozen=True)
class AcceptanceThreshold:
    """A rule breaches when the two-sided p-value of its drop past the tolerance is below `alpha`; a
    window's decisions are then re-decided at false discovery rate `fdr_q` (quality.fdr_q)."""

    min_n: Count = 30  # labelled predictions below which a rule is 'insufficient' (quality.min_n)
    alpha: Share = 0.05
    fdr_q: Share = 0.05


declare(Contract("acceptance", "quality", "quality", "the figure's own unit (0..1)", "labelled predictions",
                 AcceptanceThreshold.min_n, AcceptanceThreshold, "services[].quality.rules", doc=
                 "One acceptance rule on one group: the window's figure against its floor (`min`) or its "
                 "baseline's figure (`max_drop`), each with its n and 95% interval; p_value: the level at "
                 "which the difference reaches the tolerance. Breach below `alpha`, then re-decided by "
                 "Benjamini-Hochberg at `fdr_q` over the window's decisions."))


def acceptance_finding(rule: Any, group: str, observed: Finding | None, baseline: Finding | Measure | None,
                       baseline_from: str, min_n: int, alpha: float = AcceptanceThreshold.alpha) -> Finding:
    """One rule on one group, two estimates: the window's figure against its baseline (the reference's or
    the accepted version's figure, each with its n and 95% interval). A max_drop rule breaches when the
    drop value - baseline is below -max_drop beyond both uncertainties, a min rule when the figure is
    below min beyond its own: p_value (the level at which the two-sided interval of the difference
    reaches the tolerance) below `alpha`. `insufficient` below `min_n`, or without a value, interval or
    (for max_drop) a baseline with an interval. control_fdr re-decides a family of these."""
    name = rule.name or f"{rule.metric}:{rule.class_}:{rule.group}"
    labels = {"rule": name, "metric": rule.metric, "class": rule.class_, "group": group}
    base = None if baseline is None or baseline.value is None else baseline
    floor = rule.min if rule.min is not None else (None if base is None else base.value - rule.max_drop)
    detail: dict[str, Any] = {
        "baseline_from": baseline_from, "floor": floor, "max_drop": rule.max_drop, "min": rule.min,
        "baseline_n": None if base is None else base.n,
        "baseline_interval": None if base is None or base.interval is None else list(base.interval)}
    value = None if observed is None else observed.value
    why = ("no such figure" if observed is None else "n below min_n" if observed.n < min_n
           else "undefined or no interval" if value is None or observed.interval is None
           else "no baseline" if rule.min is None and base is None
           else "baseline has no interval" if rule.min is None and base.interval is None else None)
    if why is not None:
        return Finding("acceptance", labels, value, "insufficient", 0 if observed is None else observed.n,
                       None if base is None else base.value, interval=None if observed is None else observed.interval,
                       detail={**detail, "why": why})
    assert observed is not None and value is not None
    own = _bounds(observed, rule.metric, rule.class_)
    if rule.min is None:
        assert base is not None
        other = _bounds(base, rule.metric, rule.class_)
        tolerance = -rule.max_drop

        def diff(z: float) -> tuple[float, float]:
            return mover(value, own(z), base.value, other(z))
    else:
        tolerance = 0.0

        def diff(z: float) -> tuple[float, float]:
            lo, hi = own(z)
            return lo - rule.min, hi - rule.min
    p = _p_beyond(lambda z: diff(z)[1], tolerance)
    low, high = diff(Z95)
    # Clear only when the interval excludes the breach: a window too small to show a drop of the tolerance
    # cannot say the rule holds either, so it neither opens an incident nor resolves one.
    excludes = low >= tolerance
    status = "breach" if p < alpha else "ok" if excludes else "insufficient"
    detail |= {"difference": diff(0.0)[1], "difference_interval": [low, high], "tolerance": tolerance,
               "excludes_breach": excludes, "method": _method(rule.metric, rule.class_, rule.min is None)}
    if status == "insufficient":
        detail |= {"why": "the interval cannot exclude a breach", "needed_n": _needed(observed.n, low, diff(0.0)[0],
                                                                                    tolerance)}
    detail |= {k: v for k, v in observed.detail.items() if k == "failed_as_miss"}
    effect = None if base is None else value - base.value
    return Finding("acceptance", labels, value, status, observed.n, None if base is None else base.value, effect,
                   observed.interval, p, detail)


def wilson_figure(metric: str, cls: str) -> bool:
    """Whether the figure is a proportion with a Wilson interval (see `measure`)."""
    return metric in WILSON and cls not in AVERAGES


def _method(metric: str, cls: str, two: bool) -> str:
    if wilson_figure(metric, cls):
        return "newcombe" if two else "wilson"
    if metric == FEEDBACK_MEAN:
        return "mover-t" if two else "t"
    return "mover-bootstrap" if two else "bootstrap"


def _bounds(figure: Finding | Measure, metric: str, cls: str):
    """The figure's two-sided interval as a function of z (z = 1.96: its 95% interval): Wilson's from its
    count for a proportion, else its bootstrap (or t) interval's halves scaled by z / 1.96 (normal tails)."""
    value, (lo, hi), n = figure.value, figure.interval, figure.n
    if wilson_figure(metric, cls) and n > 0:
        k = value * n  # the proportion's count (precision of the predicted, recall of the support, accuracy)
        return lambda z: wilson(k, n, z)
    return lambda z: (value - (value - lo) * z / Z95, value + (hi - value) * z / Z95)


def _p_beyond(upper, tolerance: float, z_max: float = 40.0) -> float:
    """Two-sided p-value of 'the quantity is below `tolerance`' from its interval's upper end as a
    function of z: 2 * P(Z > z*) where upper(z*) = tolerance; 1 when the point itself is not below."""
    if upper(0.0) >= tolerance:
        return 1.0
    if upper(z_max) < tolerance:
        return float(2 * sps.norm.sf(z_max))
    z = float(brentq(lambda x: upper(x) - tolerance, 0.0, z_max, xtol=1e-9))
    return min(1.0, float(2 * sps.norm.sf(z)))


def _needed(n: int, low: float, point: float, tolerance: float) -> int | None:
    """About how many samples would make the interval's lower end clear `tolerance` at the same point
    estimate (its half-width shrinks as 1 / sqrt(n)); None when the point itself is past the tolerance."""
    half, room = point - low, point - tolerance
    if room <= 0 or half <= 0:
        return None
    return int(math.ceil(n * (half / room) ** 2))


def control_fdr(findings: list[Finding], q: float) -> list[Finding]:
    """Re-decide a family of decisions (acceptance rules, label bias: every test of a window's versions,
    classes and groups) by Benjamini-Hochberg at false discovery rate `q`: a finding that breached on its
    own stays a breach only when its adjusted p-value is below q; one that falls out is `ok` if it excluded
    the breach (detail `excludes_breach`, unset: it did) and `insufficient` if not. Insufficient findings
    are left as they are and do not count in the family; detail gains `p_adjusted`, `fdr_q` and `family`."""
    # Every test counts in the family, one that could not exclude a breach too (it has a p-value); a
    # finding's own decision is kept in `own_status`, so re-deciding a stored family is idempotent.
    tested = [i for i, f in enumerate(findings) if f.p_value is not None
              and (f.status != "insufficient" or "own_status" in f.detail or "excludes_breach" in f.detail)]
    adjusted = dict(zip(tested, bh([findings[i].p_value for i in tested]), strict=True))
    out = []
    for i, f in enumerate(findings):
        if i not in adjusted:
            out.append(f)
            continue
        own = f.detail.get("own_status", f.status)
        status = own
        if own == "breach" and adjusted[i] >= q:
            status = "ok" if f.detail.get("excludes_breach", True) else "insufficient"
        out.append(replace(f, status=status, detail={**f.detail, "own_status": own, "p_adjusted": adjusted[i],
                                                      "fdr_q": q, "family": len(tested)}))
    return out
