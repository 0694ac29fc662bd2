"""Finding (what a check measured) and the registry: one name per check, used as registry key,
config `type` and stored `check` column.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from checks.stats import wilson
from monitor.aggregate.partial import Partial
from monitor.aggregate.profile import Profile

Status = Literal["ok", "breach", "insufficient"]


def rate_above(k: float, n: float, limit: float | None, enough: bool) -> tuple[tuple[float, float], Status]:
    """The 95% Wilson interval of a rate of `k` in `n`, and its status: `insufficient` without `enough`
    samples or a `limit`; `breach` when the whole interval lies above `limit` (a share, 0..1); else `ok`."""
    low, high = wilson(k, n)
    if not enough or limit is None:
        return (low, high), "insufficient"
    return (low, high), "breach" if low > limit else "ok"


@dataclass(frozen=True)
class Finding:
    """One measurement of one check on one window, for one set of labels (field, stage, rate...).

    `value` is in the unit the check names; `baseline` the reference or trailing value it is compared
    with; `effect` the size of the difference; `interval` a 95% interval of `value` when the check has
    one. `status` is 'insufficient' when there are too few samples to decide (value may still be set).
    """

    check: str
    labels: dict[str, str]
    value: float | None
    status: Status
    n: int
    baseline: float | None = None
    effect: float | None = None
    interval: tuple[float, float] | None = None
    p_value: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_row(self, service: str, model_version: str, window_start: datetime, window_end: datetime,
               tick_id: int | None = None) -> dict[str, Any]:
        """The finding as a row for Store.upsert_findings."""
        low, high = self.interval if self.interval is not None else (None, None)
        return {"tick_id": tick_id, "service": service, "check": self.check, "model_version": model_version,
                "window_start": window_start, "window_end": window_end, "labels": dict(self.labels),
                "status": self.status, "value": self.value, "baseline": self.baseline, "effect": self.effect,
                "interval_low": low, "interval_high": high, "p_value": self.p_value, "n": self.n,
                "detail": _plain(self.detail)}


@dataclass(frozen=True)
class Trailing(Partial):
    """A trailing baseline: the merge of its buckets, plus `dispersion` per count key (`status:rejected`
    ...): how much more the rate varied from bucket to bucket than independent requests explain (>= 1;
    see checks.stats.dispersion). A check on a rate widens its interval by it; absent keys mean 1."""

    dispersion: dict[str, float] = field(default_factory=dict)


def trailing(buckets: list[Partial], keys: tuple[str, ...], merged: Partial | None = None) -> Trailing | None:
    """The merged baseline of `buckets` with the dispersion of each count key in `keys`, and of each
    histogram (key `hist:<name>`); None if empty. `merged`: their merge, when the caller has it."""
    from checks.stats import dispersion, table_dispersion
    from monitor.aggregate.partial import merge_all

    merged = merge_all(buckets) if merged is None else merged
    if not merged.rows:
        return None
    spread = {key: dispersion([(b.counts[key], b.rows) for b in buckets]) for key in keys}
    for key, hist in merged.hists.items():
        spread[f"hist:{key}"] = table_dispersion([b.hists[key] for b in buckets
                                                  if len(b.hists.get(key, ())) == len(hist)])
    return Trailing(merged.counts, merged.hists, merged.sketches, merged.unseen, merged.profile, spread)


def widen(baseline: Partial | None, key: str) -> float:
    """The dispersion of count `key` in `baseline` (1 when it has none)."""
    return getattr(baseline, "dispersion", {}).get(key, 1.0) if baseline is not None else 1.0


CheckFn = Callable[[Partial, Profile | None, Partial | None, Any], list[Finding]]


@dataclass(frozen=True)
class Registered:
    name: str
    fn: CheckFn
    params: type  # the check's threshold class; its defaults are the default thresholds


REGISTRY: dict[str, Registered] = {}


def check(name: str, params: type) -> Callable[[CheckFn], CheckFn]:
    """Register `fn(window, profile, baseline, params) -> list[Finding]` under `name`."""

    def register(fn: CheckFn) -> CheckFn:
        if name in REGISTRY:
            raise ValueError(f"check {name!r} registered twice")
        REGISTRY[name] = Registered(name, fn, params)
        return fn

    return register


def _plain(value: Any) -> Any:
    """JSON-safe copy: tuples as lists, numpy scalars as Python, NaN / inf as None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
