"""The slowest rows of a stream of chunks with a row limit: a top-k over chunks (at most the limit plus one
chunk held), with what the drill-down's aggregates need counted as the rows pass (per dimension value: the
rows, and a quantile sketch of their durations)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from monitor.aggregate.sketch import Grouping, Sketch, SketchSum, Values


class Ranked:
    """Rows ranked by `measure` (ms, slowest first, then request_id), `limit` of them held at most (None:
    every row, for the exact figures); `min_ms`: only rows at or above it are held (all are counted)."""

    def __init__(self, measure: str, dims: list[str], limit: int | None, min_ms: float | None) -> None:
        self.measure, self.dims, self.limit, self.min_ms = measure, dims, limit, min_ms
        self.chunks: list[pd.DataFrame] = []
        self.rows = 0  # rows carrying the measure
        self.at_least = 0  # of them, at or above min_ms
        self.values: dict[str, Counter] = {d: Counter() for d in dims}
        self.sketches: dict[str, dict[str, Sketch]] = {d: {} for d in dims}

    def add(self, rows: pd.DataFrame) -> None:
        """One chunk of rows carrying the measure."""
        if not len(rows):
            return
        self.rows += len(rows)
        if self.limit is None:
            self.chunks.append(rows)
            return
        ms = rows[self.measure].to_numpy(dtype=float)
        for dim in self.dims:
            if dim not in rows:
                continue
            codes, uniques = pd.factorize(rows[dim].astype(str))
            self.values[dim].update(dict(zip(uniques, np.bincount(codes, minlength=len(uniques)).tolist(), strict=True)))
            table = Values(ms).table(Grouping(codes.astype("int64"), len(uniques)))
            for i, sketch in (table.sketches() if table is not None else {}).items():
                seen = self.sketches[dim].get(uniques[i])
                self.sketches[dim][uniques[i]] = sketch if seen is None else seen.merge(sketch)
        if self.min_ms is not None:
            rows = rows[ms >= self.min_ms]
            self.at_least += len(rows)
        held = pd.concat([*self.chunks, rows], ignore_index=True) if self.chunks else rows
        if len(held) > self.limit:
            held = _slowest(held, self.measure).head(self.limit)
        self.chunks = [held]

    def all(self) -> pd.DataFrame | None:
        """Every row added (no limit), or None when held under a limit."""
        if self.limit is not None:
            return None
        return pd.concat(self.chunks, ignore_index=True) if self.chunks else pd.DataFrame()

    def held(self) -> pd.DataFrame:
        """The rows held, slowest first."""
        return _slowest(self.chunks[0], self.measure) if self.chunks else pd.DataFrame()

    def floor(self, slowest: float) -> float | None:
        """The (1 - slowest)-quantile of every row's measure (numpy's linear rule) when the rows held
        decide it (the share fits the limit, its floor above the slowest row left out); None otherwise."""
        held = self.held()
        ms = held[self.measure].to_numpy(dtype=float)[::-1] if len(held) else np.array([])  # ascending
        n, m = self.rows, len(ms)
        position = (1 - slowest) * (n - 1)
        low = int(np.floor(position))
        if m == 0 or low < n - m:
            return None
        at = position - (n - m)  # the same position among the slowest m
        value = float(np.interp(at, np.arange(m), ms))
        return value if m == n or value > ms[0] else None

    def p95(self, dim: str) -> dict[str, tuple[float | None, float | None]]:
        """Per value of `dim`: the p95 (ms, within 1%) of the rows with it and of those without it."""
        sketches = self.sketches[dim]
        out = {}
        for value, mine in sketches.items():
            others = SketchSum()
            for other, sketch in sketches.items():
                if other != value:
                    others.add(sketch)
            out[value] = (mine.quantile(0.95), others.sketch().quantile(0.95))
        return out


def _slowest(rows: pd.DataFrame, measure: str) -> pd.DataFrame:
    return rows.sort_values([measure, "request_id"], ascending=[False, True], kind="stable", ignore_index=True)
