"""Mergeable per-bucket aggregates: what a tick folds its new rows into, and what windows merge.

A partial belongs to one (model_version, bucket_start, segment). Merging is associative and
commutative, so a window is the merge of its buckets whatever order they were written in.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

import pandas as pd

from storage.store import PartialRow

ALL = ""  # the segment key for "every row"


@dataclass(frozen=True)
class Partial:
    """Exact counts of one bucket: `rows`, `status:<s>`, `joined`, `unmatched`, `stage_rows`."""

    counts: Counter = field(default_factory=Counter)

    def merge(self, other: Partial) -> Partial:
        return Partial(self.counts + other.counts)

    @property
    def rows(self) -> int:
        return self.counts["rows"]

    def to_bytes(self) -> bytes:
        return json.dumps({"counts": dict(sorted(self.counts.items()))}, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Partial:
        return cls(Counter(json.loads(data)["counts"]))


def merge_bytes(old: bytes, new: bytes) -> bytes:
    """Merge two serialized partials (the callback storage uses on upsert)."""
    return Partial.from_bytes(old).merge(Partial.from_bytes(new)).to_bytes()


def fold(frame: pd.DataFrame, bucket: timedelta, segments: list[str], timed: bool) -> list[PartialRow]:
    """Fold joined prediction rows into partials per (model_version, bucket, segment).

    `timed`: a timing source is configured, so `joined` / `unmatched` are counted.
    """
    if frame.empty:
        return []
    seconds = int(bucket.total_seconds())
    base = pd.DataFrame({
        "model_version": frame["model_version"].to_numpy(),
        "bucket_start": frame["ts"].dt.floor(f"{seconds}s"),
        "status": frame["status"].to_numpy(),
        "joined": frame["joined"].to_numpy(dtype=bool),
        "stage_rows": frame["stage_rows"].to_numpy(dtype="int64"),
    })
    groupings = [(ALL, None)] + [(seg, frame[seg]) for seg in segments if seg in frame]
    out: list[PartialRow] = []
    for name, column in groupings:
        keyed = base if column is None else base.assign(segment=name + "=" + column.fillna("<missing>").astype(str))
        keys = ["model_version", "bucket_start"] + ([] if column is None else ["segment"])
        for key, group in keyed.groupby(keys, sort=True, observed=True):
            counts = Counter({"rows": len(group)})
            if timed:
                joined = int(group["joined"].sum())
                counts.update({"joined": joined, "unmatched": len(group) - joined,
                               "stage_rows": int(group["stage_rows"].sum())})
            counts.update({f"status:{s}": int(c) for s, c in group["status"].value_counts().items()})
            segment = ALL if column is None else key[2]
            out.append(PartialRow(model_version=key[0], bucket_start=key[1].to_pydatetime(),
                                  bucket_seconds=seconds, segment=segment, rows=len(group),
                                  payload=Partial(counts).to_bytes()))
    return out
