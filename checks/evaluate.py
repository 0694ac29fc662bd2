"""Run every registered check on one window."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from checks import (  # noqa: F401 (registration: one module per family)
    cache,
    completeness,
    drift,
    latency,
    lengths,
    ranges,
    routing,
    signals,
    vocabulary,
)
from checks.base import REGISTRY, Finding
from monitor.aggregate.partial import Partial
from monitor.aggregate.profile import Profile

# The checks that compare a window's data with the reference (or, when configured, accepted serving history).
DATA_CHECKS = ("missing_rate", "out_of_range", "unseen_categories", "drift", "prediction_drift", "length_distribution")


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


def thresholds(overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The threshold object of each check named in `overrides` (check name -> {field: value}), its
    class's defaults with the given fields replaced and type-checked. ValueError naming `check.field`
    for an unknown check or field or a bad value."""
    from pydantic import TypeAdapter, ValidationError

    out: dict[str, Any] = {}
    for name, fields in overrides.items():
        reg = REGISTRY.get(name)
        if reg is None:
            raise ValueError(f"unknown check {name!r} (checks: {', '.join(sorted(REGISTRY))})")
        if not isinstance(fields, Mapping):
            raise ValueError(f"{name}: a mapping of threshold fields to values, got {fields!r:.80}")
        known = [f.name for f in dataclasses.fields(reg.params)]
        unknown = [f for f in fields if f not in known]
        if unknown:
            raise ValueError(f"{name}.{unknown[0]}: unknown threshold of check {name!r} (fields: {', '.join(known)})")
        try:
            out[name] = TypeAdapter(reg.params).validate_python(dict(fields))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise ValueError(f"{name}.{where}: {err['msg']} (got {err.get('input')!r:.80})") from None
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
