"""Distribution drift: window histograms against the reference's, on the reference's bins."""

from __future__ import annotations

import math
from dataclasses import dataclass

from checks.base import Finding, check, widen
from checks.stats import bh, compare
from monitor.partials import Partial
from monitor.profile import FieldProfile, Profile


@dataclass(frozen=True)
class DriftThreshold:
    """Breach when the chi-square p-value (Benjamini-Hochberg across the check's fields) is below `alpha`
    and PSI is at least `psi_floor`: on large windows a tiny, significant shift is not drift."""

    alpha: float = 0.001
    psi_floor: float = 0.1
    min_n: int = 100  # window values below which the check says 'insufficient'


def histogram_findings(name: str, pairs: list[tuple[dict, FieldProfile, tuple[int, ...] | None, str]],
                       params: DriftThreshold, baseline: Partial | None = None) -> list[Finding]:
    """One finding per (labels, reference, window histogram, histogram key): value = PSI, effect =
    Jensen-Shannon distance, p_value = BH-adjusted chi-square p over the findings with enough samples.
    The chi-square is divided by the trailing baseline's dispersion of that histogram (`detail.dispersion`):
    repeated requests make a window's histogram vary more than its row count says."""
    rows = []
    for labels, ref, hist, key in pairs:
        if hist is None or len(hist) != ref.bins:
            continue  # window folded without this profile's bins
        phi = widen(baseline, f"hist:{key}")
        rows.append((labels, ref, hist, compare(ref.counts, hist, phi), phi))
    decidable = [i for i, r in enumerate(rows) if r[3].n >= params.min_n and r[1].present > 0]
    adjusted = dict(zip(decidable, bh([rows[i][3].p_value for i in decidable]), strict=True))
    out = []
    for i, (labels, ref, hist, c, phi) in enumerate(rows):
        p = adjusted.get(i)
        if p is None:
            status = "insufficient"
        else:
            status = "breach" if p < params.alpha and c.psi >= params.psi_floor else "ok"
        out.append(Finding(name, labels, _finite(c.psi), status, c.n, baseline=0.0, effect=_finite(c.js), p_value=p,
                           detail={"js": c.js, "chi2": c.chi2, "p_raw": c.p_value, "dispersion": phi, "bins": ref.bins,
                                   "reference": list(ref.counts), "window": list(hist)}))
    return out


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


@check("drift", DriftThreshold)
def drift(window: Partial, profile: Profile | None, baseline: Partial | None,
          params: DriftThreshold) -> list[Finding]:
    """PSI, Jensen-Shannon distance and chi-square p per numeric and categorical feature vs reference.

    Nothing without a profile.
    """
    if profile is None:
        return []
    pairs = [({"field": f}, ref, window.hists.get(f), f) for f, ref in sorted(profile.fields.items())
             if ref.kind in ("numeric", "categorical")]
    return histogram_findings("drift", pairs, params, baseline)


@check("prediction_drift", DriftThreshold)
def prediction_drift(window: Partial, profile: Profile | None, baseline: Partial | None,
                     params: DriftThreshold) -> list[Finding]:
    """Drift of the predicted class balance (`output: prediction`) and of each class score
    (`output: score:<class>`) vs the reference. Nothing without a profile."""
    if profile is None:
        return []
    pairs = []
    if profile.prediction is not None:
        pairs.append(({"output": "prediction"}, profile.prediction, window.hists.get("prediction"), "prediction"))
    for cls, ref in sorted(profile.scores.items()):
        pairs.append(({"output": f"score:{cls}"}, ref, window.hists.get(f"score:{cls}"), f"score:{cls}"))
    return histogram_findings("prediction_drift", pairs, params, baseline)
