"""Service signals: declared numeric signals (batch size, queue depth, memory...) vs trailing baseline."""

from __future__ import annotations

from dataclasses import dataclass

from checks.base import Finding
from checks.contract import Count, NonNegative, Share, check
from checks.stats import Z95, mean_interval, welch_p
from monitor.aggregate.partial import Partial
from monitor.aggregate.profile import Profile
from monitor.aggregate.sketch import Sketch

PREFIX = "signal:"


@dataclass(frozen=True)
class SignalThreshold:
    """Breach when the mean moved by more than `max_rel_change` of the baseline mean, by at least
    `min_effect_sd` of the baseline's standard deviation, and Welch's t-test p-value is below `alpha`.

    The relative change alone says nothing near a zero mean (queue depth 0.15 -> 0.10 is -33%); the
    standardized effect (Cohen's d against the baseline spread, 0.2 = "small") is unit-free, so it
    holds for every declared signal.
    """

    max_rel_change: NonNegative = 0.25
    min_effect_sd: NonNegative = 0.2
    alpha: Share = 0.001
    min_n: Count = 30  # values in window and baseline below which the check says 'insufficient'


@check("service_signal", SignalThreshold, "signals", "the signal's own unit (mean)", "values")
def service_signal(window: Partial, profile: Profile | None, baseline: Partial | None,
                   params: SignalThreshold) -> list[Finding]:
    """Mean of each signal (its own unit) vs the trailing baseline mean; effect = relative change.

    p95 of both in detail; interval: Student-t of the mean (the baseline's in detail). 'insufficient'
    without a baseline with enough values.
    """
    keys = sorted(k for k in window.sketches.keys() | (baseline.sketches.keys() if baseline else set())
                  if k.startswith(PREFIX))
    out = []
    for key in keys:
        w = window.sketches.get(key, Sketch())
        b = baseline.sketches.get(key, Sketch()) if baseline is not None else Sketch()
        value, base = w.mean, b.mean
        rel = (value - base) / abs(base) if value is not None and base else None
        p = None
        sd = b.var ** 0.5 if b.var is not None else None
        d = (value - base) / sd if value is not None and base is not None and sd else None
        if w.count < params.min_n or b.count < params.min_n:
            status = "insufficient"
        else:
            p = welch_p(value, w.var, w.count, base, b.var, b.count)
            moved = rel is None and value != base or rel is not None and abs(rel) > params.max_rel_change
            moved = moved and (d is None and value != base or d is not None and abs(d) >= params.min_effect_sd)
            status = "breach" if moved and p < params.alpha else "ok"
        out.append(Finding("service_signal", {"signal": key.removeprefix(PREFIX)}, value, status, w.count,
                           baseline=base, effect=rel, interval=_interval(w, b), p_value=p,
                           detail={"p95": w.quantile(0.95), "baseline_p95": b.quantile(0.95),
                                   "baseline_n": b.count, "effect_sd": d,
                                   "baseline_interval": _interval(b, Sketch())}))
    return out


def _interval(w: Sketch, b: Sketch) -> tuple[float, float] | None:
    """Student-t 95% interval of the window's mean; of a single value, the normal interval its baseline's
    spread gives it. None without a value, or a single one without a baseline spread."""
    if w.mean is None:
        return None
    if w.count >= 2:
        return mean_interval(w.mean, w.var, w.count)
    if b.var is None:
        return None
    half = Z95 * b.var ** 0.5
    return w.mean - half, w.mean + half
