"""Mergeable per-bucket aggregates: what a tick folds its new rows into, and what windows merge.

A partial belongs to one (model_version, bucket_start, segment). Merging is associative and
commutative, so a window is the merge of its buckets whatever order they were written in.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd
from ddsketch.mapping import LogarithmicMapping

from monitor.config import Schema
from monitor.frame import STAGE_PREFIX
from monitor.profile import Profile, resolve
from storage.store import PartialRow

ALL = ""  # the segment key for "every row"
LATENCY = "latency_ms"  # sketch key of the total latency; stages are `stage.<name>`, signals `signal:<name>`
RELATIVE_ACCURACY = 0.01
UNSEEN_KEEP = 32  # unseen category values retained per field (the ones with the smallest hash)
MIXED = "mixed"  # profile fingerprint of a merge of partials binned by different profiles

_MAPPING = LogarithmicMapping(RELATIVE_ACCURACY)
_LOG_GAMMA = math.log1p(2 * RELATIVE_ACCURACY / (1 - RELATIVE_ACCURACY))


@dataclass(frozen=True)
class Sketch:
    """DDSketch (relative accuracy 1%) of finite values, as bin maps: key -> count.

    Keys follow ddsketch's LogarithmicMapping, so quantiles equal ddsketch's for the same values.
    count / sum / sumsq / min / max are exact (sums up to float rounding).
    """

    pos: dict[int, int] = field(default_factory=dict)
    neg: dict[int, int] = field(default_factory=dict)  # keys of -value
    zero: int = 0
    count: int = 0
    sum: float = 0.0
    sumsq: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    @classmethod
    def of(cls, values: np.ndarray) -> Sketch:
        """The sketch of `values` (non-finite values are skipped)."""
        parts = _sketches(np.asarray(values, dtype=float), np.zeros(len(values), "int64"), 1)
        return parts[0] if parts else cls()

    def merge(self, other: Sketch) -> Sketch:
        if not other.count:
            return self
        if not self.count:
            return other
        return Sketch(_add(self.pos, other.pos), _add(self.neg, other.neg), self.zero + other.zero,
                      self.count + other.count, self.sum + other.sum, self.sumsq + other.sumsq,
                      min(self.min, other.min), max(self.max, other.max))

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    @property
    def var(self) -> float | None:
        """Sample variance; None below two values."""
        if self.count < 2:
            return None
        return max(self.sumsq - self.sum * self.sum / self.count, 0.0) / (self.count - 1)

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0..1) within 1% relative error, as ddsketch computes it; None when empty."""
        if not self.count or not 0 <= q <= 1:
            return None
        rank = q * (self.count - 1)
        nneg = sum(self.neg.values())
        if rank < nneg:
            return -_MAPPING.value(_key_at_rank(self.neg, nneg - rank - 1, lower=False))
        if rank < nneg + self.zero:
            return 0.0
        return _MAPPING.value(_key_at_rank(self.pos, rank - nneg - self.zero, lower=True))

    def to_json(self) -> dict:
        return {"p": _flat(self.pos), "n": _flat(self.neg), "z": self.zero, "c": self.count,
                "s": self.sum, "q": self.sumsq, "lo": self.min, "hi": self.max}

    @classmethod
    def from_json(cls, d: dict) -> Sketch:
        return cls(_unflat(d["p"]), _unflat(d["n"]), d["z"], d["c"], d["s"], d["q"], d["lo"], d["hi"])


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
        profile, keep_hists = _merge_profile(self, other)
        hists: dict[str, tuple[int, ...]] = {}
        if keep_hists:
            for key in self.hists.keys() | other.hists.keys():
                a, b = self.hists.get(key), other.hists.get(key)
                hists[key] = a if b is None else b if a is None else tuple(x + y for x, y in zip(a, b, strict=True))
        sketches = {k: self.sketches.get(k, Sketch()).merge(other.sketches.get(k, Sketch()))
                    for k in self.sketches.keys() | other.sketches.keys()}
        unseen = {k: _bottom(self.unseen.get(k, Counter()) + other.unseen.get(k, Counter()))
                  for k in self.unseen.keys() | other.unseen.keys()}
        return Partial(self.counts + other.counts, hists, sketches, unseen, profile)

    @property
    def rows(self) -> int:
        return self.counts["rows"]

    def to_bytes(self) -> bytes:
        body: dict[str, Any] = {"counts": dict(sorted(self.counts.items()))}
        if self.hists:
            body["hists"] = {k: list(v) for k, v in sorted(self.hists.items())}
        if self.sketches:
            body["sketches"] = {k: v.to_json() for k, v in sorted(self.sketches.items())}
        if self.unseen:
            body["unseen"] = {k: dict(sorted(v.items())) for k, v in sorted(self.unseen.items())}
        if self.profile:
            body["profile"] = self.profile
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Partial:
        body = json.loads(data)
        return cls(Counter(body["counts"]),
                   {k: tuple(v) for k, v in body.get("hists", {}).items()},
                   {k: Sketch.from_json(v) for k, v in body.get("sketches", {}).items()},
                   {k: Counter(v) for k, v in body.get("unseen", {}).items()},
                   body.get("profile", ""))


def merge_all(partials) -> Partial:
    """The merge of any number of partials (an empty Partial for none)."""
    out = Partial()
    for p in partials:
        out = out.merge(p)
    return out


def merge_bytes(old: bytes, new: bytes) -> bytes:
    """Merge two serialized partials (the callback storage uses on upsert)."""
    return Partial.from_bytes(old).merge(Partial.from_bytes(new)).to_bytes()


def fold(frame: pd.DataFrame, bucket: timedelta, segments: list[str], timed: bool,
         schema: Schema | None = None, profile: Any = None) -> list[PartialRow]:
    """Fold joined prediction rows into partials per (model_version, bucket, segment).

    `timed`: a timing source is configured, so `joined` / `unmatched` are counted.
    `schema`: features, signals, classes to aggregate (None: counts, statuses, latency, cache only).
    `profile`: a Profile, or a config Reference / path to profile (cached); None: no histograms or ranges.
    """
    if frame.empty:
        return []
    prof = resolve(profile, schema)
    seconds = int(bucket.total_seconds())
    metrics = _row_metrics(frame, schema or Schema(), prof, timed)
    # Group keys as integer codes (sorted like the values), so grouping is one np.unique per grouping.
    mv_codes, mv_values = _sorted_codes(frame["model_version"])
    b_codes, b_values = _sorted_codes(frame["ts"].dt.floor(f"{seconds}s"))
    base = mv_codes * len(b_values) + b_codes
    groupings = [(ALL, None)] + [(seg, frame[seg]) for seg in segments if seg in frame]
    out: list[PartialRow] = []
    for name, column in groupings:
        if column is None:
            seg_codes, seg_values = np.zeros(len(frame), "int64"), np.array([ALL], dtype=object)
        else:
            seg_codes, seg_values = _segment_codes(name, column)
        keys, codes = np.unique(base * len(seg_values) + seg_codes, return_inverse=True)
        codes = codes.astype("int64", copy=False).reshape(-1)
        mv_of, rest = np.divmod(keys, len(b_values) * len(seg_values))
        b_of, seg_of = np.divmod(rest, len(seg_values))
        for i, partial in enumerate(_aggregate(metrics, codes, len(keys), prof)):
            out.append(PartialRow(model_version=mv_values[mv_of[i]], bucket_start=b_values[b_of[i]].to_pydatetime(),
                                  bucket_seconds=seconds, segment=seg_values[seg_of[i]], rows=partial.rows,
                                  payload=partial.to_bytes()))
    return out


def _sorted_codes(values: pd.Series) -> tuple[np.ndarray, Any]:
    """Integer code of each value, and the distinct values in sorted order (code i -> values[i])."""
    codes, uniques = pd.factorize(values, sort=True)
    return codes.astype("int64", copy=False), uniques


def _segment_codes(name: str, column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Codes of `name=<value>` labels (missing as `<missing>`), labels sorted as text."""
    codes, uniques = pd.factorize(column, sort=False)
    text = pd.Series(uniques, dtype=object).astype(str).to_numpy(dtype=object) if len(uniques) else np.array([], dtype=object)
    labels = np.array([f"{name}={v}" for v in text] + [f"{name}=<missing>"], dtype=object)
    # Two values may print alike (or one may be the text `<missing>`): they share a segment.
    label_codes, label_values = pd.factorize(labels, sort=True)
    codes = np.where(codes < 0, len(labels) - 1, codes)
    return label_codes[codes].astype("int64", copy=False), np.asarray(label_values, dtype=object)


# -- fold internals: per-row arrays computed once, then counted per grouping with bincount -----------

@dataclass
class _Metrics:
    counts: dict[str, np.ndarray] = field(default_factory=dict)  # name -> per-row int count
    hists: dict[str, tuple[np.ndarray, int]] = field(default_factory=dict)  # name -> (bin or -1, bins)
    sketches: dict[str, np.ndarray] = field(default_factory=dict)  # name -> per-row float (NaN = none)
    unseen: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # field -> (rows, values)


def _row_metrics(frame: pd.DataFrame, schema: Schema, profile: Profile | None, timed: bool) -> _Metrics:
    n = len(frame)
    m = _Metrics()
    m.counts["rows"] = np.ones(n, "int64")
    status_codes, statuses = pd.factorize(frame["status"])
    for i, s in enumerate(statuses):
        m.counts[f"status:{s}"] = (status_codes == i).astype("int64")
    if timed:
        joined = frame["joined"].to_numpy(dtype=bool)
        m.counts["joined"], m.counts["unmatched"] = joined.astype("int64"), (~joined).astype("int64")
        m.counts["stage_rows"] = frame["stage_rows"].to_numpy(dtype="int64")
    if "cache_hit" in frame:
        hit = frame["cache_hit"]
        m.counts["cache:hit"] = hit.eq(True).to_numpy(dtype="int64")
        m.counts["cache:miss"] = hit.eq(False).to_numpy(dtype="int64")

    for name in [LATENCY] + [c for c in frame.columns if c.startswith(STAGE_PREFIX)]:
        if name in frame:
            m.sketches[name] = pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    for name in schema.signals:
        values = frame[name] if name in frame else pd.Series(np.nan, index=frame.index)
        v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        m.counts[f"missing:{name}"] = np.isnan(v).astype("int64")
        m.sketches[f"signal:{name}"] = v

    fields = profile.fields if profile is not None else {}
    for name, kind in schema.features.items():
        values = frame[name] if name in frame else pd.Series([None] * n, index=frame.index, dtype=object)
        m.counts[f"missing:{name}"] = values.isna().to_numpy(dtype="int64")
        ref = fields.get(name)
        if ref is None or ref.kind != kind:
            continue
        idx = ref.bin_index(values)
        m.hists[f"len:{name}" if kind == "text" else name] = (idx, ref.bins)
        if kind == "numeric":
            v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
            if ref.min is not None:
                m.counts[f"below:{name}"] = (v < ref.min).astype("int64")
                m.counts[f"above:{name}"] = (v > ref.max).astype("int64")
        elif kind == "categorical":
            unseen = idx == len(ref.categories)
            m.counts[f"unseen:{name}"] = unseen.astype("int64")
            rows = np.flatnonzero(unseen)
            m.unseen[name] = (rows, values.to_numpy(dtype=object)[rows].astype(str))
    if profile is not None:
        if profile.prediction is not None and "prediction" in frame:
            m.hists["prediction"] = (profile.prediction.bin_index(frame["prediction"]), profile.prediction.bins)
        for cls, ref in profile.scores.items():
            column = schema.score_column(cls)
            if column in frame:
                m.hists[f"score:{cls}"] = (ref.bin_index(frame[column]), ref.bins)
    return m


def _aggregate(m: _Metrics, g: np.ndarray, groups: int, profile: Profile | None) -> list[Partial]:
    counts = {k: np.bincount(g, weights=v, minlength=groups).astype("int64") for k, v in m.counts.items() if v.any()}
    hists = {}
    for k, (idx, bins) in m.hists.items():
        ok = idx >= 0
        hists[k] = np.bincount(g[ok] * bins + idx[ok], minlength=groups * bins).reshape(groups, bins)
    sketches = {k: _sketches(v, g, groups) for k, v in m.sketches.items()}
    unseen: dict[str, list[Counter]] = {}
    for k, (rows, values) in m.unseen.items():
        per = [Counter() for _ in range(groups)]
        if len(rows):
            vc = pd.DataFrame({"g": g[rows], "v": values}).value_counts()
            for (gi, value), c in vc.items():
                per[gi][value] = int(c)
        unseen[k] = [_bottom(c) for c in per]
    fingerprint = profile.fingerprint if profile is not None else ""
    out = []
    for i in range(groups):
        out.append(Partial(
            counts=Counter({k: int(v[i]) for k, v in counts.items() if v[i]}),
            hists={k: tuple(int(x) for x in h[i]) for k, h in hists.items()},
            sketches={k: s[i] for k, s in sketches.items() if i in s},
            unseen={k: u[i] for k, u in unseen.items() if u[i]},
            profile=fingerprint,
        ))
    return out


def _sketches(v: np.ndarray, g: np.ndarray, groups: int) -> dict[int, Sketch]:
    """One Sketch per group with at least one finite value."""
    ok = np.isfinite(v)
    v, g = v[ok], g[ok]
    if not len(v):
        return {}
    order = np.argsort(g, kind="stable")
    v, g = v[order], g[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    present = g[starts]
    count = np.diff(np.r_[starts, len(g)])
    total = np.add.reduceat(v, starts)
    squares = np.add.reduceat(v * v, starts)
    lo, hi = np.minimum.reduceat(v, starts), np.maximum.reduceat(v, starts)
    pos, neg = v > _MAPPING.min_possible, v < -_MAPPING.min_possible
    zero = np.bincount(g[~pos & ~neg], minlength=groups)
    maps = [_bin_maps(v[mask] if sign > 0 else -v[mask], g[mask], groups) for mask, sign in ((pos, 1), (neg, -1))]
    out = {}
    for gi, c, s, q, a, b in zip(present.tolist(), count.tolist(), total.tolist(), squares.tolist(),
                                 lo.tolist(), hi.tolist(), strict=True):
        out[gi] = Sketch(maps[0][gi], maps[1][gi], int(zero[gi]), c, s, q, a, b)
    return out


def _bin_maps(v: np.ndarray, g: np.ndarray, groups: int) -> list[dict[int, int]]:
    maps: list[dict[int, int]] = [{} for _ in range(groups)]
    if not len(v):
        return maps
    keys = np.ceil(np.log(v) / _LOG_GAMMA).astype("int64")
    code = (g << 32) + (keys + (1 << 31))
    uniq, cnt = np.unique(code, return_counts=True)
    owner = uniq >> 32
    keys = ((uniq & 0xFFFFFFFF) - (1 << 31)).tolist()
    cnt = cnt.tolist()
    bounds = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1], True])
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        maps[int(owner[a])] = dict(zip(keys[a:b], cnt[a:b], strict=True))
    return maps


def _key_at_rank(bins: dict[int, int], rank: float, lower: bool) -> int:
    keys = sorted(bins)
    running = np.cumsum([bins[k] for k in keys])
    hit = np.flatnonzero(running > rank) if lower else np.flatnonzero(running >= rank + 1)
    return keys[hit[0]] if len(hit) else keys[-1]


def _add(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def _flat(bins: dict[int, int]) -> list[int]:
    return [x for k in sorted(bins) for x in (k, bins[k])]


def _unflat(flat: list[int]) -> dict[int, int]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _bottom(values: Counter) -> Counter:
    """The UNSEEN_KEEP values with the smallest stable hash: the same set whatever the merge order."""
    if len(values) <= UNSEEN_KEEP:
        return values
    names = list(values)
    hashes = pd.util.hash_array(np.array(names, dtype=object))
    keep = np.argsort(hashes, kind="stable")[:UNSEEN_KEEP]
    return Counter({names[i]: values[names[i]] for i in keep})


def _merge_profile(a: Partial, b: Partial) -> tuple[str, bool]:
    """The merged partial's profile fingerprint, and whether histograms survive the merge.

    Histograms on different bins (or on none: rows folded without a profile) cannot be added; an
    empty partial takes any profile. MIXED absorbs everything, which keeps the merge associative.
    """
    if not a.rows and not a.hists:
        return b.profile, True
    if not b.rows and not b.hists:
        return a.profile, True
    if a.profile == b.profile and a.profile != MIXED:
        return a.profile, True
    return MIXED, False
