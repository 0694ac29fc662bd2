"""Distribution drift: window histograms against the reference's, on the reference's bins."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from checks.base import Finding, widen
from checks.contract import Count, NonNegative, Share, check
from checks.stats import bh, compare
from checks.thresholds import StandardDeviationThreshold, psi_interval, psi_null
from monitor.aggregate import keys
from monitor.aggregate.partial import Partial
from monitor.aggregate.profile import FieldProfile, Profile


@dataclass(frozen=True)
class DriftThreshold:
    """Breach when the chi-square p-value (Benjamini-Hochberg across the check's fields) is below `alpha`
    and PSI is at least `psi_floor` and, with its 95% interval, above the band: on large windows a tiny,
    significant shift is not drift, and on small ones a PSI whose interval reaches into the noise is not.

    band `learned`: PSI's interval must lie above the mean + `band_sd` sd of PSI over `runs` resamples of
    the reference (a window of the window's size and a reference of its own size, both drawn from the
    reference histogram; seeded by `seed`): what a reference this small scores against itself.
    baseline `serving_history`: every field is compared with the trailing history's histogram instead of
    the reference's; degenerate `serving_history`: a field constant in the reference is.
    """

    alpha: Share = 0.001
    psi_floor: NonNegative = 0.1
    min_n: Count = 100  # window values below which the check says 'insufficient'
    band: Literal["learned", "none"] = "learned"
    band_sd: NonNegative = 3.0
    runs: Count = 200  # resamples for the band and for PSI's interval
    seed: int = 0
    baseline: Literal["reference", "serving_history"] = "reference"
    degenerate: Literal["reference", "serving_history"] = "serving_history"


def histogram_findings(name: str, pairs: list[tuple[dict, FieldProfile, tuple[int, ...] | None, str]],
                       params: DriftThreshold, baseline: Partial | None = None) -> list[Finding]:
    """One finding per (labels, reference, window histogram, histogram key): value = PSI with its 95%
    bootstrap interval, effect = Jensen-Shannon distance, p_value = BH-adjusted chi-square p over the
    findings with enough samples. `detail.shifted`: significant with PSI above the band, whatever its size
    or interval (what an open episode holds on); a breach also needs PSI at `psi_floor` and the low end of
    its interval above the band. The chi-square is divided by the trailing baseline's
    dispersion of that histogram (`detail.dispersion`): repeated requests make a window's histogram vary
    more than its row count says. A field compared with serving history (see DriftThreshold) without any is 'insufficient'."""
    rows = []
    for labels, ref, hist, key in pairs:
        if hist is None or len(hist) != ref.bins:
            continue  # window folded without this profile's bins
        against: dict = {"against": "reference"}
        if params.baseline == "serving_history" or params.degenerate == "serving_history" and ref.constant:
            against = {"against": "serving_history", **({"constant_in_reference": True} if ref.constant else {})}
            own = baseline.hists.get(key) if baseline is not None else None
            if own is None or len(own) != ref.bins or not sum(own):
                rows.append((labels, None, hist, None, 1.0, {**against, "note": "no serving history yet"}))
                continue
            ref = replace(ref, counts=tuple(own), n=sum(own), missing=0)
        phi = widen(baseline, f"hist:{key}")
        rows.append((labels, ref, hist, compare(ref.counts, hist, phi), phi, against))
    decidable = [i for i, r in enumerate(rows) if r[3] is not None and r[3].n >= params.min_n and r[1].present > 0]
    adjusted = dict(zip(decidable, bh([rows[i][3].p_value for i in decidable]), strict=True))
    out = []
    for i, (labels, ref, hist, c, phi, against) in enumerate(rows):
        n = int(sum(hist))
        if c is None:  # nothing to compare with yet
            out.append(Finding(name, labels, None, "insufficient", n, detail={**against, "window": list(hist)}))
            continue
        band = _band(ref.counts, c.n, params)
        finite = math.isfinite(c.psi)
        low, high = psi_interval(ref.counts, hist, params.runs, params.seed) if finite else (0.0, 0.0)
        p = adjusted.get(i)
        shifted = p is not None and p < params.alpha and c.psi >= band[1]
        if p is None:
            status = "insufficient"
        else:
            # The low end of PSI's interval, not PSI alone, must clear the band: a quiet night window's few
            # values put PSI above the band by chance, and a week of windows holds one that passes alpha too.
            edge = low if finite else c.psi
            status = "breach" if shifted and c.psi >= params.psi_floor and edge >= band[1] else "ok"
        out.append(Finding(name, labels, _finite(c.psi), status, c.n, baseline=0.0, effect=_finite(c.js), p_value=p,
                           interval=(low, high) if finite else None,
                           detail={"js": c.js, "chi2": c.chi2, "p_raw": c.p_value, "dispersion": phi, "bins": ref.bins,
                                   "band": list(band), "reference": list(ref.counts), "window": list(hist),
                                   "shifted": shifted, **against}))
    return out


def _band(reference: tuple[int, ...], n: int, params: DriftThreshold) -> tuple[float, float]:
    """The learned PSI band of a window of `n` values against `reference` ((0, 0) with band `none`)."""
    if params.band != "learned" or n <= 0:
        return 0.0, 0.0
    return StandardDeviationThreshold(params.band_sd).band(psi_null(tuple(reference), n, params.runs, params.seed))


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


@check("drift", DriftThreshold, "drift", "PSI (Jensen-Shannon distance as effect)", "window values")
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


@check("prediction_drift", DriftThreshold, "predictions", "PSI (Jensen-Shannon distance as effect)",
       "predictions")
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
        pairs.append(({"output": keys.score(cls)}, ref, window.hists.get(keys.score(cls)), keys.score(cls)))
    return histogram_findings("prediction_drift", pairs, params, baseline)
