"""The per-group totals a fold counts its rows into, one Totals per grouping of the rows, and the
helpers that count, bin, sketch and add up one per-row value into every grouping at once."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from monitor.aggregate import codec, keys
from monitor.aggregate.partial import bottom
from monitor.aggregate.sketch import Grouping, SketchTable, Values


class Totals(Grouping):
    """The per-group totals of one grouping (`g`: group of each row, `groups` of them)."""

    def __init__(self, g: np.ndarray | None, groups: int) -> None:
        super().__init__(g, groups)
        self.counts: dict[str, np.ndarray] = {}  # name -> int64 per group
        self.hists: dict[str, np.ndarray] = {}  # name -> (groups, bins)
        self.sketches: dict[str, SketchTable] = {}
        self.unseen: dict[str, list[Counter]] = {}

    def summed(self, dense: np.ndarray) -> Totals:
        """The groups dense[g] (each group's parent, 0..n-1, non-decreasing in g), each holding its groups
        added up. Counts, histograms and sketch bins are exact; sketch sums are added per group, so their
        last bits may differ from a sum over the rows."""
        starts = np.flatnonzero(np.r_[True, dense[1:] != dense[:-1]])
        out = Totals(None, len(starts))
        out.counts = {k: np.add.reduceat(v, starts) for k, v in self.counts.items()}
        out.hists = {k: np.add.reduceat(v, starts, axis=0) for k, v in self.hists.items()}
        out.sketches = {k: t.summed(dense) for k, t in self.sketches.items()}
        ends = [*starts[1:].tolist(), self.groups]
        out.unseen = {k: [bottom(sum(per[a:b], Counter())) for a, b in zip(starts.tolist(), ends, strict=True)]
                      for k, per in self.unseen.items()}
        return out

    def payloads(self, profile: str) -> list[tuple[int, bytes]]:
        """(rows, payload) of each group, `profile` the fingerprint of the profile the histograms use ('' none):
        the payloads of the groups' Partials, written without building them (codec.encode_groups)."""
        rows = self.counts[keys.ROWS].tolist() if keys.ROWS in self.counts else [0] * self.groups
        payloads = codec.encode_groups(self.groups, self.counts, self.hists, self.sketches, self.unseen, profile)
        return list(zip(rows, payloads, strict=True))


def count(accs: list[Totals], name: str, mask: np.ndarray) -> None:
    """Count the rows where `mask` (bool) holds, per group."""
    if not mask.any():
        return
    for a in accs:
        a.counts[name] = np.bincount(a.g[mask], minlength=a.groups).astype("int64", copy=False)


def count_codes(accs: list[Totals], names: list[str], codes: np.ndarray) -> None:
    """Count each code (0..len(names)-1; -1 none) under its name, per group, in one pass."""
    k = len(names)
    if not k:
        return
    ok = codes >= 0
    every = bool(ok.all())
    for a in accs:
        g, c = (a.g, codes) if every else (a.g[ok], codes[ok])
        table = np.bincount(g * k + c, minlength=a.groups * k).reshape(a.groups, k)
        for j, name in enumerate(names):
            if table[:, j].any():
                a.counts[name] = table[:, j].astype("int64", copy=False)


def hist(accs: list[Totals], name: str, idx: np.ndarray, bins: int) -> None:
    """Count bins 0..bins-1 per group (idx -1: no bin), in one int64 array: -1 lands in a dropped column."""
    for a in accs:
        key = a.g * (bins + 1)
        key += idx
        key += 1
        a.hists[name] = np.bincount(key, minlength=a.groups * (bins + 1)).reshape(a.groups, bins + 1)[:, 1:]


def sketch(accs: list[Totals], name: str, v: np.ndarray | Values, rows: np.ndarray | None = None) -> None:
    """Sketch one value per row (all rows, or where bool `rows`) per group."""
    values = v if isinstance(v, Values) else Values(v)
    for a in accs:
        table = values.table(a, rows)
        if table is not None:
            a.sketches[name] = table


def add_up(accs: list[Totals], name: str, weights: np.ndarray) -> None:
    """Add up integer `weights` per group."""
    if not weights.any():
        return
    for a in accs:
        a.counts[name] = np.bincount(a.g, weights=weights, minlength=a.groups).round().astype("int64")


def top_values(accs: list[Totals], key: str, rows: np.ndarray, texts: np.ndarray) -> None:
    """Count the values `texts` of rows `rows` per group into `unseen[key]` (bounded as unseen values)."""
    if not len(rows):
        return
    t_codes, t_values = pd.factorize(texts)
    t_values = np.asarray(t_values, dtype=object).tolist()
    for a in accs:
        per = [Counter() for _ in range(a.groups)]
        pairs, n_pairs = np.unique(a.g[rows] * len(t_values) + t_codes, return_counts=True)
        for pair, c in zip(pairs.tolist(), n_pairs.tolist(), strict=True):
            gi, ti = divmod(pair, len(t_values))
            per[gi][t_values[ti]] = c
        a.unseen[key] = [bottom(c) for c in per]
