"""A reference judged before it is trusted: fields that cannot be compared with, and references too small
for the checks that use them, each with a suggested fix."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from checks.completeness import RateIncrease
from checks.ranges import RateLimit
from checks.thresholds import range_rows_needed
from monitor.aggregate.profile import N_BINS, Profile

ROWS_PER_BIN = 50  # reference values per histogram bin for its own sampling noise to stay under PSI ~0.02
NEAR_CONSTANT = 0.95  # share of present values in one bin above which a field is near-constant


@dataclass(frozen=True)
class Concern:
    """One thing wrong with a reference: `field` ('' for the whole reference), `kind` (constant,
    near_constant, few_values, sparse_bins, all_missing, small_reference), what was seen, and the fix;
    `needs`: the reference rows the concern asks for, when it names a number."""

    field: str
    kind: str
    detail: str
    fix: str
    needs: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rows_needed(params: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Reference rows each data check needs to judge a window by the reference alone, with its thresholds
    (`params`: check name -> thresholds, defaults otherwise)."""
    params = params or {}
    ranges = params.get("out_of_range") or RateLimit()
    missing = params.get("missing_rate") or RateIncrease()
    return {"out_of_range": range_rows_needed(ranges.max_rate, ranges.band_alpha),
            "drift": ROWS_PER_BIN * N_BINS,
            "missing_rate": missing.min_n}


def judge(profile: Profile, params: Mapping[str, Any] | None = None) -> list[Concern]:
    """What to fix in `profile`'s reference, fields first (by name), then its size; empty when nothing."""
    out: list[Concern] = []
    for name, ref in sorted(profile.fields.items()):
        present = ref.present
        if present == 0:
            out.append(Concern(name, "all_missing", f"no value in {ref.n:,} reference rows",
                               "fix the reference column's name, or drop the field from schema.features"))
            continue
        top = max(ref.counts) / present if present else 0.0
        if ref.constant or ref.kind == "categorical" and sum(1 for c in ref.counts if c) == 1:
            value = ref.min if ref.kind != "categorical" else (ref.categories or ("<other>",))[0]
            out.append(Concern(name, "constant", f"every one of {present:,} present values is {value}",
                               "drop it from schema.features; or leave it: drift and out_of_range judge it "
                               "against serving history (checks.<check>.degenerate: serving_history, the default)"))
            continue
        if ref.kind != "categorical" and top >= NEAR_CONSTANT:
            out.append(Concern(name, "near_constant", f"{top:.1%} of present values in one of {ref.bins} bins",
                               "give a larger reference, declare it categorical if its values are codes, or "
                               "compare it with serving history (checks.drift.baseline: serving_history)"))
        if ref.kind == "numeric" and 1 < ref.distinct <= N_BINS:
            out.append(Concern(name, "few_values", f"{ref.distinct} distinct values",
                               f"declare it categorical (schema.features.{name}: categorical) if its values "
                               "are codes or counts"))
        # A reference too small for every field is one small_reference concern, not one per field.
        if (ref.kind != "categorical" and present / ref.bins < ROWS_PER_BIN and top < NEAR_CONSTANT
                and profile.rows >= ROWS_PER_BIN * N_BINS):
            out.append(Concern(name, "sparse_bins", f"{present / ref.bins:.0f} present values per bin over "
                               f"{ref.bins} bins (drift wants {ROWS_PER_BIN})",
                               "give a larger reference; the learned band (checks.drift.band: learned, the "
                               "default) widens the drift threshold by what this reference leaves open",
                               needs=ROWS_PER_BIN * ref.bins))
    short = {check: need for check, need in rows_needed(params).items() if profile.rows < need}
    if short:
        wants = ", ".join(f"{check} {need:,}" for check, need in sorted(short.items()))
        out.append(Concern("", "small_reference", f"{profile.rows:,} rows; the checks want: {wants}",
                           "give a larger reference; meanwhile the learned band (checks.<check>.band: learned, "
                           "the default) widens each threshold by what this reference leaves open, or compare "
                           "with accepted serving history (checks.<check>.baseline: serving_history)",
                           needs=max(short.values())))
    return out


def summary(concerns: list[Concern]) -> str | None:
    """One line for a tick's notes; None when there is nothing to say."""
    if not concerns:
        return None
    kinds: dict[str, list[str]] = {}
    for c in concerns:
        kinds.setdefault(c.kind, []).append(c.field or "reference")
    parts = [f"{kind} ({len(names)}: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
             for kind, names in sorted(kinds.items())]
    return "reference concerns: " + "; ".join(parts) + " (see `tailwatch reference build`)"
