"""Service health over time from the stored bucket partials, as pandas DataFrames: requests, status
rates, latency quantiles (ms) per stage and service signals, per period and group.

Times are UTC-aware; a range [since, until) selects by bucket start.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from checks.latency import LOGGED_RATES, QUANTILES
from monitor.aggregate import codec, keys
from monitor.aggregate.keys import LATENCY, STAGE_PREFIX
from monitor.aggregate.partial import ALL, Partial, merge_all
from monitor.aggregate.sketch import Sketch
from monitor.contract import STATUSES
from monitor.investigate.query import QueryError, _utc_columns
from storage.database import utc
from storage.store import Store

SIGNAL_PREFIX = keys.signal("")
# The share of requests of each status but ok, as a column (errors first); the statuses many services never
# log (LOGGED_RATES names them as the latency check does) have their columns only where the data holds one.
RATE_OF = {s: {"error": "error_rate", "rejected": "reject_rate"}.get(s, f"{s}_rate")
           for s in sorted(set(STATUSES) - {"ok"}, key=lambda s: (s != "error", STATUSES.index(s)))}
LOGGED = tuple(s for s in STATUSES if s in LOGGED_RATES)


def metrics(store: Store, service: str, *, since: datetime, until: datetime, model_version: str | None = None,
            segment: str = ALL, every: timedelta | None = None,
            group_by: Sequence[str] = ("model_version",), bucket_seconds: int | None = None) -> pd.DataFrame:
    """Per period of `every` (None: the whole range) and group, the merged bucket partials as columns:
    period_start, period_end (longer than `every` where compacted buckets span several periods), requests,
    status counts and rates (of the LOGGED statuses, where any row holds one), latency quantiles in ms
    (total and per stage), cache hit rate,
    mean and p95 of each service signal. `segment`: '' (or 'all') all traffic, a segment label, or '*'
    every segment but all traffic; `group_by` picks among model_version and segment."""
    unknown = set(group_by) - {"model_version", "segment"}
    if unknown:
        raise QueryError(f"metrics group by: unknown {sorted(unknown)}; use model_version and/or segment")
    groups = merged_partials(store, service, since=since, until=until, model_version=model_version,
                             segment=segment, every=every, group_by=group_by, bucket_seconds=bucket_seconds,
                             health_only=True)
    rows = [{**key, **partial_metrics(part)} for key, part in groups]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=["period_start", "period_end", *group_by, "requests"])
    return _utc_columns(logged_zeros(frame), ("period_start", "period_end"))


def logged_zeros(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` (rows of partial_metrics) with the LOGGED statuses' counts and rates 0 in the rows that have
    requests but none of a status another row holds (partial_metrics leaves those columns out), each
    column beside the other statuses' as partial_metrics orders them."""
    counts = [s for s in LOGGED if s in frame]
    for status in counts:
        frame[status] = frame[status].fillna(0).astype("int64")
        frame.loc[(frame["requests"] > 0) & frame[RATE_OF[status]].isna(), RATE_OF[status]] = 0.0
    rates = [RATE_OF[s] for s in counts]
    order = [c for c in frame.columns if c not in counts and c not in rates]
    # After the last count and the last rate of the statuses every row has.
    last_count, last_rated = ([s for s in names if s not in LOGGED][-1] for names in (STATUSES, RATE_OF))
    for after, moved in ((last_count, counts), (RATE_OF[last_rated], rates)):
        at = order.index(after) + 1 if after in order else len(order)
        order[at:at] = moved
    return frame[order]


def merged_partials(store: Store, service: str, *, since: datetime, until: datetime,
                    model_version: str | None = None, segment: str | None = ALL,
                    every: timedelta | None = None, group_by: Sequence[str] = ("model_version",),
                    bucket_seconds: int | None = None, health_only: bool = False
                    ) -> list[tuple[dict[str, Any], Partial]]:
    """The stored partials with bucket_start in [since, until) merged per (period of `every`, group); keys
    hold period_start (since when `every` is None), period_end and the `group_by` columns. Sorted by key.

    Buckets of several sizes (history compacted by retention) are read together: where a coarse bucket
    spans several periods of `every`, those periods are read as one (period_end says how far it reaches),
    so nothing is split or counted twice. `health_only`: only the counts and sketches (what
    partial_metrics reads), decoded without the histograms: several times faster."""
    since, until = utc(since), utc(until)
    step = every.total_seconds() if every is not None else None
    if step is not None and step <= 0:
        raise QueryError(f"every must be positive, got {every}")
    wanted = None if segment in (None, "*") else (ALL if segment == "all" else segment)
    with store.transaction() as session:
        rows = [(p.model_version, utc(p.bucket_start), int(p.bucket_seconds), p.segment, p.payload)
                for p in store.partials.load(session, service, since, until, model_version=model_version,
                                             bucket_seconds=bucket_seconds, segment=wanted,
                                             except_segment=ALL if segment == "*" else None)]
    periods = _periods(since, until, step, [(start, size) for _, start, size, _, _ in rows])
    parts: dict[tuple, Any] = defaultdict(_HealthSum if health_only else list)
    for version, start, size, seg, payload in rows:
        key = (periods[(start, size)],) + tuple(version if g == "model_version" else seg for g in group_by)
        if health_only:
            parts[key].add(payload)
        else:
            parts[key].append(Partial.from_bytes(payload))
    out = []
    for key in sorted(parts):
        (first, last) = key[0]
        named = {"period_start": first, "period_end": last, **dict(zip(group_by, key[1:], strict=True))}
        out.append((named, parts[key].partial() if health_only else merge_all(parts[key])))
    return out


def _periods(since: datetime, until: datetime, step: float | None, buckets: Sequence[tuple[datetime, int]]
             ) -> dict[tuple[datetime, int], tuple[datetime, datetime]]:
    """(bucket start, bucket seconds) -> the (start, end) of the period it is read in: the periods of `step`
    seconds on the UTC grid of `step` (the first may start before `since` and hold only the part from it;
    one period from `since` when None), joined wherever a bucket runs over a period's
    end. A period ends at the next period's start or, the last one, at `until` or its last bucket's end."""
    if not buckets:
        return {}

    def reach(start: datetime, size: int) -> datetime:
        return start + timedelta(seconds=size)

    if step is None:
        end = max(until, *(reach(*b) for b in buckets))
        return dict.fromkeys(buckets, (since, end))
    # The grid of `step` from the epoch: hours start on the hour, days at midnight UTC, whatever `since` is.
    origin = since - timedelta(seconds=since.timestamp() % step)
    spans = []
    for start, size in set(buckets):
        offset = (start - origin).total_seconds()
        first = int(offset // step)
        spans.append((first, max(first, math.ceil((offset + size) / step) - 1), start, size))
    spans.sort()
    runs: list[list] = []  # [first index, last index, latest bucket end, buckets]
    for first, last, start, size in spans:
        if not runs or first > runs[-1][1]:
            runs.append([first, last, reach(start, size), []])
        run = runs[-1]
        run[1], run[2] = max(run[1], last), max(run[2], reach(start, size))
        run[3].append((start, size))
    out = {}
    for first, last, latest, members in runs:
        period = (origin + timedelta(seconds=first * step),
                  min(origin + timedelta(seconds=(last + 1) * step), max(until, latest)))
        out.update(dict.fromkeys(members, period))
    return out


# Sketches and counts partial_metrics reads; the others (latency by length or replica, arrival times) are
# left unmerged by metrics: their bins are most of a partial.
BINCOUNT_SPAN = 1 << 16  # key ranges up to this wide are summed with bincount
HEALTH_COUNTS = (keys.ROWS, keys.STAGE_ROWS, *(keys.status(s) for s in STATUSES), keys.cache_hit(),
                 keys.cache_miss())


def _health_sketch(name: str) -> bool:
    return name == LATENCY or name.startswith((STAGE_PREFIX, SIGNAL_PREFIX))


class _HealthSum:
    """merge_all of what partial_metrics reads (HEALTH_COUNTS and the latency, stage and signal sketches),
    straight from serialized partials: histograms are skipped unread, and the sketch bins of every partial
    are gathered and added with numpy once at the end (decoding each partial whole took 0.4 ms)."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.values: list[np.ndarray] = []  # per partial: its sketch bins, as stored
        self.size = 0  # values held so far
        # name -> flat rows of (start in the concatenated values, npos, nneg, zero, count) and of
        # (sum, sumsq, min, max): one pair of lists per sketch, turned into arrays at the end
        self.ints: dict[str, list[int]] = defaultdict(list)
        self.floats: dict[str, list[float]] = defaultdict(list)
        self.wanted: dict[str, bool] = {}

    def add(self, payload: bytes) -> None:
        layout = codec.read_binary(payload)
        if layout is None:  # a JSON payload, stored before the binary form or past int64
            self._add_partial(Partial.from_bytes(payload))
            return
        head = layout.head
        values = layout.ints[sum(bins for _, bins in head["hists"]):]
        counts, own = head["counts"], self.counts
        for key in HEALTH_COUNTS:
            if key in counts:
                own[key] += counts[key]
        i, base, wanted = 0, self.size, self.wanted
        for j, row in enumerate(head["sketches"]):
            name, npos, nneg = row[0], row[1], row[2]
            keep = wanted.get(name)
            if keep is None:
                keep = wanted[name] = _health_sketch(name)
            if keep and row[4]:
                self.ints[name].extend((base + i, npos, nneg, row[3], row[4]))
                self.floats[name].extend(layout.sketch_floats(j))
            i += 2 * (npos + nneg)
        self.values.append(values)
        self.size += len(values)

    def _add_partial(self, part: Partial) -> None:
        for key in HEALTH_COUNTS:
            self.counts[key] += part.counts[key]
        for name, s in part.sketches.items():
            if _health_sketch(name) and s.count:
                bins = [_ints(m) for m in (s.pos, s.pos.values(), s.neg, s.neg.values())]
                self.ints[name].extend((self.size, len(s.pos), len(s.neg), s.zero, s.count))
                self.floats[name].extend((s.sum, s.sumsq, s.min, s.max))
                self.values.append(np.concatenate(bins))
                self.size += len(self.values[-1])

    def partial(self) -> Partial:
        """The merged Partial: HEALTH_COUNTS and the health sketches (no histograms or unseen values)."""
        values = np.concatenate(self.values) if self.values else np.zeros(0, "int64")
        sketches = {}
        for name, ints in self.ints.items():
            start, npos, nneg, zero, count = np.array(ints, dtype="int64").reshape(-1, 5).T
            total, squares, lo, hi = np.array(self.floats[name], dtype="float64").reshape(-1, 4).T
            pos = _add_bins(values, start, npos, start + npos)
            neg = _add_bins(values, start + 2 * npos, nneg, start + 2 * npos + nneg)
            # cumsum adds in order, as merge_all's running sum does: the float sums are the same to the bit.
            sketches[name] = Sketch(pos, neg, int(zero.sum()), int(count.sum()), float(np.cumsum(total)[-1]),
                                    float(np.cumsum(squares)[-1]), float(lo.min()), float(hi.max()))
        return Partial(Counter({k: v for k, v in self.counts.items() if v > 0}), {}, sketches)


def _ints(values: Iterable[int]) -> np.ndarray:
    """Integers as an int64 array, or an object array when one is past int64 (JSON payloads hold those)."""
    out = np.array(list(values))
    return out if out.size else np.zeros(0, "int64")


def _add_bins(values: np.ndarray, keys_at: np.ndarray, lengths: np.ndarray, counts_at: np.ndarray
              ) -> dict[int, int]:
    """The key-wise sum of the bin maps whose keys are values[keys_at[i]:keys_at[i] + lengths[i]] and
    counts as long from counts_at[i]; exact (Python ints past int64's reach)."""
    total = int(lengths.sum())
    if not total:
        return {}
    # Every position of every range at once: its range's start plus its rank inside the range.
    within = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    k = values[np.repeat(keys_at, lengths) + within]
    c = values[np.repeat(counts_at, lengths) + within]
    if values.dtype == object or int(c.max()) >= 2**52 // total:  # past int64, or float64's exact integers
        out: dict[int, int] = {}
        for key, n in zip(k.tolist(), c.tolist(), strict=True):
            out[key] = out.get(key, 0) + n
        return out
    k, c = k.astype("int64"), c.astype("int64")
    low, high = int(k.min()), int(k.max())
    if high - low < BINCOUNT_SPAN:  # sketch keys are a few hundred apart: a dense sum beats a sort
        sums = np.bincount(k - low, weights=c, minlength=high - low + 1)  # exact: every sum below 2**52
        hit = np.flatnonzero(np.bincount(k - low, minlength=high - low + 1))
        return dict(zip((hit + low).tolist(), sums[hit].astype("int64").tolist(), strict=True))
    order = np.argsort(k, kind="stable")
    k, c = k[order], c[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    return dict(zip(k[starts].tolist(), np.add.reduceat(c, starts).tolist(), strict=True))


def partial_metrics(part: Partial) -> dict[str, Any]:
    """What a merged partial says about service health: counts, rates (0..1), quantiles (ms), signals. The
    LOGGED statuses' count and rate only when the partial holds one."""
    c = part.counts
    n = part.rows
    out: dict[str, Any] = {"requests": n}
    shown = [s for s in STATUSES if s not in LOGGED or c[keys.status(s)]]
    for status in shown:
        out[status] = c[keys.status(status)]
    for status, name in RATE_OF.items():
        if status in shown:
            out[name] = c[keys.status(status)] / n if n else None
    lookups = c[keys.cache_hit()] + c[keys.cache_miss()]
    out["cache_hit_rate"] = c[keys.cache_hit()] / lookups if lookups else None
    for key in sorted(part.sketches):
        sketch = part.sketches[key]
        if key == LATENCY or key.startswith(STAGE_PREFIX):
            stage = "total" if key == LATENCY else key.removeprefix(STAGE_PREFIX)
            for label, q in QUANTILES.items():
                out[f"{stage}_{label}_ms"] = sketch.quantile(q)
        elif key.startswith(SIGNAL_PREFIX):
            name = key.removeprefix(SIGNAL_PREFIX)
            out[f"{name}_mean"] = sketch.mean
            out[f"{name}_p95"] = sketch.quantile(0.95)
    return out


