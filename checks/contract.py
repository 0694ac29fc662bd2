"""The check contract: what every check declares (name, family, unit, typed and bounded parameters, min_n
policy), the registry they are declared in, and the decision rules every check shares.

A window check is a plain typed function with one decorator (`@check`); its name is its registry key,
its config `type` (`checks.<name>`) and its stored `check` column. Quality figures and SLO rules are not
functions of a window's partials, so they are declared with `declare`, through the same contract.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Annotated, Any, Literal, get_type_hints

from checks.stats import wilson

Status = Literal["ok", "breach", "insufficient"]
# What a finding is about; the verdict and explain read a check's meaning from its family.
Family = Literal["latency", "cache", "routing", "signals", "vocabulary", "completeness", "ranges", "drift",
                 "lengths", "predictions", "quality", "labels", "slo"]
# What computes it: a window check (partials in, findings out), a quality figure (labelled rows), an SLO rule.
Kind = Literal["window", "quality", "rule"]


@dataclass(frozen=True)
class Bound:
    """The range a parameter's value must lie in (None: open on that side; `above`: low itself excluded)."""

    low: float | None = None
    high: float | None = None
    above: bool = False

    def __str__(self) -> str:
        low = "" if self.low is None else f"{'>' if self.above else '>='} {self.low:g}"
        return low if self.high is None else f"{self.low:g} .. {self.high:g}"

    def __call__(self, value: Any) -> str | None:
        """Why `value` is out of bounds, or None when it is within them."""
        if self.low is not None and (value <= self.low if self.above else value < self.low):
            return f"must be {'above' if self.above else 'at least'} {self.low:g}"
        if self.high is not None and value > self.high:
            return f"must be at most {self.high:g}"
        return None


# Parameter types the threshold classes share: the bound is checked when a config sets the value.
Count = Annotated[int, Bound(1)]  # a number of samples (min_n, resamples)
Share = Annotated[float, Bound(0, 1)]  # a rate or a probability, 0..1
NonNegative = Annotated[float, Bound(0)]
Positive = Annotated[float, Bound(0, above=True)]


@dataclass(frozen=True)
class Contract:
    """One declared check. `params`: its threshold class (frozen dataclass; its defaults are the default
    thresholds) or None; `min_n`: the samples below which its findings are 'insufficient' (`n_of` says
    what n counts); `configured`: where a user sets its parameters; `fn`: the window check, for kind
    `window`; `doc`: what it measures, in which unit."""

    name: str
    family: Family
    kind: Kind
    unit: str
    n_of: str
    min_n: int | None
    params: type | None = None
    configured: str = ""
    fn: Callable[..., list] | None = None
    doc: str = ""

    def parameters(self) -> list[tuple[str, Any, Any, Bound | None]]:
        """(name, type, default, bound) of each threshold field, in declaration order; [] without params."""
        if self.params is None:
            return []
        hints = get_type_hints(self.params, include_extras=True)
        out = []
        for f in fields(self.params):
            hint = hints[f.name]
            bound = next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Bound)), None)
            out.append((f.name, getattr(hint, "__origin__", hint) if bound else hint, f.default, bound))
        return out


REGISTRY: dict[str, Contract] = {}


def _min_n(params: type | None) -> int | None:
    defaults = {f.name: f.default for f in fields(params)} if params is not None else {}
    return defaults.get("min_n", defaults.get("min_texts"))


def declare(contract: Contract) -> Contract:
    """Add `contract` to the registry under its name; ValueError if the name is taken."""
    if contract.name in REGISTRY:
        raise ValueError(f"check {contract.name!r} registered twice")
    REGISTRY[contract.name] = contract
    return contract


def check(name: str, params: type, family: Family, unit: str, n_of: str) -> Callable:
    """Register window check `fn(window, profile, baseline, params) -> list[Finding]` under `name`, in
    `family`, measuring in `unit`; its min_n is its threshold class's `min_n` default."""

    def register(fn: Callable[..., list]) -> Callable[..., list]:
        declare(Contract(name, family, "window", unit, n_of, _min_n(params), params, f"checks.{name}", fn,
                         fn.__doc__ or ""))
        return fn

    return register


def decide(k: float, n: float, limit: float | None, enough: bool) -> tuple[tuple[float, float], Status]:
    """The decision rule of a rate: the 95% Wilson interval of `k` in `n`, and its status: `insufficient`
    without `enough` samples or a `limit`; `breach` when the whole interval lies above `limit` (a share,
    0..1); else `ok`."""
    low, high = wilson(k, n)
    if not enough or limit is None:
        return (low, high), "insufficient"
    return (low, high), "breach" if low > limit else "ok"


def measured(value: float | None, n: int, min_n: int) -> Status:
    """The status of a figure that measures and does not decide (quality, coverage): `ok` when it has a
    value on at least `min_n` samples, else `insufficient`."""
    return "ok" if value is not None and n >= min_n else "insufficient"
