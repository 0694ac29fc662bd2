"""Run every registered window check on one window."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from checks.base import Finding
from checks.catalog import names
from checks.contract import REGISTRY
from monitor.aggregate.partial import Partial
from monitor.aggregate.profile import Profile

# The checks that compare a window's data with the reference (or, when configured, accepted serving history).
DATA_CHECKS = names("completeness", "ranges", "drift", "predictions", "lengths")


def evaluate(window: Partial, profile: Profile | None, baseline: Partial | None,
             params: Mapping[str, Any] | None = None, only: Collection[str] | None = None) -> list[Finding]:
    """Findings of every registered window check (or of those named in `only`), in registration order; `params`
    maps a check's name to its thresholds (default: the threshold class's defaults). A check that raises yields one 'insufficient'
    finding naming the error, so one bad check never hides the others."""
    params = params or {}
    out: list[Finding] = []
    for name, reg in REGISTRY.items():
        if reg.kind != "window" or only is not None and name not in only:
            continue
        try:
            out += reg.fn(window, profile, baseline, params.get(name) or reg.params())
        except Exception as exc:
            out.append(Finding(name, {}, None, "insufficient", window.rows,
                               detail={"error": f"{type(exc).__name__}: {exc}"}))
    return out


def compare_with(params: Mapping[str, Any], overrides: Mapping[str, Mapping[str, Any]], against: str) -> dict[str, Any]:
    """`params` with `baseline: against` for every data check whose `overrides` (the service's `checks:`)
    do not set a baseline of their own."""
    out = dict(params)
    if against == "reference":
        return out
    for name in DATA_CHECKS:
        if "baseline" not in overrides.get(name, {}):
            out[name] = dataclasses.replace(out.get(name) or REGISTRY[name].params(), baseline=against)
    return out
