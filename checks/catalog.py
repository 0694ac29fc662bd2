"""The catalog: every declared check (window checks, quality figures, SLO rules) loaded in one fixed order,
the lookups by family that the verdict and explain use, and the validation of a config's thresholds."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

# Registration: evaluate runs the window checks in this order; quality figures and SLO rules beside them.
from checks import (  # noqa: F401
    acceptance,
    cache,
    completeness,
    drift,
    latency,
    lengths,
    quality,
    ranges,
    routing,
    rules,
    signals,
    vocabulary,
)
from checks.contract import REGISTRY, Contract, Family, Kind


def names(*families: Family, kind: Kind | None = None) -> tuple[str, ...]:
    """The checks of `families` (every family when none), family by family in the order given, each
    family's checks in registration order; only those of `kind` when set."""
    pool = [c for c in REGISTRY.values() if kind is None or c.kind == kind]
    if not families:
        return tuple(c.name for c in pool)
    return tuple(c.name for fam in families for c in pool if c.family == fam)


def family_of(name: str) -> Family | None:
    """The family of check `name` (a stored `check` column value); None for a name not in the catalog
    (an SLO rule's `slo:<rule>` evidence is family `slo`)."""
    if name.startswith("slo:"):
        name = "slo"
    contract = REGISTRY.get(name)
    return None if contract is None else contract.family


def thresholds(overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The threshold object of each window check named in `overrides` (check name -> {field: value}),
    its class's defaults with the given fields replaced, type-checked and held to their bounds.
    ValueError naming `check.field` for an unknown check or field or a bad value."""
    from pydantic import TypeAdapter, ValidationError

    out: dict[str, Any] = {}
    for name, fields in overrides.items():
        contract = REGISTRY.get(name)
        if contract is None or contract.kind != "window":
            where = f"; it is set in {contract.configured}" if contract is not None else ""
            raise ValueError(f"unknown check {name!r}{where} (checks: {', '.join(names(kind='window'))})")
        if not isinstance(fields, Mapping):
            raise ValueError(f"{name}: a mapping of threshold fields to values, got {fields!r:.80}")
        known = [f.name for f in dataclasses.fields(contract.params)]
        unknown = [f for f in fields if f not in known]
        if unknown:
            raise ValueError(f"{name}.{unknown[0]}: unknown threshold of check {name!r} (fields: {', '.join(known)})")
        try:
            out[name] = TypeAdapter(contract.params).validate_python(dict(fields))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise ValueError(f"{name}.{where}: {err['msg']} (got {err.get('input')!r:.80})") from None
        for field, _, _, bound in contract.parameters():
            value = getattr(out[name], field)
            why = None if bound is None or value is None or field not in fields else bound(value)
            if why is not None:
                raise ValueError(f"{name}.{field}: {why} (got {fields[field]!r:.80})")
    return out


def contracts() -> list[Contract]:
    """Every declared check, in registration order."""
    return list(REGISTRY.values())
