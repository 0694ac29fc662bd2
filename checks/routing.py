"""Hotspots: one route, expert or replica taking more than its share of traffic, or slower than the rest."""

from __future__ import annotations

from dataclasses import dataclass

from checks.base import Finding
from checks.contract import Count, NonNegative, Positive, Share, check, decide
from checks.latency import LEVEL, quantile_interval
from checks.stats import quantile_needed
from monitor.aggregate import keys
from monitor.aggregate.fold_service import ROUTING
from monitor.aggregate.keys import LATENCY
from monitor.aggregate.partial import Partial
from monitor.aggregate.profile import Profile
from monitor.aggregate.sketch import Sketch


@dataclass(frozen=True)
class HotspotThreshold:
    """Share: breach when the busiest value's share is, with 95% confidence, more than `max_share_ratio`
    times an even split (1 / values seen). Latency: breach when its `quantile` latency is more than
    `max_ratio` times and `min_delta_ms` above that of the other values together."""

    max_share_ratio: Positive = 1.5
    min_n: Count = 100  # routed requests below which the share says 'insufficient'
    quantile: Share = 0.95
    max_ratio: Positive = 1.5
    min_delta_ms: NonNegative = 5.0


@check("hotspot", HotspotThreshold, "routing", "share of routed requests (0..1); ms (latency)", "routed requests")
def hotspot(window: Partial, profile: Profile | None, baseline: Partial | None,
            params: HotspotThreshold) -> list[Finding]:
    """Per routing field in the window (`route`, `expert`, `replica`): the busiest value's share (0..1)
    of routed requests vs an even split (labels field, measure=share), and its latency quantile in ms vs
    the other values' (measure=latency). The busiest value is named in `detail.value`. Latency by routing
    value is folded for all traffic only: a segment's window (latency, none by value) gets the share."""
    out = []
    for name in ROUTING:
        prefix = keys.route(name, "")
        counts = {k.removeprefix(prefix): c for k, c in window.counts.items() if k.startswith(prefix)}
        if not counts:
            continue
        busiest, k = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        n, values = sum(counts.values()), len(counts)
        even = 1 / values
        (low, high), status = decide(k, n, even * params.max_share_ratio, n >= params.min_n and values >= 2)
        out.append(Finding("hotspot", {"field": name, "measure": "share"}, k / n, status, n, baseline=even,
                           effect=k / n / even, interval=(low, high),
                           detail={"value": busiest, "requests": k, "values": values}))
        if window.sketches.get(LATENCY, Sketch()).count and not any(k.startswith(prefix) for k in window.sketches):
            continue
        mine = window.sketches.get(prefix + busiest, Sketch())
        others = Sketch()
        for key, sk in window.sketches.items():
            if key.startswith(prefix) and key != prefix + busiest:
                others = others.merge(sk)
        q = params.quantile
        value, base = mine.quantile(q), others.quantile(q)
        (interval, confidence), (b_interval, b_confidence) = quantile_interval(mine, q), quantile_interval(others, q)
        (lo, hi), (b_lo, b_hi) = interval or (None, None), b_interval or (None, None)
        need = quantile_needed(q, LEVEL)
        if mine.count < need or others.count < need or value is None or base is None:
            status = "insufficient"
        else:
            # Both quantiles are estimates: slower only when the busiest value's lower bound clears the
            # others' upper bound by the ratio and the delta.
            slower = lo > b_hi * params.max_ratio and lo - b_hi > params.min_delta_ms
            status = "breach" if slower else "ok"
        out.append(Finding("hotspot", {"field": name, "measure": "latency"}, value, status, mine.count,
                           baseline=base, effect=value / base if value is not None and base else None,
                           interval=None if lo is None else (lo, hi),
                           detail={"value": busiest, "unit": "ms", "quantile": q, "others_n": others.count,
                                   "needed_n": need, "interval_confidence": confidence,
                                   "baseline_interval": None if b_lo is None else [b_lo, b_hi],
                                   "baseline_interval_confidence": b_confidence}))
    return out

