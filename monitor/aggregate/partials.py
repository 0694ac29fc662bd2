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
import struct
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from ddsketch.mapping import LogarithmicMapping

from monitor.aggregate import keys
from monitor.aggregate.keys import STAGE_PREFIX
from monitor.aggregate.profile import (
    FieldProfile,
    Profile,
    bin_codes,
    category_codes,
    factorize,
    is_float,
    lengths,
    numbers,
    resolve,
    tokens,
)
from monitor.schema import Schema
from storage.rows import PartialRow

ALL = ""  # the segment key for "every row"
LATENCY = "latency_ms"  # sketch key of the total latency; stages are `stage.<name>`, signals `signal:<name>`
RELATIVE_ACCURACY = 0.01
UNSEEN_KEEP = 32  # unseen category values retained per field (the ones with the smallest hash)
MIXED = "mixed"  # profile fingerprint of a merge of partials binned by different profiles
BINARY = b"TWP3"  # first bytes of a binary payload (Partial.to_bytes); JSON payloads start with `{`
BINARY_V2 = b"TWP2"  # the binary payload before TWP3, its sketches' sums and extremes in the header (still read)
TTFT = "ttft_ms"  # sketch of the time to first token (generative services), ms
TOKENS_PER_S = "output_tokens_per_s"  # sketch of output_tokens / latency per request
ARRIVAL, COMPLETION = "time:arrival", "time:completion"  # sketches of arrival and ts + latency, epoch s
TOKENS = "tokens:"  # sketches `tokens:input`, `tokens:output` (their sums are the token totals)
BY_LENGTH = "latency_by:"  # `latency_by:len:<text field>@<bucket>`, `latency_by:input_tokens@<bucket>`
LENGTH_SPLITS = (0.5, 0.8, 0.9)  # reference length quantiles splitting latency by input length
ROUTING = ("route", "expert", "replica")
ROUTE = "route:"  # counts and latency sketches `route:<field>=<value>`
ROUTE_VALUES = 256  # values per routing field a fold keeps apart; the rarer ones count as ROUTE_OTHER
ROUTE_OTHER = "<other>"
STALE = "stale:cache_version"  # unseen-style top of the cache_version values of stale hits
CACHE_STATES = ("cold", "warm")
# Counts `cache_us:<hit|miss>:rows` and `cache_us:<hit|miss>:<latency key>`: timed requests per cache outcome
# and their summed time in integer microseconds (integers, so a split merges back exactly). What a miss costs
# over a hit, stage by stage: explain splits a slowdown into "more misses" and "slower requests".
CACHE_TIME = "cache_us:"
OOV_SAMPLE = 8  # oov counts take the distinct texts whose text_hash is 0 mod this (the same texts in any split)

_MAPPING = LogarithmicMapping(RELATIVE_ACCURACY)
_LARGEST = 1e150
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
        """The sketch of `values` (non-finite values, and those beyond 1e150, are skipped)."""
        table = _Values(values).table(_Acc(np.zeros(len(values), "int64"), 1))
        return table.sketches()[0] if table is not None else cls()

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

    def bin_at_rank(self, rank: int) -> tuple[float, float] | None:
        """The least and greatest value the bin holding the rank-th smallest value (0-based) can hold, within
        min..max; None when rank is outside 0..count - 1."""
        if not 0 <= rank < self.count:
            return None
        nneg = sum(self.neg.values())
        if nneg <= rank < nneg + self.zero:
            return 0.0, 0.0
        negative = rank < nneg
        bins, at = (self.neg, nneg - rank - 1) if negative else (self.pos, rank - nneg - self.zero)
        # A bin's representative value is within RELATIVE_ACCURACY of every value the bin holds.
        mid = _MAPPING.value(_key_at_rank(bins, at, lower=True))
        low, high = mid / (1 + RELATIVE_ACCURACY), mid / (1 - RELATIVE_ACCURACY)
        if negative:
            low, high = -high, -low
        return max(low, self.min), min(high, self.max)

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
        """The partial serialized: BINARY (a small JSON header; each sketch's sum, sumsq, min and max as
        float64; then every histogram count and sketch bin as one int16, int32 or int64 array), or JSON when a
        count does not fit 64 bits. from_bytes reads both, and the payloads stored before (BINARY_V2, JSON)."""
        try:
            return self._binary()
        except OverflowError:
            return self._json()

    def _binary(self) -> bytes:
        hists = sorted(self.hists.items())
        sketches = sorted(self.sketches.items())
        maps = [(sorted(sk.pos), sk.pos, sorted(sk.neg), sk.neg) for _, sk in sketches]
        head: dict[str, Any] = {"counts": dict(sorted(self.counts.items())), "hists": [[k, len(v)] for k, v in hists],
                                "sketches": [[k, len(m[0]), len(m[2]), sk.zero, sk.count]
                                             for (k, sk), m in zip(sketches, maps, strict=True)]}
        # Binary floats: the shortest repr of every sum was most of the time a fold spent writing partials.
        floats = np.array([x for _, sk in sketches for x in (sk.sum, sk.sumsq, sk.min, sk.max)], dtype="<f8")
        _finite(floats)
        if self.unseen:
            head["unseen"] = {k: dict(sorted(v.items())) for k, v in sorted(self.unseen.items())}
        if self.profile:
            head["profile"] = self.profile
        ints = itertools.chain(
            itertools.chain.from_iterable(v for _, v in hists),
            itertools.chain.from_iterable(itertools.chain(pk, map(pos.__getitem__, pk), nk, map(neg.__getitem__, nk))
                                          for pk, pos, nk, neg in maps))
        size = sum(len(v) for _, v in hists) + 2 * sum(len(m[0]) + len(m[2]) for m in maps)
        values = np.fromiter(ints, dtype="<i8", count=size)  # OverflowError past int64
        low, high = (int(values.min()), int(values.max())) if size else (0, 0)
        for small in ("<i2", "<i4"):  # bin keys and most counts are small: fewer bytes than JSON's digits
            if np.iinfo(small).min <= low and high <= np.iinfo(small).max:
                values = values.astype(small)
                break
        head["int"] = values.dtype.itemsize
        header = json.dumps(head, separators=(",", ":"), allow_nan=False).encode()
        header += b" " * (-len(header) % 8)  # the floats, then the integers, start 8-aligned
        return BINARY + struct.pack("<I", len(header)) + header + floats.tobytes() + values.tobytes()

    def _json(self) -> bytes:
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
        if data[:4] in (BINARY, BINARY_V2):
            return cls._from_binary(data)
        body = json.loads(data)
        return cls(Counter(body["counts"]),
                   {k: tuple(v) for k, v in body.get("hists", {}).items()},
                   {k: Sketch.from_json(v) for k, v in body.get("sketches", {}).items()},
                   {k: Counter(v) for k, v in body.get("unseen", {}).items()},
                   body.get("profile", ""))

    @classmethod
    def _from_binary(cls, data: bytes) -> Partial:
        (n,) = struct.unpack_from("<I", data, 4)
        head = json.loads(data[8:8 + n])
        floats, at = payload_floats(data, n, head)
        values = np.frombuffer(data, dtype=f"<i{head['int']}", offset=at).tolist()
        i = 0
        hists = {}
        for name, bins in head["hists"]:
            hists[name] = tuple(values[i:i + bins])
            i += bins
        sketches = {}
        for j, (name, npos, nneg, zero, count, *v2) in enumerate(head["sketches"]):
            total, squares, lo, hi = v2 or floats[4 * j:4 * j + 4]
            pos = dict(zip(values[i:i + npos], values[i + npos:i + 2 * npos], strict=True))
            i += 2 * npos
            neg = dict(zip(values[i:i + nneg], values[i + nneg:i + 2 * nneg], strict=True))
            i += 2 * nneg
            sketches[name] = Sketch(pos, neg, zero, count, total, squares, lo, hi)
        if i != len(values):
            raise ValueError(f"partial payload holds {len(values)} values, its header describes {i}")
        return cls(Counter(head["counts"]), hists, sketches,
                   {k: Counter(v) for k, v in head.get("unseen", {}).items()}, head.get("profile", ""))


def payload_floats(data: bytes, n: int, head: dict) -> tuple[list[float], int]:
    """A binary payload's sketch floats (sum, sumsq, min, max per sketch; none in BINARY_V2, whose header
    holds them) and where its integers start; `n` its header's length."""
    if data[:4] == BINARY_V2:
        return [], 8 + n
    size = 4 * len(head["sketches"])
    return np.frombuffer(data, dtype="<f8", count=size, offset=8 + n).tolist(), 8 + n + 8 * size


def _finite(floats: np.ndarray) -> None:
    if not np.isfinite(floats).all():  # an overflowed sum: refused, as the JSON header refused it before
        raise ValueError("Out of range float values are not JSON compliant")


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
    # With a segment column, the every-row partials are its segments' added up (_Acc.summed): the rows
    # are counted once per segmentation, not once more for ALL.
    groupings = [(seg, frame[seg]) for seg in segments if seg in frame] or [(ALL, None)]
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
    everyone = accs[0]  # the every-row grouping, for what only the every-row partials hold
    if groupings[0][1] is not None:
        src = min(range(len(accs)), key=lambda i: accs[i].groups)  # the fewest groups: the least to add up
        mv_of, b_of = keyed[src][:2]
        parent = mv_of * len(b_values) + b_of  # non-decreasing: the keys are sorted (version, bucket, segment)
        dense = np.cumsum(np.r_[0, parent[1:] != parent[:-1]])  # group -> its parent's group, 0..n-1
        everyone = _Acc(dense[accs[src].g], int(dense[-1]) + 1)
    # Each per-row value is computed once, counted into every grouping, and dropped.
    _fold_rows(frame, schema or Schema(), prof, timed, accs, everyone)
    if groupings[0][1] is not None:
        accs.insert(0, accs[src].summed(dense))
        accs[0].sketches.update(everyone.sketches)
        whole = np.empty(everyone.groups, dtype="int64")
        whole[dense] = parent  # each parent group's (version, bucket) key
        del everyone
        keyed.insert(0, (*np.divmod(whole, len(b_values)), np.zeros(len(whole), "int64"),
                         np.array([ALL], dtype=object)))
    out: list[PartialRow] = []
    # The keys as Python objects once, not a pandas scalar per partial.
    versions, starts = list(mv_values), [b.to_pydatetime() for b in b_values]
    for acc, (mv_of, b_of, seg_of, seg_values) in zip(accs, keyed, strict=True):
        for (rows, payload), m, b, seg in zip(acc.payloads(prof), mv_of.tolist(), b_of.tolist(), seg_of.tolist(),
                                             strict=True):
            out.append(PartialRow(model_version=versions[m], bucket_start=starts[b], bucket_seconds=seconds,
                                  segment=seg_values[seg], rows=rows, payload=payload))
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
    codes, uniques = factorize(column) or pd.factorize(column, sort=False)
    text = pd.Series(uniques, dtype=object).astype(str).to_numpy(dtype=object) if len(uniques) else np.array([], dtype=object)
    labels = np.array([f"{name}={v}" for v in text] + [f"{name}=<missing>"], dtype=object)
    # Two values may print alike (or one may be the text `<missing>`): they share a segment.
    label_codes, label_values = pd.factorize(labels, sort=True)
    codes = np.where(codes < 0, len(labels) - 1, codes)
    return label_codes[codes].astype("int64", copy=False), np.asarray(label_values, dtype=object)


# -- fold internals: each per-row value computed once, counted per grouping with bincount, dropped ---

class _Acc:
    """The per-group totals of one grouping (`g`: group of each row, `groups` of them)."""

    def __init__(self, g: np.ndarray | None, groups: int) -> None:
        self.g, self.groups = g, groups  # g None: totals added up from another grouping (no rows)
        self._order: np.ndarray | None = None
        self._sorted: bool | None = None
        self._runs: tuple[np.ndarray, np.ndarray] | None = None
        self.counts: dict[str, np.ndarray] = {}  # name -> int64 per group
        self.hists: dict[str, np.ndarray] = {}  # name -> (groups, bins)
        self.sketches: dict[str, _SketchTable] = {}
        self.unseen: dict[str, list[Counter]] = {}

    def order(self) -> np.ndarray | None:
        """The rows in group order (stable: time order within a group), taken once for every sketch of
        this grouping; None when the rows are in group order already."""
        if self._sorted is None:
            self._sorted = not bool((self.g[1:] < self.g[:-1]).any())
            if not self._sorted:
                self._order = _stable_order(self.g, self.groups)
        return self._order

    def runs(self) -> tuple[np.ndarray, np.ndarray]:
        """The group of each row in group order, and the position where each group's run starts."""
        if self._runs is None:
            order = self.order()
            g = self.g if order is None else self.g[order]
            self._runs = g, np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        return self._runs

    def summed(self, dense: np.ndarray) -> _Acc:
        """The groups dense[g] (each group's parent, 0..n-1, non-decreasing in g), each holding its groups
        added up. Counts, histograms and sketch bins are exact; sketch sums are added per group, so their
        last bits may differ from a sum over the rows."""
        starts = np.flatnonzero(np.r_[True, dense[1:] != dense[:-1]])
        out = _Acc(None, len(starts))
        out.counts = {k: np.add.reduceat(v, starts) for k, v in self.counts.items()}
        out.hists = {k: np.add.reduceat(v, starts, axis=0) for k, v in self.hists.items()}
        out.sketches = {k: t.summed(dense) for k, t in self.sketches.items()}
        ends = [*starts[1:].tolist(), self.groups]
        out.unseen = {k: [_bottom(sum(per[a:b], Counter())) for a, b in zip(starts.tolist(), ends, strict=True)]
                      for k, per in self.unseen.items()}
        return out

    def payloads(self, profile: Profile | None) -> list[tuple[int, bytes]]:
        """(rows, Partial.to_bytes()) of each group, written without building the Partials: the same bytes.

        Every group's integers (its histogram row, then each sketch's bin keys and counts) are gathered
        from the arrays in one take. The JSON header is written as json.dumps(head, separators=(",", ":"),
        allow_nan=False) writes it, from pieces encoded once per name; each group's sketch floats, like its
        integers, come from one take."""
        counts = [(_json(k), self.counts[k].tolist()) for k in sorted(self.counts)]
        rows = self.counts["rows"].tolist() if "rows" in self.counts else [0] * self.groups
        hist_names = sorted(self.hists)
        hists = _json([[k, self.hists[k].shape[1]] for k in hist_names])
        tables = [(k, self.sketches[k]) for k in sorted(self.sketches)]
        flat, bounds, width = self._ints(hist_names, [t for _, t in tables])
        floats, f_bounds = self._floats([t for _, t in tables])
        entries = []  # per sketch: each group's header entry, or None
        for name, t in tables:
            npos = np.bincount(t.pos[0], minlength=self.groups)[t.present].tolist()
            nneg = np.bincount(t.neg[0], minlength=self.groups)[t.present].tolist()
            per: list[str | None] = [None] * self.groups
            key = _json(name)
            for gi, p, n, z, c in zip(t.present.tolist(), npos, nneg, t.zero.tolist(), t.count.tolist(), strict=True):
                per[gi] = f"[{key},{p},{n},{z},{c}]"
            entries.append(per)
        unseen = sorted(self.unseen.items())
        tail = f',"profile":{_json(profile.fingerprint)}' if profile is not None and profile.fingerprint else ""
        arrays = {2: flat.astype("<i2"), 4: flat.astype("<i4"), 8: flat.astype("<i8")}
        out = []
        for i, (a, b, w) in enumerate(zip(bounds[:-1], bounds[1:], width, strict=True)):
            counted = ",".join([f"{k}:{v[i]}" for k, v in counts if v[i]])
            sketched = ",".join([e[i] for e in entries if e[i] is not None])
            held = {k: dict(sorted(u[i].items())) for k, u in unseen if u[i]}
            extra = f',"unseen":{_json(held)}' if held else ""
            header = f'{{"counts":{{{counted}}},"hists":{hists},"sketches":[{sketched}]{extra}{tail},"int":{w}}}'.encode()
            header += b" " * (-len(header) % 8)
            out.append((rows[i], BINARY + struct.pack("<I", len(header)) + header
                        + floats[32 * f_bounds[i]:32 * f_bounds[i + 1]] + arrays[w][a:b].tobytes()))
        return out

    def _floats(self, tables: list[_SketchTable]) -> tuple[bytes, list[int]]:
        """Every group's sketch floats (sum, sumsq, min, max of each sketch it holds, sketches in the order
        of `tables`) one group after the other, as float64 bytes; and each group's bounds, in sketches."""
        if not tables:
            return b"", [0] * (self.groups + 1)
        group = np.concatenate([t.present for t in tables])
        rank = np.concatenate([np.full(len(t.present), r) for r, t in enumerate(tables)])
        values = np.concatenate([np.column_stack([t.total, t.squares, t.lo, t.hi]) for t in tables])
        _finite(values)
        values = values[np.lexsort((rank, group))]
        bounds = np.r_[0, np.cumsum(np.bincount(group, minlength=self.groups))].tolist()
        return values.astype("<f8").tobytes(), bounds

    def _ints(self, hist_names: list[str], tables: list[_SketchTable]) -> tuple[np.ndarray, list[int], list[int]]:
        """Every group's integers, one group after the other (as int64); the groups' bounds in them; and
        the bytes per integer each group is written with (as Partial._binary: the smallest that fits)."""
        pool = [np.hstack([self.hists[k] for k in hist_names]).astype("int64").ravel()] if hist_names else []
        width = pool[0].size // self.groups if pool else 0
        # Segments (group, rank within the group, start in the pool, length): the histogram row, then each
        # sketch's positive keys, their counts, negative keys, their counts.
        group, rank, start, size = [np.arange(self.groups)], [np.zeros(self.groups, "int64")], \
            [np.arange(self.groups) * width], [np.full(self.groups, width)]
        at = width * self.groups
        for r, t in enumerate(tables):
            for s, (owner, key, cnt) in enumerate((t.pos, t.neg)):
                first = np.searchsorted(owner, t.present, side="left")
                n = np.searchsorted(owner, t.present, side="right") - first
                for c, part in enumerate((key, cnt)):
                    group.append(t.present)
                    rank.append(np.full(len(t.present), 1 + 4 * r + 2 * s + c))
                    start.append(first + at)
                    size.append(n)
                    pool.append(part)
                    at += len(part)
        group, rank, start, size = (np.concatenate(x).astype("int64", copy=False) for x in (group, rank, start, size))
        keep = size > 0
        group, rank, start, size = group[keep], rank[keep], start[keep], size[keep]
        ends = np.cumsum(np.bincount(group, weights=size, minlength=self.groups).astype("int64"))
        order = np.lexsort((rank, group))
        start, size = start[order], size[order]
        total = int(size.sum())
        # Each segment's pool positions: start, start + 1, ... (one arange, shifted per segment).
        shift = np.repeat(start - (np.cumsum(size) - size), size)
        flat = np.concatenate(pool)[np.arange(total) + shift] if total else np.zeros(0, "int64")
        bounds = [0, *ends.tolist()]
        filled = np.flatnonzero(np.diff(np.r_[0, ends]) > 0)
        low, high = np.zeros(self.groups, "int64"), np.zeros(self.groups, "int64")
        if total:
            firsts = np.r_[0, ends][filled]
            low[filled], high[filled] = np.minimum.reduceat(flat, firsts), np.maximum.reduceat(flat, firsts)
        w = np.where((low >= -2**15) & (high < 2**15), 2, np.where((low >= -2**31) & (high < 2**31), 4, 8))
        return flat, bounds, w.tolist()


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def _stable_order(g: np.ndarray, groups: int) -> np.ndarray:
    """np.argsort(g, kind="stable") for group codes 0..groups-1: as int16 when they fit, numpy's radix sort."""
    return np.argsort(g.astype("int16") if groups <= 2**15 else g, kind="stable")


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


def _sketch(accs: list[_Acc], name: str, v: np.ndarray | _Values, rows: np.ndarray | None = None) -> None:
    """Sketch one value per row (all rows, or where bool `rows`) per group."""
    values = v if isinstance(v, _Values) else _Values(v)
    for a in accs:
        table = values.table(a, rows)
        if table is not None:
            a.sketches[name] = table


def _fold_rows(frame: pd.DataFrame, schema: Schema, profile: Profile | None, timed: bool, accs: list[_Acc],
               everyone: _Acc) -> None:
    """Count and sketch each per-row value into every grouping of `accs`; what only the every-row partials
    hold into `everyone` (one of `accs` when there is no segment column)."""
    n = len(frame)
    for a in accs:
        a.counts["rows"] = np.bincount(a.g, minlength=a.groups).astype("int64", copy=False)
    status_codes, statuses = factorize(frame["status"]) or pd.factorize(frame["status"])
    _count_codes(accs, [keys.status(s) for s in statuses], status_codes)
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
        hits = hit.eq(True).to_numpy(dtype=bool)
        misses = hit.eq(False).to_numpy(dtype=bool)
        _count(accs, keys.cache_hit(), hits)
        _count(accs, keys.cache_miss(), misses)
        _fold_cache(frame, hits, misses, accs)
        if timed:
            _fold_cache_time(frame, hits & joined, misses & joined, accs)
    latency = _Values(numbers(frame[LATENCY])) if LATENCY in frame else None
    _fold_service(frame, accs, latency, everyone)

    for name in [LATENCY] + [c for c in frame.columns if c.startswith(STAGE_PREFIX)]:
        if name in frame:
            _sketch(accs, name, latency if name == LATENCY else numbers(frame[name]))
    for name in schema.signals:
        v = numbers(frame[name]) if name in frame else np.full(n, np.nan)
        _count(accs, keys.missing(name), np.isnan(v))
        _sketch(accs, f"signal:{name}", v)

    fields = profile.fields if profile is not None else {}
    for name, kind in schema.features.items():
        if name not in frame:
            _count(accs, keys.missing(name), np.ones(n, dtype=bool))
            values = pd.Series([None] * n, index=frame.index, dtype=object)
        else:
            values = frame[name]
        ref = fields.get(name)
        if ref is None or ref.kind != kind:
            if name in frame:
                _count(accs, keys.missing(name), values.isna().to_numpy(dtype=bool))
            continue
        if kind == "numeric":
            v = numbers(values)
            if name in frame:
                _count(accs, keys.missing(name), np.isnan(v) if is_float(values) else values.isna().to_numpy(dtype=bool))
            _hist(accs, name, bin_codes(ref.edges, v), ref.bins)
            if ref.min is not None:
                _count(accs, keys.below(name), v < ref.min)
                _count(accs, keys.above(name), v > ref.max)
        elif kind == "text":
            factorized = factorize(values)
            v, missing = lengths(values, factorized)
            if name in frame:
                _count(accs, keys.missing(name), missing)
            del missing
            idx = bin_codes(ref.edges, v)
            _hist(accs, keys.length(name), idx, ref.bins)
            _latency_by_length(latency, accs, keys.length(name), ref, idx)
            del idx
            if ref.vocabulary and factorized is not None:
                _fold_oov(name, ref, factorized, accs)
        else:
            idx = category_codes(ref, values)
            if name in frame:
                _count(accs, keys.missing(name), idx < 0)
            _hist(accs, name, idx, ref.bins)
            unseen = idx == len(ref.categories)
            del idx
            _count(accs, keys.unseen(name), unseen)
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
        ref = profile.input_tokens
        if ref is not None and ref.edges and "input_tokens" in frame:
            _latency_by_length(latency, accs, "input_tokens", ref, bin_codes(ref.edges, numbers(frame["input_tokens"])))
        if profile.prediction is not None and "prediction" in frame:
            pred = profile.prediction
            if pred.kind == "categorical":
                _hist(accs, "prediction", category_codes(pred, frame["prediction"]), pred.bins)
            else:
                _hist(accs, "prediction", pred.bin_index(frame["prediction"]), pred.bins)
        for cls, ref in profile.scores.items():
            column = schema.score_column(cls)
            if column in frame:
                _hist(accs, keys.score(cls), bin_codes(ref.edges, numbers(frame[column]))
                      if ref.kind == "numeric" else ref.bin_index(frame[column]), ref.bins)


def _sum(accs: list[_Acc], name: str, weights: np.ndarray) -> None:
    """Add up integer `weights` per group."""
    if not weights.any():
        return
    for a in accs:
        a.counts[name] = np.bincount(a.g, weights=weights, minlength=a.groups).round().astype("int64")


def _strings(column: pd.Series) -> np.ndarray:
    """The column as an object array of str, None where missing."""
    return column.astype(object).where(column.notna(), None).map(str, na_action="ignore").to_numpy(dtype=object)


def _text_codes(column: pd.Series) -> tuple[np.ndarray, Any]:
    """pd.factorize(_strings(column)): codes in order of first appearance, -1 for missing. Arrow text and
    categories of text are encoded as they are (the same order), without a Python str per row."""
    dtype = column.dtype
    if ((isinstance(dtype, pd.ArrowDtype) and pa.types.is_string(dtype.pyarrow_dtype))
            or (isinstance(dtype, pd.CategoricalDtype) and pd.api.types.infer_dtype(dtype.categories) == "string")):
        codes, values = pd.factorize(column)
        return codes.astype("int64", copy=False), np.asarray(values, dtype=object)
    return pd.factorize(_strings(column))


def _fold_cache(frame: pd.DataFrame, hits: np.ndarray, misses: np.ndarray, accs: list[_Acc]) -> None:
    """Stale hits (cache_version names neither the serving model nor its preprocessing) and hits and
    misses per cold / warm cache state, when the log carries them."""
    if "cache_version" in frame and hits.any():
        rows = np.flatnonzero(hits & frame["cache_version"].notna().to_numpy(dtype=bool))
        cached = _strings(frame["cache_version"].iloc[rows])
        model = _strings(frame["model_version"].iloc[rows])
        fresh = cached == model
        if "preprocess_version" in frame:
            pre = _strings(frame["preprocess_version"].iloc[rows])
            both = np.array([f"{m}/{p}" for m, p in zip(model.tolist(), pre.tolist(), strict=True)], dtype=object)
            fresh |= (cached == pre) | (cached == both)
        versioned = np.zeros(len(frame), dtype=bool)
        versioned[rows] = True
        stale = np.zeros(len(frame), dtype=bool)
        stale[rows[~fresh]] = True
        _count(accs, keys.VERSIONED_HIT, versioned)
        _count(accs, keys.STALE_HITS, stale)
        _top_values(accs, STALE, rows[~fresh], cached[~fresh])
    state = None
    if "cache_state" in frame:
        state = frame["cache_state"].astype(object).map(lambda x: str(x).lower() if isinstance(x, str) else None)
    elif "cold" in frame:
        state = frame["cold"].map({True: "cold", False: "warm"})
    if state is not None:
        for name in CACHE_STATES:
            on = state.eq(name).to_numpy(dtype=bool)
            _count(accs, keys.cache_hit(name), hits & on)
            _count(accs, keys.cache_miss(name), misses & on)


def _fold_cache_time(frame: pd.DataFrame, hits: np.ndarray, misses: np.ndarray, accs: list[_Acc]) -> None:
    """Per cache outcome of the timed requests, their count and summed total and stage times (CACHE_TIME).
    A stage a hit skips has no timing row: it counts as 0 ms, which is what the request spent in it."""
    outcomes = [(outcome, rows) for outcome, rows in (("hit", hits), ("miss", misses)) if rows.any()]
    for outcome, rows in outcomes:
        _count(accs, f"{CACHE_TIME}{outcome}:rows", rows)
    for name in [LATENCY] + [c for c in frame.columns if c.startswith(STAGE_PREFIX)]:
        if name in frame and outcomes:
            us = np.rint(np.nan_to_num(numbers(frame[name]), nan=0.0, posinf=0.0, neginf=0.0) * 1000)
            for outcome, rows in outcomes:
                _sum(accs, f"{CACHE_TIME}{outcome}:{name}", np.where(rows, us, 0.0))


def _top_values(accs: list[_Acc], key: str, rows: np.ndarray, texts: np.ndarray) -> None:
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
        a.unseen[key] = [_bottom(c) for c in per]


def _epoch_seconds(ts: pd.Series) -> np.ndarray:
    """Seconds since the epoch (NaN for NaT), as float64."""
    dtype = ts.dtype
    if isinstance(dtype, pd.DatetimeTZDtype) and dtype.unit in _PER_SECOND and not ts.isna().any():
        return ts.array.asi8 / _PER_SECOND[dtype.unit]  # one array, no timedelta copy
    return ((ts - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)).to_numpy(dtype=float, na_value=np.nan)


def _fold_service(frame: pd.DataFrame, accs: list[_Acc], lat: _Values | None, everyone: _Acc) -> None:
    """What the latency and hotspot checks add to latency (`lat`, None without it): time to first
    token, output tokens per second, token totals, arrival and completion times (throughput, queue
    trend), and traffic per routing value; latency per routing value into `everyone` only."""
    latency = lat.v if lat is not None else None
    if TTFT in frame:
        _sketch(accs, TTFT, numbers(frame[TTFT]))
    for kind in ("input", "output"):
        if f"{kind}_tokens" in frame:
            _sketch(accs, f"{TOKENS}{kind}", numbers(frame[f"{kind}_tokens"]))
    if latency is not None and "output_tokens" in frame:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # 0 ms: inf, which sketches skip
            _sketch(accs, TOKENS_PER_S, numbers(frame["output_tokens"]) / (latency / 1000.0))
    if frame["ts"].dtype.kind == "M":
        arrival = _epoch_seconds(frame["ts"])
        _sketch(accs, ARRIVAL, arrival)
        if latency is not None:
            _sketch(accs, COMPLETION, arrival + latency / 1000.0)
    for name in ROUTING:
        if name not in frame:
            continue
        codes, values = _text_codes(frame[name])
        if not len(values):
            continue
        if len(values) > ROUTE_VALUES:
            busy = np.argsort(-np.bincount(codes[codes >= 0], minlength=len(values)), kind="stable")[:ROUTE_VALUES]
            remap = np.full(len(values) + 1, len(busy))
            remap[busy] = np.arange(len(busy))
            remap[-1] = -1
            codes = remap[codes]
            values = np.append(np.asarray(values, dtype=object)[busy], ROUTE_OTHER)
        names = [f"{ROUTE}{name}={v}" for v in values]
        _count_codes(accs, names, codes)
        if lat is not None:
            on = codes >= 0
            every = bool(on.all())
            k = len(names)
            # Of all traffic only: a slow replica is slow for every segment, and its latency sketches per
            # segment were 8 of every 9 sketches a step wrote and a tenth of a tick's CPU, for findings that
            # repeated the every-row one. A segment's partials keep its traffic per value (the share).
            # (group, value) pairs as the groups of one table: one sort, one pass for every value.
            pair = everyone.g * k
            pair += codes
            if not every:
                pair[~on] = 0  # rows without a value: left out below
            table = lat.table(_Acc(pair, everyone.groups * k), None if every else on)
            if table is not None:
                for key, part in zip(names, table.split(k), strict=True):
                    if len(part.present):
                        everyone.sketches[key] = part


def length_buckets(ref: FieldProfile) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """The reference length edges (at LENGTH_SPLITS quantiles of `ref`'s bins) that split latency by
    input length, and the bucket labels (`<120`, `120-400`, `400+`)."""
    edges = ref.edges
    if not edges:
        return (), ("all",)
    picks = sorted({min(max(round(q * (len(edges) + 1)) - 1, 0), len(edges) - 1) for q in LENGTH_SPLITS})
    cuts = tuple(edges[i] for i in picks)
    labels = [f"<{cuts[0]:g}"] + [f"{a:g}-{b:g}" for a, b in itertools.pairwise(cuts)] + [f"{cuts[-1]:g}+"]
    return cuts, tuple(labels)


def _latency_by_length(latency: _Values | None, accs: list[_Acc], source: str, ref: FieldProfile,
                       idx: np.ndarray) -> None:
    """Latency sketches per input-length bucket; `idx` the rows' bins on `ref.edges` (-1 missing)."""
    if latency is None or not ref.edges:
        return
    cuts, labels = length_buckets(ref)
    # Bin i of ref.edges lies at or above edges[i - 1]: its bucket is the number of cuts <= that edge.
    lower = np.r_[-np.inf, np.asarray(ref.edges, dtype=float)]
    bucket_of = np.searchsorted(np.asarray(cuts), lower, side="right")
    bucket = np.where(idx >= 0, bucket_of[np.maximum(idx, 0)], -1)
    for b, label in enumerate(labels):
        rows = bucket == b
        if rows.any():
            _sketch(accs, f"{BY_LENGTH}{source}@{label}", latency, rows)


_HASH_BYTES = 16  # bytes of a text its hash reads (with its length)
_HASH_CHUNK = 65536  # texts per gather: bounds the index matrix at 8 MiB
_HASH_MULT = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F], dtype=np.uint64)


def text_hash(texts: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each text (object array of str) from its UTF-8 length and first 16 bytes: the
    same in every process (Python's hash is not), vectorized (pandas' hash_array encodes one by one)."""
    arr = pa.array(texts, type=pa.large_string())
    if arr.offset or arr.null_count:
        arr = pa.concat_arrays([arr.fill_null("")])
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64, count=len(arr) + 1)
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8) if arr.buffers()[2] is not None else np.zeros(1, np.uint8)
    if not len(data):
        data = np.zeros(1, np.uint8)
    size = np.diff(offsets)
    cols = np.arange(_HASH_BYTES)
    h = size.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93)
    with np.errstate(over="ignore"):
        for a in range(0, len(arr), _HASH_CHUNK):
            b = min(a + _HASH_CHUNK, len(arr))
            idx = np.minimum(offsets[a:b, None] + cols, len(data) - 1)
            block = data[idx]
            block[cols >= size[a:b, None]] = 0  # bytes past a short text's end
            words = block.view(np.uint64)
            h[a:b] += (words * _HASH_MULT).sum(axis=1, dtype=np.uint64)
        # splitmix64's finalizer: every input bit reaches the low bits that the sample reads
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    return h


def _fold_oov(name: str, ref: FieldProfile, factorized: tuple[np.ndarray, Any], accs: list[_Acc]) -> None:
    """Tokens and out-of-vocabulary tokens (`tokens:<f>`, `oov:<f>`) and the texts they came from
    (`oov_texts:<f>`), over the distinct texts sampled by hash (1 in OOV_SAMPLE)."""
    codes, uniques = factorized
    distinct = np.asarray(uniques, dtype=object)
    if not len(distinct):
        return
    if pd.api.types.infer_dtype(distinct, skipna=False) == "string":  # all str, checked in C
        texts = np.arange(len(distinct))
    else:
        texts = np.fromiter((isinstance(x, str) for x in distinct.tolist()), dtype=bool, count=len(distinct)).nonzero()[0]
    chosen = texts[text_hash(distinct[texts]) % OOV_SAMPLE == 0] if len(texts) else texts
    if not len(chosen):
        return
    flat, parent = tokens(distinct[chosen])
    known = pc.is_in(flat, value_set=pa.array(list(ref.vocabulary), type=flat.type)).to_numpy(zero_copy_only=False)
    per_tokens = np.zeros(len(distinct) + 1)
    per_oov = np.zeros(len(distinct) + 1)
    per_text = np.zeros(len(distinct) + 1)
    per_tokens[chosen] = np.bincount(parent, minlength=len(chosen))
    per_oov[chosen] = np.bincount(parent, weights=~known, minlength=len(chosen))
    per_text[chosen] = 1
    _sum(accs, keys.tokens(name), per_tokens[codes])  # code -1 (missing) reads the last slot: 0
    _sum(accs, keys.oov(name), per_oov[codes])
    _sum(accs, keys.oov_texts(name), per_text[codes])


class _Values:
    """One value per row, prepared once for the sketches of every grouping and subset of rows: which
    rows a sketch takes (finite and within 1e150: the square of a larger one, in `sumsq`, would not be),
    and, when first needed, each one's sign and bin key."""

    def __init__(self, v: np.ndarray) -> None:
        self.v = v = np.ascontiguousarray(v, dtype=float)
        ok = np.abs(v) < _LARGEST
        self.ok = None if ok.all() else ok  # None: every row

    @functools.cached_property
    def signs(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows binned as positive, as negative (bool); the others count as zero."""
        return self.v > _MAPPING.min_possible, self.v < -_MAPPING.min_possible

    @functools.cached_property
    def key(self) -> np.ndarray:
        """Each row's bin key (that of |v|; keys of zero and skipped rows are not read)."""
        return _keys(self.v)

    def table(self, acc: _Acc, rows: np.ndarray | None = None) -> _SketchTable | None:
        """The sketches of the rows (all, or where bool `rows`) per group of `acc`. Sums add each group's
        values in row order."""
        g, groups, order = acc.g, acc.groups, acc.order()
        take = self.ok if rows is None else rows if self.ok is None else rows & self.ok
        if order is None:
            sel = None if take is None else np.flatnonzero(take)
        else:
            sel = order if take is None else order[take[order]]
        v = self.v if sel is None else self.v[sel]
        if not len(v):
            return None
        if take is None:
            gs, starts = acc.runs()
        else:
            gs = g[sel]
            starts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
        count = np.diff(np.r_[starts, len(gs)])
        present = gs[starts]
        total = np.add.reduceat(v, starts)
        squares = np.add.reduceat(v * v, starts)
        lo, hi = np.minimum.reduceat(v, starts), np.maximum.reduceat(v, starts)
        del v, gs, sel
        empty = np.zeros(0, dtype="int64")
        single = _single_bin(lo, hi)
        if single is not None:
            # Each group's values share one positive bin (times of day within a bucket, say): its key is
            # that of its min, no key per row.
            return _SketchTable(present, count, total, squares, lo, hi, np.zeros(len(present), "int64"),
                                (present, single, count), (empty, empty, empty))
        bins = []
        zero = count.copy()  # less the values binned below
        for side in self.signs:
            # Bin counts do not depend on the order of the rows: counted where they are, no gather.
            mask = side if take is None else side & take
            everyone = bool(mask.all())
            key, owner = (self.key, g) if everyone else (self.key[mask], g[mask])
            bins.append(_bin_counts(key, owner, groups))
            zero -= np.bincount(bins[-1][0], weights=bins[-1][2], minlength=groups).astype("int64")[present]
        return _SketchTable(present, count, total, squares, lo, hi, zero, bins[0], bins[1])


def _log_keys(v: np.ndarray) -> np.ndarray:
    """log|v| in bin widths: a value's bin key is the ceiling (nonsense for zero and non-finite values)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(np.abs(v))
    logs /= _LOG_GAMMA
    return logs


def _keys(v: np.ndarray) -> np.ndarray:
    """The bin key of each |v| (garbage for zero and non-finite values, which are not binned)."""
    logs = _log_keys(v)
    with np.errstate(invalid="ignore"):
        np.ceil(logs, out=logs)
        return logs.astype("int64")


_KEY_MARGIN = 1e-6  # in keys: far above the few ulps by which log may round a value and its group's min apart


def _single_bin(lo: np.ndarray, hi: np.ndarray) -> np.ndarray | None:
    """When every group's values (min `lo`, max `hi`) are positive and surely in one bin, that bin's key per
    group; else None. Sure: lo and hi sit inside the same bin, _KEY_MARGIN away from its edges, so that
    no value between them can round into the next."""
    if not (lo > _MAPPING.min_possible).all():
        return None
    x_lo, x_hi = _log_keys(lo), _log_keys(hi)
    key = np.ceil(x_lo)
    if not ((x_lo > key - 1 + _KEY_MARGIN) & (x_hi < key - _KEY_MARGIN)).all():
        return None
    return key.astype("int64")


def _bin_counts(key: np.ndarray, g: np.ndarray, groups: int,
                weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group, key, count) of each bin holding a value, sorted by group, then key. `weights`: how many values
    each entry stands for (whole numbers below 2**53, exact as floats; default one each)."""
    if not len(key):
        empty = np.zeros(0, dtype="int64")
        return empty, empty, empty
    low, high = int(key.min()), int(key.max())
    span = high - low + 1
    if groups * span <= 4 * len(key) + 65536:
        # Few distinct keys per group (the usual case): counted in one bincount, no sort.
        code = g * span
        code += key
        code -= low
        table = np.bincount(code, weights=weights, minlength=groups * span)
        uniq = np.flatnonzero(table)
        owner = uniq // span
        return owner, uniq - owner * span + low, table[uniq].astype("int64", copy=False)
    code = g << 32
    code += key
    code += 1 << 31
    if weights is not None:
        uniq, at = np.unique(code, return_inverse=True)
        cnt = np.bincount(at.reshape(-1), weights=weights).astype("int64")
    elif (code[1:] < code[:-1]).any():
        uniq, cnt = np.unique(code, return_counts=True)
    else:  # sorted already (arrival times in order): runs, no sort
        edges = np.flatnonzero(np.r_[True, code[1:] != code[:-1]])
        uniq, cnt = code[edges], np.diff(np.r_[edges, len(code)])
    return uniq >> 32, (uniq & 0xFFFFFFFF) - (1 << 31), cnt


@dataclass(frozen=True)
class _SketchTable:
    """The Sketches of many groups as arrays: per group holding a value (`present`, increasing) its count,
    sum, sumsq, min, max and zero count; `pos` / `neg` bins as (group, key, count), by group, then key."""

    present: np.ndarray
    count: np.ndarray
    total: np.ndarray
    squares: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    zero: np.ndarray
    pos: tuple[np.ndarray, np.ndarray, np.ndarray]
    neg: tuple[np.ndarray, np.ndarray, np.ndarray]

    def split(self, k: int) -> list[_SketchTable]:
        """The tables of groups `g * k + j` for each j (0..k-1), as tables of groups g."""
        group, value = np.divmod(self.present, k)
        sides = [(np.divmod(owner, k), key, cnt) for owner, key, cnt in (self.pos, self.neg)]
        out = []
        for j in range(k):
            at = value == j
            bins = []
            for (g, v), key, cnt in sides:
                hit = v == j
                bins.append((g[hit], key[hit], cnt[hit]))
            out.append(_SketchTable(group[at], self.count[at], self.total[at], self.squares[at],
                                    self.lo[at], self.hi[at], self.zero[at], bins[0], bins[1]))
        return out

    def summed(self, parent: np.ndarray) -> _SketchTable:
        """The table of groups parent[g] (`parent` non-decreasing in g): each parent's groups added up."""
        if not len(self.present):
            return self
        p = parent[self.present]
        starts = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])
        # A parent's groups' keys interleave: the bins are counted again, by (parent, key), weighted.
        bins = [_bin_counts(key, parent[owner], int(p[-1]) + 1, cnt) for owner, key, cnt in (self.pos, self.neg)]
        return _SketchTable(p[starts], np.add.reduceat(self.count, starts), np.add.reduceat(self.total, starts),
                            np.add.reduceat(self.squares, starts), np.minimum.reduceat(self.lo, starts),
                            np.maximum.reduceat(self.hi, starts), np.add.reduceat(self.zero, starts), bins[0], bins[1])

    def sketches(self) -> dict[int, Sketch]:
        """Group -> its Sketch."""
        maps = []
        for owner, key, cnt in (self.pos, self.neg):
            bounds = np.searchsorted(owner, self.present, side="right").tolist()
            keys, cnts = key.tolist(), cnt.tolist()
            maps.append([dict(zip(keys[a:b], cnts[a:b], strict=True))
                         for a, b in zip([0, *bounds[:-1]], bounds, strict=True)])
        return {gi: Sketch(p, n, z, c, s, q, a, b) for gi, p, n, z, c, s, q, a, b in zip(
            self.present.tolist(), maps[0], maps[1], self.zero.tolist(), self.count.tolist(), self.total.tolist(),
            self.squares.tolist(), self.lo.tolist(), self.hi.tolist(), strict=True)}


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
