"""The one encoding of a stored partial payload.

BINARY: `TWP3`, the header's length (uint32), a JSON header (counts, histogram and sketch sizes, unseen
values, profile, bytes per integer) padded to 8 bytes; each sketch's sum, sumsq, min and max as float64;
then every histogram count and sketch bin (positive keys, their counts, negative keys, their counts) as one
int16, int32 or int64 array. JSON, when a count does not fit 64 bits. Read: both, and BINARY_V2 (the binary
form whose header held the sketch floats).
"""

from __future__ import annotations

import itertools
import json
import struct
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from monitor.aggregate.sketch import Sketch, SketchTable

BINARY = b"TWP3"  # first bytes of a binary payload; JSON payloads start with `{`
BINARY_V2 = b"TWP2"  # the binary payload before TWP3, its sketches' sums and extremes in the header (still read)

Fields = tuple[Counter, dict[str, tuple[int, ...]], dict[str, Sketch], dict[str, Counter], str]


def encode(counts: Counter, hists: dict[str, tuple[int, ...]], sketches: dict[str, Sketch],
           unseen: dict[str, Counter], profile: str) -> bytes:
    """The payload of a partial's fields: BINARY, or JSON when a count does not fit 64 bits."""
    try:
        return _binary(counts, hists, sketches, unseen, profile)
    except OverflowError:
        return encode_json(counts, hists, sketches, unseen, profile)


def decode(data: bytes) -> Fields:
    """A payload's partial fields (counts, hists, sketches, unseen, profile), whatever form it was stored in."""
    layout = read_binary(data)
    if layout is None:
        body = json.loads(data)
        return (Counter(body["counts"]),
                {k: tuple(v) for k, v in body.get("hists", {}).items()},
                {k: _sketch_from_json(v) for k, v in body.get("sketches", {}).items()},
                {k: Counter(v) for k, v in body.get("unseen", {}).items()},
                body.get("profile", ""))
    head = layout.head
    values = layout.ints.tolist()
    i = 0
    hists = {}
    for name, bins in head["hists"]:
        hists[name] = tuple(values[i:i + bins])
        i += bins
    sketches = {}
    for j, (name, npos, nneg, zero, count, *_) in enumerate(head["sketches"]):
        total, squares, lo, hi = layout.sketch_floats(j)
        pos = dict(zip(values[i:i + npos], values[i + npos:i + 2 * npos], strict=True))
        i += 2 * npos
        neg = dict(zip(values[i:i + nneg], values[i + nneg:i + 2 * nneg], strict=True))
        i += 2 * nneg
        sketches[name] = Sketch(pos, neg, zero, count, total, squares, lo, hi)
    return (Counter(head["counts"]), hists, sketches,
            {k: Counter(v) for k, v in head.get("unseen", {}).items()}, head.get("profile", ""))


@dataclass(frozen=True)
class Layout:
    """A binary payload read no further than its header: what readers that skip most of it need.

    head: the JSON header — `counts`, `hists` ([name, bins]), `sketches` ([name, npos, nneg, zero, count],
      BINARY_V2 followed by sum, sumsq, min, max), `unseen`, `profile`, `int`.
    ints: every integer, unconverted: the histograms' counts in header order, then per sketch its
      positive keys, their counts, negative keys, their counts.
    """

    head: dict
    floats: list[float]  # sum, sumsq, min, max of each sketch (empty in BINARY_V2)
    ints: np.ndarray

    def sketch_floats(self, j: int) -> list[float]:
        """Sum, sumsq, min and max of the j-th sketch of the header."""
        return self.head["sketches"][j][5:] or self.floats[4 * j:4 * j + 4]


def read_binary(data: bytes) -> Layout | None:
    """The layout of a binary payload (BINARY, BINARY_V2); None for a JSON payload."""
    if data[:4] not in (BINARY, BINARY_V2):
        return None
    (n,) = struct.unpack_from("<I", data, 4)
    head = json.loads(data[8:8 + n])
    at = 8 + n
    floats: list[float] = []
    if data[:4] == BINARY:
        size = 4 * len(head["sketches"])
        floats = np.frombuffer(data, dtype="<f8", count=size, offset=at).tolist()
        at += 8 * size
    ints = np.frombuffer(data, dtype=f"<i{head['int']}", offset=at)
    described = sum(bins for _, bins in head["hists"]) + sum(2 * (s[1] + s[2]) for s in head["sketches"])
    if described != len(ints):
        raise ValueError(f"partial payload holds {len(ints)} values, its header describes {described}")
    return Layout(head, floats, ints)


def encode_groups(groups: int, counts: dict[str, np.ndarray], hists: dict[str, np.ndarray],
                  sketches: dict[str, SketchTable], unseen: dict[str, list[Counter]], profile: str) -> list[bytes]:
    """The BINARY payload of each of `groups` groups, written from the per-group arrays of a fold without
    building Partials: the bytes encode writes for each group's Partial.

    counts: name -> int64 per group; hists: name -> (groups, bins); unseen: name -> a Counter per group.
    Every group's integers (its histogram row, then each sketch's bin keys and counts) are gathered from the
    arrays in one take; each group's sketch floats, likewise. The JSON header is written as json.dumps(head,
    separators=(",", ":"), allow_nan=False) writes it, from pieces encoded once per name."""
    counted_names = [(_json(k), counts[k].tolist()) for k in sorted(counts)]
    hist_names = sorted(hists)
    hist_head = _json([[k, hists[k].shape[1]] for k in hist_names])
    tables = [(k, sketches[k]) for k in sorted(sketches)]
    flat, bounds, width = _group_ints(groups, [hists[k] for k in hist_names], [t for _, t in tables])
    floats, f_bounds = _group_floats(groups, [t for _, t in tables])
    entries = []  # per sketch: each group's header entry, or None
    for name, t in tables:
        npos = np.bincount(t.pos[0], minlength=groups)[t.present].tolist()
        nneg = np.bincount(t.neg[0], minlength=groups)[t.present].tolist()
        per: list[str | None] = [None] * groups
        key = _json(name)
        for gi, p, n, z, c in zip(t.present.tolist(), npos, nneg, t.zero.tolist(), t.count.tolist(), strict=True):
            per[gi] = f"[{key},{p},{n},{z},{c}]"
        entries.append(per)
    held_unseen = sorted(unseen.items())
    tail = f',"profile":{_json(profile)}' if profile else ""
    arrays = {2: flat.astype("<i2"), 4: flat.astype("<i4"), 8: flat.astype("<i8")}
    out = []
    for i, (a, b, w) in enumerate(zip(bounds[:-1], bounds[1:], width, strict=True)):
        counted = ",".join([f"{k}:{v[i]}" for k, v in counted_names if v[i]])
        sketched = ",".join([e[i] for e in entries if e[i] is not None])
        held = {k: dict(sorted(u[i].items())) for k, u in held_unseen if u[i]}
        extra = f',"unseen":{_json(held)}' if held else ""
        header = f'{{"counts":{{{counted}}},"hists":{hist_head},"sketches":[{sketched}]{extra}{tail},"int":{w}}}'
        out.append(_frame(header.encode(), floats[32 * f_bounds[i]:32 * f_bounds[i + 1]], arrays[w][a:b].tobytes()))
    return out


def _frame(header: bytes, floats: bytes, ints: bytes) -> bytes:
    header += b" " * (-len(header) % 8)  # the floats, then the integers, start 8-aligned
    return BINARY + struct.pack("<I", len(header)) + header + floats + ints


def _binary(counts: Counter, hists: dict[str, tuple[int, ...]], sketches: dict[str, Sketch],
            unseen: dict[str, Counter], profile: str) -> bytes:
    hist_items = sorted(hists.items())
    sketch_items = sorted(sketches.items())
    maps = [(sorted(sk.pos), sk.pos, sorted(sk.neg), sk.neg) for _, sk in sketch_items]
    head: dict[str, Any] = {"counts": dict(sorted(counts.items())), "hists": [[k, len(v)] for k, v in hist_items],
                            "sketches": [[k, len(m[0]), len(m[2]), sk.zero, sk.count]
                                         for (k, sk), m in zip(sketch_items, maps, strict=True)]}
    # Binary floats: the shortest repr of every sum was most of the time a fold spent writing partials.
    floats = np.array([x for _, sk in sketch_items for x in (sk.sum, sk.sumsq, sk.min, sk.max)], dtype="<f8")
    _finite(floats)
    if unseen:
        head["unseen"] = {k: dict(sorted(v.items())) for k, v in sorted(unseen.items())}
    if profile:
        head["profile"] = profile
    ints = itertools.chain(
        itertools.chain.from_iterable(v for _, v in hist_items),
        itertools.chain.from_iterable(itertools.chain(pk, map(pos.__getitem__, pk), nk, map(neg.__getitem__, nk))
                                      for pk, pos, nk, neg in maps))
    size = sum(len(v) for _, v in hist_items) + 2 * sum(len(m[0]) + len(m[2]) for m in maps)
    values = np.fromiter(ints, dtype="<i8", count=size)  # OverflowError past int64
    low, high = (int(values.min()), int(values.max())) if size else (0, 0)
    for small in ("<i2", "<i4"):  # bin keys and most counts are small: fewer bytes than JSON's digits
        if np.iinfo(small).min <= low and high <= np.iinfo(small).max:
            values = values.astype(small)
            break
    head["int"] = values.dtype.itemsize
    return _frame(_json(head).encode(), floats.tobytes(), values.tobytes())


def encode_json(counts: Counter, hists: dict[str, tuple[int, ...]], sketches: dict[str, Sketch],
                unseen: dict[str, Counter], profile: str) -> bytes:
    """The JSON payload of a partial's fields: what encode writes when a count does not fit 64 bits."""
    body: dict[str, Any] = {"counts": dict(sorted(counts.items()))}
    if hists:
        body["hists"] = {k: list(v) for k, v in sorted(hists.items())}
    if sketches:
        body["sketches"] = {k: _sketch_json(v) for k, v in sorted(sketches.items())}
    if unseen:
        body["unseen"] = {k: dict(sorted(v.items())) for k, v in sorted(unseen.items())}
    if profile:
        body["profile"] = profile
    return _json(body).encode()


def _sketch_json(s: Sketch) -> dict:
    return {"p": _flat(s.pos), "n": _flat(s.neg), "z": s.zero, "c": s.count,
            "s": s.sum, "q": s.sumsq, "lo": s.min, "hi": s.max}


def _sketch_from_json(d: dict) -> Sketch:
    return Sketch(_unflat(d["p"]), _unflat(d["n"]), d["z"], d["c"], d["s"], d["q"], d["lo"], d["hi"])


def _flat(bins: dict[int, int]) -> list[int]:
    return [x for k in sorted(bins) for x in (k, bins[k])]


def _unflat(flat: list[int]) -> dict[int, int]:
    if len(flat) % 2:
        raise ValueError("a flat bin map holds key, count pairs")
    pairs = iter(flat)
    return dict(zip(pairs, pairs, strict=False))  # length checked above


def _finite(floats: np.ndarray) -> None:
    if not np.isfinite(floats).all():  # an overflowed sum: refused, as the JSON header refused it before
        raise ValueError("Out of range float values are not JSON compliant")


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def _group_floats(groups: int, tables: list[SketchTable]) -> tuple[bytes, list[int]]:
    """Every group's sketch floats (sum, sumsq, min, max of each sketch it holds, sketches in the order
    of `tables`) one group after the other, as float64 bytes; and each group's bounds, in sketches."""
    if not tables:
        return b"", [0] * (groups + 1)
    group = np.concatenate([t.present for t in tables])
    rank = np.concatenate([np.full(len(t.present), r) for r, t in enumerate(tables)])
    values = np.concatenate([np.column_stack([t.total, t.squares, t.lo, t.hi]) for t in tables])
    _finite(values)
    values = values[np.lexsort((rank, group))]
    bounds = np.r_[0, np.cumsum(np.bincount(group, minlength=groups))].tolist()
    return values.astype("<f8").tobytes(), bounds


def _group_ints(groups: int, hists: list[np.ndarray], tables: list[SketchTable]
                ) -> tuple[np.ndarray, list[int], list[int]]:
    """Every group's integers, one group after the other (as int64); the groups' bounds in them; and
    the bytes per integer each group is written with (as _binary: the smallest that fits)."""
    pool = [np.hstack(hists).astype("int64").ravel()] if hists else []
    width = pool[0].size // groups if pool else 0
    # Segments (group, rank within the group, start in the pool, length): the histogram row, then each
    # sketch's positive keys, their counts, negative keys, their counts.
    group, rank, start, size = [np.arange(groups)], [np.zeros(groups, "int64")], \
        [np.arange(groups) * width], [np.full(groups, width)]
    at = width * groups
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
    ends = np.cumsum(np.bincount(group, weights=size, minlength=groups).astype("int64"))
    order = np.lexsort((rank, group))
    start, size = start[order], size[order]
    total = int(size.sum())
    # Each segment's pool positions: start, start + 1, ... (one arange, shifted per segment).
    shift = np.repeat(start - (np.cumsum(size) - size), size)
    flat = np.concatenate(pool)[np.arange(total) + shift] if total else np.zeros(0, "int64")
    bounds = [0, *ends.tolist()]
    filled = np.flatnonzero(np.diff(np.r_[0, ends]) > 0)
    low, high = np.zeros(groups, "int64"), np.zeros(groups, "int64")
    if total:
        firsts = np.r_[0, ends][filled]
        low[filled], high[filled] = np.minimum.reduceat(flat, firsts), np.maximum.reduceat(flat, firsts)
    w = np.where((low >= -2**15) & (high < 2**15), 2, np.where((low >= -2**31) & (high < 2**31), 4, 8))
    return flat, bounds, w.tolist()
