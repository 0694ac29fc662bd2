"""Mergeable per-bucket aggregates: what a tick folds its new rows into, and what windows merge.

A partial belongs to one (model_version, bucket_start, segment). Merging is associative and
commutative, so a window is the merge of its buckets whatever order they were written in.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import operator
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd
from ddsketch.mapping import LogarithmicMapping

from monitor.config import Schema
from monitor.frame import STAGE_PREFIX
from monitor.profile import Profile, _bins, _category_bins, _factorize, _is_float, _numbers, lengths, resolve
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
                hists[key] = a if b is None else b if a is None else _sum2(a, b)
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
    """The merge of any number of partials (an empty Partial for none).

    Equal to merging them one by one into an empty Partial, in one pass: counts and unseen values are
    added in place, histograms and sketch bin maps summed per key with numpy at the end, and unseen
    values cut to the UNSEEN_KEEP smallest hashes only when they grow (the bottom of a union is the
    bottom of the bottoms, so the result is the same).
    """
    counts: Counter = Counter()
    hists: dict[str, list[tuple[int, ...]]] = {}
    sketches: dict[str, _SketchSum] = {}
    unseen: dict[str, Counter] = {}
    profile, rows, has_hists = "", 0, False
    for p in partials:
        # The profile rule of Partial.merge (_merge_profile), on the running merge.
        p_rows = p.counts["rows"]
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
        rows = counts["rows"]
        for k, sk in p.sketches.items():
            acc = sketches.get(k)
            if acc is None:
                sketches[k] = acc = _SketchSum()
            acc.add(sk)
        for k, u in p.unseen.items():
            acc_u = unseen.get(k)
            if acc_u is None:
                unseen[k] = acc_u = Counter()
            acc_u.update(u)
            if len(acc_u) > 4 * UNSEEN_KEEP:
                unseen[k] = _bottom(_positive(acc_u))
    return Partial(_positive(counts),
                   {k: hs[0] if len(hs) == 1 else _sum_all(hs) for k, hs in hists.items()},
                   {k: acc.sketch() for k, acc in sketches.items()},
                   {k: _bottom(_positive(u)) for k, u in unseen.items()},
                   profile)


class _SketchSum:
    """Sketch.merge of a sequence of sketches; the bin maps are added at the end, with numpy."""

    def __init__(self) -> None:
        self.first: Sketch | None = None
        self.pos: list[dict[int, int]] = []
        self.neg: list[dict[int, int]] = []
        self.zero = self.count = 0
        self.sum = self.sumsq = 0.0
        self.min, self.max = math.inf, -math.inf
        self.many = False

    def add(self, s: Sketch) -> None:
        if not s.count:
            return
        if self.first is None:
            self.first = s
            self.pos.append(s.pos)
            self.neg.append(s.neg)
            self.zero, self.count, self.sum, self.sumsq, self.min, self.max = \
                s.zero, s.count, s.sum, s.sumsq, s.min, s.max
            return
        self.many = True
        self.pos.append(s.pos)
        self.neg.append(s.neg)
        self.zero += s.zero
        self.count += s.count
        self.sum += s.sum
        self.sumsq += s.sumsq
        self.min, self.max = min(self.min, s.min), max(self.max, s.max)

    def sketch(self) -> Sketch:
        if self.first is None:
            return Sketch()
        if not self.many:
            return self.first
        return Sketch(_add_maps(self.pos), _add_maps(self.neg), self.zero, self.count, self.sum, self.sumsq,
                      self.min, self.max)


def _add_maps(maps: list[dict[int, int]]) -> dict[int, int]:
    """The key-wise sum of bin maps (what repeated _add gives; keys in sorted order)."""
    size = sum(len(m) for m in maps)
    if size < 64:
        out: dict[int, int] = {}
        for m in maps:
            for k, v in m.items():
                out[k] = out.get(k, 0) + v
        return out
    try:
        keys = np.fromiter(itertools.chain.from_iterable(maps), dtype="int64", count=size)
        counts = np.fromiter(itertools.chain.from_iterable(m.values() for m in maps), dtype="int64", count=size)
    except OverflowError:  # counts beyond int64
        return functools.reduce(_add, maps, {})
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return dict(zip(keys[starts].tolist(), np.add.reduceat(counts, starts).tolist(), strict=True))


def _positive(c: Counter) -> Counter:
    """What Counter addition keeps: the positive counts."""
    if all(v > 0 for v in c.values()):
        return c
    return Counter({k: v for k, v in c.items() if v > 0})


def _sum2(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if len(a) != len(b):
        raise ValueError(f"histograms of {len(a)} and {len(b)} bins do not add")
    return tuple(map(operator.add, a, b))


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
    # Group keys as integer codes (sorted like the values), so grouping is one np.unique per grouping.
    mv_codes, mv_values = _sorted_codes(frame["model_version"])
    b_codes, b_values = _bucket_codes(frame["ts"], seconds)
    base = mv_codes * len(b_values)
    base += b_codes
    del mv_codes, b_codes
    groupings = [(ALL, None)] + [(seg, frame[seg]) for seg in segments if seg in frame]
    accs: list[_Acc] = []
    keyed = []
    for name, column in groupings:
        if column is None:
            key, seg_values = base, np.array([ALL], dtype=object)
        else:
            seg_codes, seg_values = _segment_codes(name, column)
            key = base * len(seg_values)
            key += seg_codes
            del seg_codes
        keys, codes = _dense(key, len(mv_values) * len(b_values) * len(seg_values))
        del key
        mv_of, rest = np.divmod(keys, len(b_values) * len(seg_values))
        b_of, seg_of = np.divmod(rest, len(seg_values))
        accs.append(_Acc(codes, len(keys)))
        keyed.append((mv_of, b_of, seg_of, seg_values))
    del base
    # Each per-row value is computed once, counted into every grouping, and dropped.
    _fold_rows(frame, schema or Schema(), prof, timed, accs)
    out: list[PartialRow] = []
    for acc, (mv_of, b_of, seg_of, seg_values) in zip(accs, keyed, strict=True):
        for i, partial in enumerate(acc.partials(prof)):
            out.append(PartialRow(model_version=mv_values[mv_of[i]], bucket_start=b_values[b_of[i]].to_pydatetime(),
                                  bucket_seconds=seconds, segment=seg_values[seg_of[i]], rows=partial.rows,
                                  payload=partial.to_bytes()))
    return out


def _sorted_codes(values: pd.Series) -> tuple[np.ndarray, Any]:
    """Integer code of each value, and the distinct values in sorted order (code i -> values[i])."""
    if isinstance(values.dtype, np.dtype):
        codes, uniques = _sorted_factorize(values.to_numpy())
        return codes, pd.Index(uniques)
    codes, uniques = pd.factorize(values, sort=True)
    return codes.astype("int64", copy=False), uniques


def _sorted_factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """pd.factorize(values, sort=True) of a numpy array without missing values, in less memory: a small
    hash table (pandas sizes it for every row otherwise) and the few distinct values sorted after."""
    codes, uniques = pd.factorize(values, size_hint=1024)
    try:
        if (codes < 0).any():
            raise TypeError("missing values: let pandas place them")
        order = np.argsort(uniques, kind="stable")
    except TypeError:  # missing or mutually unordered values: pandas' own sort
        codes, uniques = pd.factorize(values, sort=True)
        return codes.astype("int64", copy=False), uniques
    rank = np.empty(len(order), dtype="int64")
    rank[order] = np.arange(len(order))
    return rank[codes], uniques[order]


_PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


def _bucket_codes(ts: pd.Series, seconds: int) -> tuple[np.ndarray, Any]:
    """_sorted_codes(ts.dt.floor(f"{seconds}s")); UTC timestamps floored as integers (no floored copy)."""
    dtype = ts.dtype
    if (isinstance(dtype, pd.DatetimeTZDtype) and str(dtype.tz) == "UTC" and dtype.unit in _PER_SECOND
            and seconds > 0 and not ts.isna().any()):
        step = seconds * _PER_SECOND[dtype.unit]
        floored = ts.array.asi8 // step
        codes, uniques = _sorted_factorize(floored)
        del floored
        starts = pd.DatetimeIndex((uniques * step).astype(f"M8[{dtype.unit}]")).tz_localize("UTC")
        return codes, starts.array
    return _sorted_codes(ts.dt.floor(f"{seconds}s"))


def _dense(key: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(key, return_inverse=True) for keys in 0..size-1 (by counting when size is small)."""
    if size > 4 * len(key) + 4096:
        keys, codes = np.unique(key, return_inverse=True)
        return keys, codes.astype("int64", copy=False).reshape(-1)
    keys = np.flatnonzero(np.bincount(key, minlength=size))
    remap = np.zeros(size, dtype="int64")
    remap[keys] = np.arange(len(keys))
    return keys, remap[key]


def _segment_codes(name: str, column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Codes of `name=<value>` labels (missing as `<missing>`), labels sorted as text."""
    codes, uniques = _factorize(column) or pd.factorize(column, sort=False)
    text = pd.Series(uniques, dtype=object).astype(str).to_numpy(dtype=object) if len(uniques) else np.array([], dtype=object)
    labels = np.array([f"{name}={v}" for v in text] + [f"{name}=<missing>"], dtype=object)
    # Two values may print alike (or one may be the text `<missing>`): they share a segment.
    label_codes, label_values = pd.factorize(labels, sort=True)
    codes = np.where(codes < 0, len(labels) - 1, codes)
    return label_codes[codes].astype("int64", copy=False), np.asarray(label_values, dtype=object)


# -- fold internals: each per-row value computed once, counted per grouping with bincount, dropped ---

class _Acc:
    """The per-group totals of one grouping (`g`: group of each row, `groups` of them)."""

    def __init__(self, g: np.ndarray, groups: int) -> None:
        self.g, self.groups = g, groups
        self.counts: dict[str, np.ndarray] = {}  # name -> int64 per group
        self.hists: dict[str, np.ndarray] = {}  # name -> (groups, bins)
        self.sketches: dict[str, dict[int, Sketch]] = {}
        self.unseen: dict[str, list[Counter]] = {}

    def partials(self, profile: Profile | None) -> list[Partial]:
        fingerprint = profile.fingerprint if profile is not None else ""
        counts = {k: v.tolist() for k, v in self.counts.items()}
        hists = {k: h.tolist() for k, h in self.hists.items()}
        out = []
        for i in range(self.groups):
            out.append(Partial(
                counts=Counter({k: v[i] for k, v in counts.items() if v[i]}),
                hists={k: tuple(h[i]) for k, h in hists.items()},
                sketches={k: s[i] for k, s in self.sketches.items() if i in s},
                unseen={k: u[i] for k, u in self.unseen.items() if u[i]},
                profile=fingerprint,
            ))
        return out


def _count(accs: list[_Acc], name: str, mask: np.ndarray) -> None:
    """Count the rows where `mask` (bool) holds, per group."""
    if not mask.any():
        return
    for a in accs:
        a.counts[name] = np.bincount(a.g[mask], minlength=a.groups).astype("int64", copy=False)


def _count_codes(accs: list[_Acc], names: list[str], codes: np.ndarray) -> None:
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


def _hist(accs: list[_Acc], name: str, idx: np.ndarray, bins: int) -> None:
    """Count bins 0..bins-1 per group (idx -1: no bin), in one int64 array: -1 lands in a dropped column."""
    for a in accs:
        key = a.g * (bins + 1)
        key += idx
        key += 1
        a.hists[name] = np.bincount(key, minlength=a.groups * (bins + 1)).reshape(a.groups, bins + 1)[:, 1:]


def _sketch(accs: list[_Acc], name: str, v: np.ndarray) -> None:
    for a in accs:
        a.sketches[name] = _sketches(v, a.g, a.groups)


def _fold_rows(frame: pd.DataFrame, schema: Schema, profile: Profile | None, timed: bool, accs: list[_Acc]) -> None:
    n = len(frame)
    for a in accs:
        a.counts["rows"] = np.bincount(a.g, minlength=a.groups).astype("int64", copy=False)
    status_codes, statuses = _factorize(frame["status"]) or pd.factorize(frame["status"])
    _count_codes(accs, [f"status:{s}" for s in statuses], status_codes)
    del status_codes
    if timed:
        joined = frame["joined"].to_numpy(dtype=bool)
        _count(accs, "joined", joined)
        _count(accs, "unmatched", ~joined)
        stage_rows = frame["stage_rows"].to_numpy(dtype="int64")
        if stage_rows.any():
            for a in accs:
                a.counts["stage_rows"] = np.bincount(a.g, weights=stage_rows, minlength=a.groups).astype("int64")
    if "cache_hit" in frame:
        hit = frame["cache_hit"]
        _count(accs, "cache:hit", hit.eq(True).to_numpy(dtype=bool))
        _count(accs, "cache:miss", hit.eq(False).to_numpy(dtype=bool))

    for name in [LATENCY] + [c for c in frame.columns if c.startswith(STAGE_PREFIX)]:
        if name in frame:
            _sketch(accs, name, _numbers(frame[name]))
    for name in schema.signals:
        v = _numbers(frame[name]) if name in frame else np.full(n, np.nan)
        _count(accs, f"missing:{name}", np.isnan(v))
        _sketch(accs, f"signal:{name}", v)

    fields = profile.fields if profile is not None else {}
    for name, kind in schema.features.items():
        if name not in frame:
            _count(accs, f"missing:{name}", np.ones(n, dtype=bool))
            values = pd.Series([None] * n, index=frame.index, dtype=object)
        else:
            values = frame[name]
        ref = fields.get(name)
        if ref is None or ref.kind != kind:
            if name in frame:
                _count(accs, f"missing:{name}", values.isna().to_numpy(dtype=bool))
            continue
        if kind == "numeric":
            v = _numbers(values)
            if name in frame:
                _count(accs, f"missing:{name}", np.isnan(v) if _is_float(values) else values.isna().to_numpy(dtype=bool))
            _hist(accs, name, _bins(ref.edges, v), ref.bins)
            if ref.min is not None:
                _count(accs, f"below:{name}", v < ref.min)
                _count(accs, f"above:{name}", v > ref.max)
        elif kind == "text":
            v, missing = lengths(values)
            if name in frame:
                _count(accs, f"missing:{name}", missing)
            del missing
            _hist(accs, f"len:{name}", _bins(ref.edges, v), ref.bins)
        else:
            idx = _category_bins(ref, values)
            if name in frame:
                _count(accs, f"missing:{name}", idx < 0)
            _hist(accs, name, idx, ref.bins)
            unseen = idx == len(ref.categories)
            del idx
            _count(accs, f"unseen:{name}", unseen)
            rows = np.flatnonzero(unseen)
            del unseen
            texts = values.iloc[rows].to_numpy(dtype=object).astype(str)
            t_codes, t_values = pd.factorize(texts)
            t_values = np.asarray(t_values, dtype=object).tolist()
            for a in accs:
                per = [Counter() for _ in range(a.groups)]
                if len(rows):
                    pairs, n_pairs = np.unique(a.g[rows] * len(t_values) + t_codes, return_counts=True)
                    for pair, c in zip(pairs.tolist(), n_pairs.tolist(), strict=True):
                        gi, ti = divmod(pair, len(t_values))
                        per[gi][t_values[ti]] = c
                a.unseen[name] = [_bottom(c) for c in per]
    if profile is not None:
        if profile.prediction is not None and "prediction" in frame:
            pred = profile.prediction
            if pred.kind == "categorical":
                _hist(accs, "prediction", _category_bins(pred, frame["prediction"]), pred.bins)
            else:
                _hist(accs, "prediction", pred.bin_index(frame["prediction"]), pred.bins)
        for cls, ref in profile.scores.items():
            column = schema.score_column(cls)
            if column in frame:
                _hist(accs, f"score:{cls}", _bins(ref.edges, _numbers(frame[column]))
                      if ref.kind == "numeric" else ref.bin_index(frame[column]), ref.bins)




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
    if len(flat) % 2:
        raise ValueError("a flat bin map holds key, count pairs")
    pairs = iter(flat)
    return dict(zip(pairs, pairs, strict=False))  # length checked above


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
