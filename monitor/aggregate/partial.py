"""Mergeable per-bucket aggregates: what a tick folds its new rows into, and what windows merge.

A partial belongs to one (model_version, bucket_start, segment). Merging is associative and
commutative, so a window is the merge of its buckets whatever order they were written in.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from monitor.aggregate import codec, keys
from monitor.aggregate.sketch import Sketch, SketchSum

ALL = ""  # the segment key for "every row"
UNSEEN_KEEP = 32  # unseen category values retained per field (the ones with the smallest hash)
MIXED = "mixed"  # profile fingerprint of a merge of partials binned by different profiles


@dataclass(frozen=True)
class Partial:
    """The aggregates of one bucket (or a window of merged buckets).

    counts: exact counts — `rows`, `status:<s>`, `joined`, `unmatched`, `stage_rows`, `missing:<field>`
      (features and signals, null or absent), `below:<f>` / `above:<f>` (numeric values outside the
      reference min..max, inf included), `unseen:<f>` (categories not in the reference), `cache:hit`,
      `cache:miss`. Zero counts are left out.
    hists: counts on the profile's bins — `<feature>` (numeric, categorical), `len:<text feature>`,
      `prediction`, `score:<class>`; empty without a profile.
    sketches: `latency_ms`, `stage.<name>` (ms) and `signal:<name>`.
    unseen: per categorical field, unseen values -> count, for at most UNSEEN_KEEP values (those with
      the smallest hash, which keeps the merge exact; the counts of retained values are exact).
    profile: fingerprint of the profile whose bins `hists` use ('' none, MIXED after mixing two).
    """

    counts: Counter = field(default_factory=Counter)
    hists: dict[str, tuple[int, ...]] = field(default_factory=dict)
    sketches: dict[str, Sketch] = field(default_factory=dict)
    unseen: dict[str, Counter] = field(default_factory=dict)
    profile: str = ""

    def merge(self, other: Partial) -> Partial:
        """This partial merged with `other` (merge_all of the two)."""
        return merge_all((self, other))

    @property
    def rows(self) -> int:
        return self.counts[keys.ROWS]

    def to_bytes(self) -> bytes:
        """The stored payload of this partial (codec.encode)."""
        return codec.encode(self.counts, self.hists, self.sketches, self.unseen, self.profile)

    @classmethod
    def from_bytes(cls, data: bytes) -> Partial:
        """The partial of a stored payload, of any form ever written (codec.decode)."""
        return cls(*codec.decode(data))


def merge_all(partials) -> Partial:
    """The merge of any number of partials (an empty Partial for none).

    Equal to merging them one by one into an empty Partial, in one pass: counts and unseen values are
    added in place, histograms and sketch bin maps summed per key with numpy at the end, and unseen
    values cut to the UNSEEN_KEEP smallest hashes only when they grow (the bottom of a union is the
    bottom of the bottoms, so the result is the same).
    """
    counts: Counter = Counter()
    hists: dict[str, list[tuple[int, ...]]] = {}
    sketches: dict[str, SketchSum] = {}
    unseen: dict[str, Counter] = {}
    profile, rows, has_hists = "", 0, False
    for p in partials:
        # An empty running merge (or an empty p) takes any profile; histograms on different bins (or on
        # none: rows folded without a profile) cannot be added. MIXED absorbs everything, which keeps the
        # merge associative.
        p_rows = p.counts[keys.ROWS]
        if not rows and not has_hists:
            profile, keep = p.profile, True
        elif not p_rows and not p.hists:
            keep = True
        elif profile == p.profile and profile != MIXED:
            keep = True
        else:
            profile, keep = MIXED, False
        if keep:
            for k, h in p.hists.items():
                hists.setdefault(k, []).append(h)
            has_hists = has_hists or bool(p.hists)
        else:
            hists.clear()
            has_hists = False
        counts.update(p.counts)
        rows = counts[keys.ROWS]
        for k, sk in p.sketches.items():
            acc = sketches.get(k)
            if acc is None:
                sketches[k] = acc = SketchSum()
            acc.add(sk)
        for k, u in p.unseen.items():
            acc_u = unseen.get(k)
            if acc_u is None:
                unseen[k] = acc_u = Counter()
            acc_u.update(u)
            if len(acc_u) > 4 * UNSEEN_KEEP:
                unseen[k] = bottom(_positive(acc_u))
    return Partial(_positive(counts),
                   {k: hs[0] if len(hs) == 1 else _sum_all(hs) for k, hs in hists.items()},
                   {k: acc.sketch() for k, acc in sketches.items()},
                   {k: bottom(_positive(u)) for k, u in unseen.items()},
                   profile)


def _positive(c: Counter) -> Counter:
    """What Counter addition keeps: the positive counts."""
    if all(v > 0 for v in c.values()):
        return c
    return Counter({k: v for k, v in c.items() if v > 0})


def _sum_all(hists: list[tuple[int, ...]]) -> tuple[int, ...]:
    if len({len(h) for h in hists}) != 1:
        raise ValueError("histograms of different bins do not add")
    try:
        table = np.array(hists, dtype="int64")
    except OverflowError:
        table = None
    if table is None or (table.size and int(table.max()) >= 2**62 // len(hists)):  # could pass int64
        return tuple(sum(col) for col in zip(*hists, strict=True))
    return tuple(table.sum(axis=0).tolist())


def merge_bytes(old: bytes, new: bytes) -> bytes:
    """Merge two serialized partials (the callback storage uses on upsert)."""
    return Partial.from_bytes(old).merge(Partial.from_bytes(new)).to_bytes()


def bottom(values: Counter) -> Counter:
    """The UNSEEN_KEEP values with the smallest stable hash: the same set whatever the merge order."""
    if len(values) <= UNSEEN_KEEP:
        return values
    names = list(values)
    hashes = pd.util.hash_array(np.array(names, dtype=object))
    keep = np.argsort(hashes, kind="stable")[:UNSEEN_KEEP]
    return Counter({names[i]: values[names[i]] for i in keep})
