"""Cardinality caps: how many model versions, stage names and values per segment column a service folds under
their own name; the values past a cap fold into one OTHER bucket, counted, so no row is lost.

One Cardinality per service per tick admits values step by step (in order, on the ingesting thread) and hands
each fold a frozen Kept of what keeps its own name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from monitor.aggregate import keys

# The value of the overflow bucket: reserved, like `<missing>` (a logged value spelled so counts in it).
OTHER = "<other>"
VERSION, STAGE = "model_version", "stage"  # the fields capped besides the segment columns


def texts(values) -> list[str]:
    """Distinct values as the fold labels them (str of each)."""
    return pd.Series(values, dtype=object).astype(str).tolist() if len(values) else []


@dataclass(frozen=True)
class Kept:
    """What one fold keeps under its own name; a field left out keeps every value."""

    versions: frozenset[str] | None = None
    stages: frozenset[str] | None = None  # stage names, without keys.STAGE_PREFIX
    segments: Mapping[str, frozenset[str]] = field(default_factory=dict)  # column -> values (text)

    def version_of(self, values: Iterable[str]) -> list[str]:
        """Each version value as folded: itself when kept, else OTHER."""
        return list(values) if self.versions is None else [v if v in self.versions else OTHER for v in values]

    def segment_of(self, name: str, values: list[str]) -> list[str]:
        """Each value (text) of segment column `name` as folded: itself when kept, else OTHER."""
        kept = self.segments.get(name)
        return values if kept is None else [v if v in kept else OTHER for v in values]

    def stage_columns(self, frame: pd.DataFrame) -> pd.DataFrame:
        """`frame` with its stage columns past the cap summed into one `stage.<other>` column (ms; NaN where
        the request had none of them): the time a request spent in the stages not named."""
        if self.stages is None:
            return frame
        stages = [c for c in frame.columns if c.startswith(keys.STAGE_PREFIX)]
        past = [c for c in stages if c[len(keys.STAGE_PREFIX):] not in self.stages]
        if not past:
            return frame
        other = frame[past].apply(pd.to_numeric, errors="coerce").to_numpy(dtype="float64")
        summed = np.where(np.isnan(other).all(axis=1), np.nan, np.nansum(other, axis=1)) if other.size else \
            np.full(len(frame), np.nan)
        out = frame.drop(columns=past)
        out[keys.STAGE_PREFIX + OTHER] = summed
        return out


class Cardinality:
    """The values of one service's tick that keep their own name: those already stored in the recent
    partials (`known`), then, while a cap leaves room, the ones with the most rows in a step (ties by
    value); `other` counts rows folded into OTHER and `values` the distinct values folded there, per field."""

    def __init__(self, max_versions: int, max_stages: int, max_segment_values: int,
                 known: Iterable[tuple[str, str]] = ()):
        self.caps = {VERSION: max_versions, STAGE: max_stages}
        self.max_segment_values = max_segment_values
        self.kept: dict[str, set[str]] = {VERSION: set(), STAGE: set()}
        for version, segment in known:  # stored partial keys: (model_version, `column=value` or '')
            if version != OTHER:
                self.kept[VERSION].add(version)
            column, eq, value = segment.partition("=")
            if eq and value != OTHER:
                self.kept.setdefault(column, set()).add(value)
        self.full: set[str] = set()  # fields whose cap was reached: a value not kept folds into OTHER
        self.other: Counter = Counter()
        self.values: dict[str, set[str]] = {}

    def admit(self, frame: pd.DataFrame, segments: Iterable[str], count: bool = True) -> Kept:
        """Admit the values of one step's rows and return what its fold keeps; `count`: the rows are folded
        as requests (False: only their late stage timings), so those past a cap are counted."""
        if not len(frame):
            return self.snapshot(segments)
        if VERSION in frame:
            self._admit(VERSION, frame[VERSION], self.caps[VERSION], count)
        for name in segments:
            if name in frame:
                self._admit(name, frame[name], self.max_segment_values, count)
        stages = [c for c in frame.columns if c.startswith(keys.STAGE_PREFIX)]
        if stages:
            present = frame[stages].notna().to_numpy()
            names = [c[len(keys.STAGE_PREFIX):] for c in stages]
            self._choose(STAGE, names, present.sum(axis=0).tolist(), self.caps[STAGE])
            if STAGE in self.full:
                past = np.array([n not in self.kept[STAGE] for n in names], dtype=bool)
                self.values.setdefault(STAGE, set()).update(n for n, p in zip(names, past.tolist(), strict=True) if p)
                if count:
                    self.other[STAGE] += int(present[:, past].any(axis=1).sum())
        return self.snapshot(segments)

    def snapshot(self, segments: Iterable[str]) -> Kept:
        """What a fold keeps now: a field past its cap keeps its admitted values, the others every value."""
        def kept(name: str) -> frozenset[str] | None:
            return frozenset(self.kept.get(name, ())) if name in self.full else None
        return Kept(kept(VERSION), kept(STAGE), {n: k for n in segments if (k := kept(n)) is not None})

    def warning(self) -> str | None:
        """The tick's one line on the values folded into OTHER; None when every value kept its own name."""
        if not self.values:
            return None
        parts = []
        for name in sorted(self.values, key=lambda n: (n != VERSION, n != STAGE, n)):
            limit = ("limits.max_versions" if name == VERSION else "limits.max_stages" if name == STAGE
                     else "limits.max_segment_values")
            cap = self.caps.get(name, self.max_segment_values)
            what = "model versions" if name == VERSION else "stage names" if name == STAGE else f"`{name}` values"
            parts.append(f"{len(self.values[name]):,} {what} past {limit} ({cap}), {self.other[name]:,} rows")
        return f"cardinality: folded into {OTHER}: " + "; ".join(parts)

    def _admit(self, name: str, column: pd.Series, cap: int, count: bool) -> None:
        codes, uniques = pd.factorize(column)
        if not len(uniques):
            return
        values = texts(uniques)
        rows = np.bincount(codes[codes >= 0], minlength=len(values))
        self._choose(name, values, rows.tolist(), cap)
        if name not in self.full:
            return
        kept = self.kept[name]
        past = np.array([v not in kept and v != OTHER for v in values], dtype=bool)
        if past.any():
            self.values.setdefault(name, set()).update(v for v, p in zip(values, past.tolist(), strict=True) if p)
            if count:
                self.other[name] += int(rows[past].sum())

    def _choose(self, name: str, values: list[str], rows: list[int], cap: int) -> None:
        """Give the free slots of field `name` to its new `values`, the most `rows` first (ties by value)."""
        kept = self.kept.setdefault(name, set())
        new = sorted({v: r for v, r in zip(values, rows, strict=True) if v not in kept and v != OTHER and r > 0}.items(),
                     key=lambda vr: (-vr[1], vr[0]))
        room = max(0, cap - len(kept))
        kept.update(v for v, _ in new[:room])
        if len(new) > room:
            self.full.add(name)
