"""Alert types every stage shares: alert names and severities, a label set's fingerprint, the Sample
one evaluation makes, the persisted Alert state, and what one after_tick did (AlertsReport)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from monitor.verdicts.verdict import HARMFUL
from storage.jsontext import dumps

REGRESSION, DRIFT, NO_DATA, ERROR = "ModelRegression", "InputDrift", "no_data", "error"
SEVERITY_RANK = {"page": 0, "warn": 1, "info": 2}
ACTIVE_STATES = ("pending", "firing")
FAMILY = {REGRESSION: HARMFUL, DRIFT: ("drift",)}  # the verdicts that make each verdict alert active


def fingerprint(labels: Mapping[str, Any]) -> str:
    """The identity of a label set: 16 hex digits of the SHA-256 of its canonical sorted JSON."""
    return hashlib.sha256(dumps(dict(labels)).encode()).hexdigest()[:16]


def identity(labels: Mapping[str, Any]) -> dict[str, Any]:
    """The labels an alert's fingerprint is made of: all, but a ModelRegression's severity, which follows
    the size of the effect window by window (one episode stays one alert while it escalates)."""
    if labels.get("alertname") == REGRESSION:
        return {k: v for k, v in labels.items() if k != "severity"}
    return dict(labels)


def louder(a: str | None, b: str | None) -> str | None:
    """The louder of two severities (page > warn > info); either may be None."""
    return min((s for s in (a, b) if s), key=lambda s: SEVERITY_RANK.get(s, 3), default=None)


@dataclass(frozen=True)
class Sample:
    """What one evaluation says about one alert: active (True), clear (False) or cannot tell (None: too
    few requests; the alert keeps its state). A clear sample with `resolves` False does not end a firing
    episode yet (a verdict alert's clear windows are fewer than `resolve_after`); annotations `resolution`
    and `clearing` say why it resolves or why not yet."""

    labels: dict[str, str]
    active: bool | None
    for_: timedelta = timedelta(0)
    keep_firing_for: timedelta = timedelta(0)
    annotations: dict[str, Any] = field(default_factory=dict)
    resolves: bool = True

    @property
    def fingerprint(self) -> str:
        return fingerprint(identity(self.labels))


@dataclass(frozen=True)
class Alert:
    """The persisted state of one alert."""

    fingerprint: str
    labels: dict[str, str]
    state: str = "inactive"  # inactive | pending | firing | resolved
    active_since: datetime | None = None
    fired_at: datetime | None = None
    resolved_at: datetime | None = None
    last_active_at: datetime | None = None
    last_eval_at: datetime | None = None
    annotations: dict[str, Any] = field(default_factory=dict)
    keep_firing_since: datetime | None = None  # first clear evaluation of a firing alert


@dataclass
class AlertsReport:
    """What one after_tick did: verdicts written, alert states, decisions per group, outbox items."""

    now: str
    verdicts: list[dict[str, Any]] = field(default_factory=list)  # {service, model_version, window, verdict}
    transitions: list[str] = field(default_factory=list)
    decisions: list[dict[str, str]] = field(default_factory=list)  # {group, action, reason}
    enqueued: int = 0
    firing: int = 0
    pending: int = 0
