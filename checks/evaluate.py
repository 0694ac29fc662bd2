"""Run every registered check on one window."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from checks import cache, completeness, drift, latency, lengths, ranges, signals  # noqa: F401 (registration)
from checks.base import REGISTRY, Finding
from monitor.partials import Partial
from monitor.profile import Profile


def evaluate(window: Partial, profile: Profile | None, baseline: Partial | None,
             params: Mapping[str, Any] | None = None, only: Collection[str] | None = None) -> list[Finding]:
    """Findings of every registered check (or of those named in `only`), in registration order; `params`
    maps a check's name to its thresholds (default: the threshold class's defaults). A check that raises yields one 'insufficient'
    finding naming the error, so one bad check never hides the others."""
    params = params or {}
    out: list[Finding] = []
    for name, reg in REGISTRY.items():
        if only is not None and name not in only:
            continue
        try:
            out += reg.fn(window, profile, baseline, params.get(name) or reg.params())
        except Exception as exc:
            out.append(Finding(name, {}, None, "insufficient", window.rows,
                               detail={"error": f"{type(exc).__name__}: {exc}"}))
    return out
