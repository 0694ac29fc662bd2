"""Latency: total, per-stage, per-input-length and time-to-first-token quantiles, output tokens per
second, failure / timeout / reject rates, throughput and queue trend, vs the trailing baseline."""

from __future__ import annotations

import math
from dataclasses import dataclass

from checks.base import Finding, widen
from checks.contract import Count, NonNegative, Positive, Share, check, decide
from checks.stats import (
    Z95,
    poisson_interval,
    quantile_level,
    quantile_needed,
    quantile_ranks,
    rate_ratio_interval,
)
from monitor.aggregate import keys
from monitor.aggregate.keys import (
    ARRIVAL,
    BY_LENGTH,
    COMPLETION,
    LATENCY,
    STAGE_PREFIX,
    TOKENS,
    TOKENS_PER_S,
    TTFT,
    UNTIMED_TIMEOUTS,
)
from monitor.aggregate.partial import Partial
from monitor.aggregate.profile import Profile
from monitor.aggregate.sketch import RELATIVE_ACCURACY, Sketch

QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
LEVEL = 0.95  # coverage of the quantile intervals
RATES = {"failure": keys.ERROR, "timeout": keys.TIMEOUT, "reject": keys.REJECTED,
         "cancelled": keys.status("cancelled"), "truncated": keys.status("truncated")}
# Statuses many services never log: their rate is measured once a window or its baseline holds one.
LOGGED_RATES = ("cancelled", "truncated")


@dataclass(frozen=True)
class LatencyThreshold:
    """Quantiles breach when the window's 95% interval lies wholly above the baseline's and the window's
    quantile is more than `max_ratio` times and `min_delta_ms` above the baseline's; rates breach
    when the window's Wilson lower bound exceeds baseline + `max_rate_increase`. The bound is taken on n / dispersion requests: rejects and timeouts come in clumps (a client's
    burst), and the trailing buckets say how much more than independent requests they vary."""

    max_ratio: Positive = 1.5
    min_delta_ms: NonNegative = 5.0  # ignore slowdowns smaller than this, however large the ratio
    max_rate_increase: Share = 0.02  # absolute, share of requests
    min_n: Count = 100  # requests below which rates are 'insufficient'
    # Output tokens per second breach when the window's p50 interval lies wholly below the baseline's and
    # its p50 below the baseline's / max_ratio.
    # Throughput (per second of the window's arrival span) breaches below min_throughput_ratio x baseline;
    # 0 reports it without deciding (traffic follows the clock; use same_hour_7d baselines to judge it).
    min_throughput_ratio: NonNegative = 0.0
    # Queue trend: completions per second over arrivals per second (arrival span / completion span);
    # breach below 1 - max_backlog_share, i.e. the last requests finished that share of the span late.
    max_backlog_share: Share = 0.2
    min_span_s: NonNegative = 60.0  # arrival span below which throughput and queue trend are 'insufficient'


def quantile_interval(sketch: Sketch, q: float) -> tuple[tuple[float, float] | None, float]:
    """The interval of the sketch's q-quantile and its coverage: the 95% order-statistic interval (its
    rank bounds mapped to their bins' edges), or with too few values for it, min..max and the lower
    probability that they hold the quantile. (None, 0) when the sketch is empty."""
    ranks = quantile_ranks(sketch.count, q, LEVEL)
    if ranks is None:
        if not sketch.count:
            return None, 0.0
        return (sketch.min, sketch.max), quantile_level(sketch.count, q)
    low, high = sketch.bin_at_rank(ranks[0]), sketch.bin_at_rank(ranks[1])
    return (low[0], high[1]), LEVEL


def _quantile(key: dict[str, str], w: Sketch, b: Sketch, q: float, lower_is_worse: bool, unit: str,
              params: LatencyThreshold, extra: dict | None = None) -> Finding:
    """The finding of quantile q of window sketch `w` against baseline sketch `b`: a breach when the two
    95% intervals do not overlap in the harmful direction and the estimates clear the effect floors
    (max_ratio, and min_delta_ms for latency). `extra` is added to its detail."""
    value, base = w.quantile(q), b.quantile(q)
    interval, level = quantile_interval(w, q)
    b_interval, b_level = quantile_interval(b, q)
    need = quantile_needed(q, LEVEL)
    if w.count < need or b.count < need or value is None or base is None or lower_is_worse and not base:
        status = "insufficient"
    elif lower_is_worse:
        worse = interval[1] < b_interval[0] and value < base / params.max_ratio
        status = "breach" if worse else "ok"
    else:
        worse = (interval[0] > b_interval[1] and value > base * params.max_ratio
                 and value - base > params.min_delta_ms)
        status = "breach" if worse else "ok"
    ratio = value / base if value is not None and base else None
    return Finding("latency", key, value, status, w.count, baseline=base, effect=ratio, interval=interval,
                   detail={"unit": unit, "baseline_n": b.count, "needed_n": need, "interval_level": level,
                           "baseline_interval": b_interval, "baseline_interval_level": b_level,
                           "relative_accuracy": RELATIVE_ACCURACY, **(extra or {})})


def _labels(key: str) -> dict[str, str]:
    """Labels of a latency sketch key: the stage, and the input-length bucket of `latency_by:` keys."""
    if key == LATENCY:
        return {"stage": "total"}
    if key == TTFT:
        return {"stage": "ttft"}
    if key.startswith(BY_LENGTH):
        source, bucket = key.removeprefix(BY_LENGTH).rsplit("@", 1)
        return {"stage": "total", "length": source, "bucket": bucket}
    return {"stage": key.removeprefix(STAGE_PREFIX)}


def _is_latency(key: str) -> bool:
    return key in (LATENCY, TTFT) or key.startswith(STAGE_PREFIX) or key.startswith(BY_LENGTH)


@check("latency", LatencyThreshold, "latency", "ms (quantiles); share of requests (rates); per second (throughput)",
       "requests")
def latency(window: Partial, profile: Profile | None, baseline: Partial | None,
            params: LatencyThreshold) -> list[Finding]:
    """p50 / p95 / p99 in ms of total latency, of each stage, of time to first token (stage ttft) and of
    total latency per input-length bucket (labels length, bucket); the share of requests that failed,
    timed out or were rejected, and (once either is logged) were cancelled or truncated (label rate); output
    tokens per second, throughput and queue trend (see _service). Quantiles with fewer values in window or
    baseline than their 95% interval needs (detail.needed_n), and everything but the queue trend without a
    baseline, are 'insufficient'. Total latency leaves out timed-out requests without a latency when no
    deadline is set (detail.untimed_timeouts)."""
    out = []
    keys = sorted(k for k in window.sketches.keys() | (baseline.sketches.keys() if baseline else set())
                  if _is_latency(k))
    # Timed-out requests that logged no latency (and no deadline to count them at) are not in the total's
    # sketch: its findings say how many, so no reader takes it for the latency of every request.
    untimed = window.counts[UNTIMED_TIMEOUTS]
    for key in keys:
        w = window.sketches.get(key, Sketch())
        b = baseline.sketches.get(key, Sketch()) if baseline is not None else Sketch()
        extra = {"untimed_timeouts": untimed} if key == LATENCY and untimed else None
        for label, q in QUANTILES.items():
            out.append(_quantile({**_labels(key), "quantile": label}, w, b, q, False, "ms", params, extra))
    for label, key in RATES.items():
        n, k = window.rows, window.counts[key]
        if label in LOGGED_RATES and not k and not (baseline is not None and baseline.counts[key]):
            continue
        b_n = baseline.rows if baseline is not None else 0
        base = baseline.counts[key] / b_n if b_n else None
        # Failures in one clump of the window (a client's burst cut by its rate limit) are one event, not
        # many: the window's own dispersion widens its interval as the baseline's does.
        phi = max(widen(baseline, key), widen(window, key))
        (low, high), status = decide(k / phi, n / phi, None if base is None else base + params.max_rate_increase,
                                         n >= params.min_n and b_n >= params.min_n)
        value = k / n if n else None
        out.append(Finding("latency", {"rate": label}, value, status, n, baseline=base,
                           effect=None if value is None or base is None else value - base,
                           interval=(low, high) if n else None,
                           detail={"count": k, "baseline_n": b_n, "dispersion": phi}))
    return out + _service(window, baseline, params)


def _span(p: Partial | None, key: str) -> tuple[float, int]:
    """Seconds between the first and last time in sketch `key`, and how many times it holds."""
    sk = p.sketches.get(key, Sketch()) if p is not None else Sketch()
    return (sk.max - sk.min, sk.count) if sk.count else (0.0, 0)


def _service(window: Partial, baseline: Partial | None, params: LatencyThreshold) -> list[Finding]:
    """Output tokens per second (p50 per request), throughput (valid samples and tokens per second of
    the arrival span) and queue trend (completions per second over arrivals per second); each only when
    the log has what it needs."""
    out = []
    if TOKENS_PER_S in window.sketches:
        w = window.sketches[TOKENS_PER_S]
        b = baseline.sketches.get(TOKENS_PER_S, Sketch()) if baseline is not None else Sketch()
        out.append(_quantile({"tokens_per_s": "output", "quantile": "p50"}, w, b, 0.5, True, "tokens/s", params))
    span, arrivals = _span(window, ARRIVAL)
    if not arrivals:
        return out
    b_span, _ = _span(baseline, ARRIVAL)
    per_second = {"samples": (window.counts[keys.OK],
                              baseline.counts[keys.OK] if baseline is not None else 0)}
    for kind in ("input", "output"):
        if f"{TOKENS}{kind}" in window.sketches:
            b_sum = baseline.sketches.get(f"{TOKENS}{kind}", Sketch()).sum if baseline is not None else 0.0
            per_second[f"{kind}_tokens"] = (window.sketches[f"{TOKENS}{kind}"].sum, b_sum)
    for what, (total, b_total) in per_second.items():
        value = total / span if span > 0 else None
        base = b_total / b_span if b_span > 0 else None
        if span < params.min_span_s or b_span < params.min_span_s or value is None or base is None:
            status = "insufficient"
        else:
            status = "breach" if value < base * params.min_throughput_ratio else "ok"
        out.append(Finding("latency", {"throughput": what}, value, status, arrivals, baseline=base,
                           effect=value / base if value is not None and base else None,
                           interval=None if value is None else _throughput_interval(window, what, total, span),
                           detail={"unit": f"{what.replace('_', ' ')}/s", "span_s": span, "baseline_span_s": b_span}))
    done, completions = _span(window, COMPLETION)
    if completions:
        value = (completions - 1) / done / ((arrivals - 1) / span) if span > 0 and done > 0 else None
        b_done, b_completions = _span(baseline, COMPLETION)
        b_arrivals = baseline.sketches[ARRIVAL].count if baseline is not None and b_span else 0
        base = ((b_completions - 1) / b_done / ((b_arrivals - 1) / b_span)
                if b_span > 0 and b_done > 0 and b_arrivals > 1 else None)
        if span < params.min_span_s or completions < params.min_n or value is None:
            status = "insufficient"
        else:
            status = "breach" if value < 1 - params.max_backlog_share else "ok"
        out.append(Finding("latency", {"queue": "completions_vs_arrivals"}, value, status, completions,
                           baseline=base, effect=None if value is None else value - 1,
                           interval=None if value is None else rate_ratio_interval(value, completions, arrivals),
                           detail={"arrival_span_s": span, "completion_span_s": done, "arrivals": arrivals}))
    return out


def _throughput_interval(window: Partial, what: str, total: float, span: float) -> tuple[float, float]:
    """95% interval of a per-second throughput: the exact Poisson interval of the valid requests over the
    span; for tokens, the requests' interval times the 95% range of their mean tokens per request (the
    two spreads combined on the log scale)."""
    if what == "samples":
        low, high = poisson_interval(total)
        return low / span, high / span
    sk = window.sketches[f"{TOKENS}{what.removesuffix('_tokens')}"]
    value, n = total / span, sk.count
    low, high = poisson_interval(n)
    rel = [low / n, high / n] if n else [0.0, 0.0]
    mean, var = sk.mean, sk.var
    if n > 1 and mean and var is not None:
        spread = Z95 * math.sqrt(var / n) / mean  # the mean's relative standard error, as a log-scale spread
        rel = [rel[0] * math.exp(-spread), rel[1] * math.exp(spread)]
    return value * rel[0], value * rel[1]
