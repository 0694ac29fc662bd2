"""Finding (what a check measured on one window) and the trailing baseline it is measured against."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from checks.contract import Status
from monitor.aggregate.partial import Partial


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
        """The finding as a row for Store.findings.upsert."""
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
