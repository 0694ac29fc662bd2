"""The `metrics:` section: which of the monitored model's figures `/metrics` exports, and the bounds that
keep the number of Prometheus series small (docs/prometheus.md gives the formula)."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field

from monitor.config.fields import Duration
from monitor.schema import StrictModel

Family = Literal["verdict", "latency", "failures", "throughput", "cache", "completeness", "ranges", "drift",
                 "prediction_drift", "quality"]
FAMILIES: tuple[Family, ...] = ("verdict", "latency", "failures", "throughput", "cache", "completeness", "ranges",
                                "drift", "prediction_drift", "quality")


class MetricsExport(StrictModel):
    """Model metrics on `/metrics`: for each service, model version and window length, the last closed window's
    stored findings and verdict. Series are added family by family in the order of `families` until
    `max_series`; the rest are counted in `tailwatch_model_series_dropped_total`."""

    enabled: bool = True
    families: list[Family] = Field(default_factory=lambda: list(FAMILIES))
    windows: list[Duration] = Field(default_factory=list)  # window lengths exported; empty: every configured one
    # Fields with per-field series (missing, out of range, unseen, drift); empty: the first `top_k` declared.
    fields: list[str] = Field(default_factory=list)
    # Quality groups exported; empty: `all` and the largest other groups (by labelled n) up to `top_k`. Each
    # must be a group a service's quality section scores (monitor.config.crosscheck.metrics_errors).
    groups: list[str] = Field(default_factory=list)
    top_k: int = Field(10, ge=1)
    max_series: int = Field(10_000, ge=1)
    # A version's window is exported while it ended at most this long before the clock (quality windows: plus
    # the service's quality maturity horizon, since they are scored once their labels matured).
    lookback: Duration = Field(timedelta(hours=2), gt=timedelta(0))
