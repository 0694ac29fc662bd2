"""Latency: total and per-stage quantiles, and failure / timeout / reject rates, vs trailing baseline."""

from __future__ import annotations

from dataclasses import dataclass

from checks.base import Finding, check, widen
from checks.stats import wilson
from monitor.frame import STAGE_PREFIX
from monitor.partials import LATENCY, Partial, Sketch
from monitor.profile import Profile

QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
RATES = {"failure": "status:error", "timeout": "status:timeout", "reject": "status:rejected"}


@dataclass(frozen=True)
class LatencyThreshold:
    """Quantiles breach when the window's is more than `max_ratio` times and `min_delta_ms` above the
    baseline's; rates breach when the window's Wilson lower bound exceeds baseline + `max_rate_increase`.
    The bound is taken on n / dispersion requests: rejects and timeouts come in clumps (a client's
    burst), and the trailing buckets say how much more than independent requests they vary."""

    max_ratio: float = 1.5
    min_delta_ms: float = 5.0  # ignore slowdowns smaller than this, however large the ratio
    tail_samples: int = 10  # a quantile q needs tail_samples / (1 - q) values in window and baseline
    max_rate_increase: float = 0.02  # absolute, share of requests
    min_n: int = 100  # requests below which rates are 'insufficient'


def _needed(q: float, params: LatencyThreshold) -> int:
    return int(round(params.tail_samples / (1 - q))) if q < 1 else 1 << 62


def _stage(key: str) -> str:
    return "total" if key == LATENCY else key.removeprefix(STAGE_PREFIX)


@check("latency", LatencyThreshold)
def latency(window: Partial, profile: Profile | None, baseline: Partial | None,
            params: LatencyThreshold) -> list[Finding]:
    """p50 / p95 / p99 in ms of total latency and of each stage (labels stage, quantile), and the share
    of requests that failed, timed out or were rejected (label rate). Quantiles with too few values in
    window or baseline, and everything without a baseline, are 'insufficient'."""
    out = []
    keys = sorted(k for k in window.sketches.keys() | (baseline.sketches.keys() if baseline else set())
                  if k == LATENCY or k.startswith(STAGE_PREFIX))
    for key in keys:
        w = window.sketches.get(key, Sketch())
        b = baseline.sketches.get(key, Sketch()) if baseline is not None else Sketch()
        for label, q in QUANTILES.items():
            value, base = w.quantile(q), b.quantile(q)
            need = _needed(q, params)
            if w.count < need or b.count < need or value is None or base is None:
                status = "insufficient"
            else:
                slower = value > base * params.max_ratio and value - base > params.min_delta_ms
                status = "breach" if slower else "ok"
            ratio = value / base if value is not None and base else None
            out.append(Finding("latency", {"stage": _stage(key), "quantile": label}, value, status, w.count,
                               baseline=base, effect=ratio,
                               detail={"unit": "ms", "baseline_n": b.count, "needed_n": need,
                                       "relative_accuracy": 0.01}))
    for label, key in RATES.items():
        n, k = window.rows, window.counts[key]
        b_n = baseline.rows if baseline is not None else 0
        base = baseline.counts[key] / b_n if b_n else None
        phi = widen(baseline, key)
        low, high = wilson(k / phi, n / phi)
        if n < params.min_n or b_n < params.min_n:
            status = "insufficient"
        else:
            status = "breach" if low > base + params.max_rate_increase else "ok"
        value = k / n if n else None
        out.append(Finding("latency", {"rate": label}, value, status, n, baseline=base,
                           effect=None if value is None or base is None else value - base,
                           interval=(low, high) if n else None,
                           detail={"count": k, "baseline_n": b_n, "dispersion": phi}))
    return out
