"""Fold joined prediction rows into bucket partials: per (model_version, bucket, segment), each per-row
value computed once, counted into every grouping with bincount, and dropped."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd

from monitor.aggregate import keys
from monitor.aggregate.cardinality import Kept, texts
from monitor.aggregate.fold_service import PER_SECOND, fold_cache, fold_cache_time, fold_service
from monitor.aggregate.fold_text import fold_oov, fold_oov_rows, latency_by_length
from monitor.aggregate.partial import ALL
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
)
from monitor.aggregate.sketch import Values
from monitor.aggregate.tokens import text_rows
from monitor.aggregate.totals import Totals, add_up, count, count_codes, hist, sketch, top_values
from monitor.schema import Schema
from storage.rows import PartialRow

# Signals that describe the model's run: their mean is over the requests that reached the model (not cache
# hits, rejects or errors, which a service logs as 0 or not at all).
MODEL_SIGNALS = ("batch_size", "spec_accept_rate")
THREAD_ROWS = 65536  # rows of a fold from which a worker thread takes a share of its features


def fold(frame: pd.DataFrame, bucket: timedelta, segments: list[str], timed: bool,
         schema: Schema | None = None, profile: Any = None, deadline_ms: float | None = None,
         only_stages: bool = False, kept: Kept | None = None) -> list[PartialRow]:
    """Fold joined prediction rows into partials per (model_version, bucket, segment).

    `timed`: a timing source is configured, so `joined` / `unmatched` are counted.
    `schema`: features, signals, classes to aggregate (None: counts, statuses, latency, cache only).
    `profile`: a Profile, or a config Reference / path to profile (cached); None: no histograms or ranges.
    `deadline_ms`: the service's request deadline; a timed-out row without latency_ms counts at it in total
    latency (None: it is counted as UNTIMED_TIMEOUTS instead).
    `only_stages`: the rows are requests folded before, with only their stage timings that came later: those
    timings are counted (partials of 0 rows), the requests not again.
    `kept`: the versions, stages and segment values folded under their own name, the rest as OTHER
    (None: every value).
    """
    if frame.empty:
        return []
    kept = kept or Kept()
    frame = kept.stage_columns(frame)
    prof = resolve(profile, schema)
    seconds = int(bucket.total_seconds())
    # Group keys as integer codes (sorted like the values), so grouping is one np.unique per grouping.
    mv_codes, mv_values = _capped(*_sorted_codes(frame["model_version"]), kept)
    b_codes, b_values = _bucket_codes(frame["ts"], seconds)
    base = mv_codes * len(b_values)
    base += b_codes
    del mv_codes, b_codes
    # With a segment column, the every-row partials are its segments' added up (Totals.summed): the rows
    # are counted once per segmentation, not once more for ALL.
    groupings = [(seg, frame[seg]) for seg in segments if seg in frame] or [(ALL, None)]
    accs: list[Totals] = []
    keyed = []
    for name, column in groupings:
        if column is None:
            key, seg_values = base, np.array([ALL], dtype=object)
        else:
            seg_codes, seg_values = _segment_codes(name, column, kept)
            key = base * len(seg_values)
            key += seg_codes
            del seg_codes
        keys, codes = _dense(key, len(mv_values) * len(b_values) * len(seg_values))
        del key
        mv_of, rest = np.divmod(keys, len(b_values) * len(seg_values))
        b_of, seg_of = np.divmod(rest, len(seg_values))
        accs.append(Totals(codes, len(keys)))
        keyed.append((mv_of, b_of, seg_of, seg_values))
    del base
    everyone = accs[0]  # the every-row grouping, for what only the every-row partials hold
    if groupings[0][1] is not None:
        src = min(range(len(accs)), key=lambda i: accs[i].groups)  # the fewest groups: the least to add up
        mv_of, b_of = keyed[src][:2]
        parent = mv_of * len(b_values) + b_of  # non-decreasing: the keys are sorted (version, bucket, segment)
        dense = np.cumsum(np.r_[0, parent[1:] != parent[:-1]])  # group -> its parent's group, 0..n-1
        everyone = Totals(dense[accs[src].g], int(dense[-1]) + 1)
    # Each per-row value is computed once, counted into every grouping, and dropped.
    if only_stages:
        _fold_stages(frame, accs)
    else:
        _fold_rows(frame, schema or Schema(), prof, timed, accs, everyone, deadline_ms)
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
        for (rows, payload), m, b, seg in zip(acc.payloads(prof.fingerprint if prof is not None else ""), mv_of.tolist(), b_of.tolist(), seg_of.tolist(),
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


def _capped(codes: np.ndarray, values: Any, kept: Kept) -> tuple[np.ndarray, Any]:
    """The sorted codes of the versions as folded: those `kept` does not keep merged into OTHER."""
    if kept.versions is None:
        return codes, values
    folded = kept.version_of(texts(values))
    if all(f == v for f, v in zip(folded, values, strict=True)):
        return codes, values
    uniques, inverse = np.unique(np.array(folded, dtype=object), return_inverse=True)
    return inverse.astype("int64", copy=False)[codes], pd.Index(uniques)


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


def _bucket_codes(ts: pd.Series, seconds: int) -> tuple[np.ndarray, Any]:
    """_sorted_codes(ts.dt.floor(f"{seconds}s")); UTC timestamps floored as integers (no floored copy)."""
    dtype = ts.dtype
    if (isinstance(dtype, pd.DatetimeTZDtype) and str(dtype.tz) == "UTC" and dtype.unit in PER_SECOND
            and seconds > 0 and not ts.isna().any()):
        step = seconds * PER_SECOND[dtype.unit]
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


def _segment_codes(name: str, column: pd.Series, kept: Kept) -> tuple[np.ndarray, np.ndarray]:
    """Codes of `name=<value>` labels (missing as `<missing>`, a value `kept` does not keep as OTHER),
    labels sorted as text."""
    codes, uniques = factorize(column) or pd.factorize(column, sort=False)
    text = kept.segment_of(name, texts(uniques))
    labels = np.array([f"{name}={v}" for v in text] + [f"{name}=<missing>"], dtype=object)
    # Two values may print alike (or one may be the text `<missing>`): they share a segment.
    label_codes, label_values = pd.factorize(labels, sort=True)
    codes = np.where(codes < 0, len(labels) - 1, codes)
    return label_codes[codes].astype("int64", copy=False), np.asarray(label_values, dtype=object)


def _fold_rows(frame: pd.DataFrame, schema: Schema, profile: Profile | None, timed: bool, accs: list[Totals],
               everyone: Totals, deadline_ms: float | None = None) -> None:
    """Count and sketch each per-row value into every grouping of `accs`; what only the every-row partials
    hold into `everyone` (one of `accs` when there is no segment column)."""
    n = len(frame)
    for a in accs:
        a.counts[keys.ROWS] = np.bincount(a.g, minlength=a.groups).astype("int64", copy=False)
    status_codes, statuses = factorize(frame["status"]) or pd.factorize(frame["status"])
    count_codes(accs, [keys.status(s) for s in statuses], status_codes)
    del status_codes
    if timed:
        joined = frame["joined"].to_numpy(dtype=bool)
        count(accs, keys.JOINED, joined)
        count(accs, keys.UNMATCHED, ~joined)
        stage_rows = frame["stage_rows"].to_numpy(dtype="int64")
        if stage_rows.any():
            for a in accs:
                a.counts[keys.STAGE_ROWS] = np.bincount(a.g, weights=stage_rows, minlength=a.groups).astype("int64")
    if "cache_hit" in frame:
        hit = frame["cache_hit"]
        hits = hit.eq(True).to_numpy(dtype=bool)
        misses = hit.eq(False).to_numpy(dtype=bool)
        count(accs, keys.cache_hit(), hits)
        count(accs, keys.cache_miss(), misses)
        fold_cache(frame, hits, misses, accs)
        if timed:
            fold_cache_time(frame, hits & joined, misses & joined, accs)
    latency = Values(_total_latency(frame, accs, deadline_ms)) if keys.LATENCY in frame else None
    fold_service(frame, accs, latency, everyone)

    for name in [keys.LATENCY] + [c for c in frame.columns if c.startswith(keys.STAGE_PREFIX)]:
        if name in frame:
            sketch(accs, name, latency if name == keys.LATENCY else numbers(frame[name]))
    ran_model = None
    for name in schema.signals:
        v = numbers(frame[name]) if name in frame else np.full(n, np.nan)
        count(accs, keys.missing(name), np.isnan(v))
        if name in MODEL_SIGNALS and ran_model is None:
            ran_model = ~frame["status"].isin(("rejected", "error")).to_numpy(dtype=bool)
            if "cache_hit" in frame:
                ran_model &= ~frame["cache_hit"].eq(True).to_numpy(dtype=bool)
        sketch(accs, keys.signal(name), v, ran_model if name in MODEL_SIGNALS else None)

    fields = profile.fields if profile is not None else {}
    # On a large fold a worker takes the text features (mostly Arrow and numpy: they release the GIL),
    # then the numeric ones, while this thread hashes the categorical ones (Python objects: they hold
    # it), then takes what numeric features are left. Totals are keyed by name and written in sorted
    # order: which thread counts first does not matter.
    queue = iter(sorted(((name, kind) for name, kind in schema.features.items() if kind != "categorical"),
                        key=lambda f: f[1] != "text"))  # shared by both threads

    def drain() -> None:
        for name, kind in queue:
            _fold_feature(frame, name, kind, fields.get(name), accs, latency)

    with ThreadPoolExecutor(1, thread_name_prefix="tailwatch-fold") as worker:
        draining = worker.submit(drain) if n >= THREAD_ROWS else None
        for name, kind in schema.features.items():
            if kind == "categorical":
                _fold_feature(frame, name, kind, fields.get(name), accs, latency)
        drain()
        if draining is not None:
            draining.result()
    if profile is not None:
        ref = profile.input_tokens
        if ref is not None and ref.edges and "input_tokens" in frame:
            latency_by_length(latency, accs, "input_tokens", ref, bin_codes(ref.edges, numbers(frame["input_tokens"])))
        if profile.prediction is not None and "prediction" in frame:
            pred = profile.prediction
            if pred.kind == "categorical":
                hist(accs, keys.PREDICTION, category_codes(pred, frame["prediction"]), pred.bins)
            else:
                hist(accs, keys.PREDICTION, pred.bin_index(frame["prediction"]), pred.bins)
        for cls, ref in profile.scores.items():
            column = schema.score_column(cls)
            if column in frame:
                hist(accs, keys.score(cls), bin_codes(ref.edges, numbers(frame[column]))
                      if ref.kind == "numeric" else ref.bin_index(frame[column]), ref.bins)


def _fold_stages(frame: pd.DataFrame, accs: list[Totals]) -> None:
    """What stage timings add to their requests' partials: their count, sketches (ms) and time per cache outcome."""
    stage_rows = frame["stage_rows"].to_numpy(dtype="int64")
    for a in accs:
        a.counts[keys.STAGE_ROWS] = np.bincount(a.g, weights=stage_rows, minlength=a.groups).astype("int64")
    stages = [c for c in frame.columns if c.startswith(keys.STAGE_PREFIX)]
    for name in stages:
        sketch(accs, name, numbers(frame[name]))
    if "cache_hit" in frame:
        for outcome, rows in (("hit", frame["cache_hit"].eq(True).to_numpy(dtype=bool)),
                              ("miss", frame["cache_hit"].eq(False).to_numpy(dtype=bool))):
            for name in stages if rows.any() else ():
                us = np.rint(np.nan_to_num(numbers(frame[name]), nan=0.0, posinf=0.0, neginf=0.0) * 1000)
                add_up(accs, keys.cache_time(outcome, name), np.where(rows, us, 0.0))


def _total_latency(frame: pd.DataFrame, accs: list[Totals], deadline_ms: float | None) -> np.ndarray:
    """Each row's total latency in ms, a timed-out row that logged none at `deadline_ms`: a service that
    gives up on a request spent the deadline on it. Without a deadline those rows are counted
    (UNTIMED_TIMEOUTS), so no reader takes the latency of the rest for the latency of every request."""
    v = numbers(frame[keys.LATENCY])
    untimed = np.isnan(v) & frame["status"].eq("timeout").to_numpy(dtype=bool)
    if not untimed.any():
        return v
    if deadline_ms is None:
        count(accs, keys.UNTIMED_TIMEOUTS, untimed)
        return v
    return np.where(untimed, deadline_ms, v)  # a new array: `v` may be the frame's own


def _fold_feature(frame: pd.DataFrame, name: str, kind: str, ref: FieldProfile | None, accs: list[Totals],
                  latency: Values | None) -> None:
    """Count one feature's missing values, and its bins, out-of-range values, unseen categories and
    out-of-vocabulary tokens on the reference `ref` (of that kind; None: only missing values)."""
    n = len(frame)
    if name not in frame:
        count(accs, keys.missing(name), np.ones(n, dtype=bool))
        values = pd.Series([None] * n, index=frame.index, dtype=object)
    else:
        values = frame[name]
    if ref is None or ref.kind != kind:
        if name in frame:
            count(accs, keys.missing(name), values.isna().to_numpy(dtype=bool))
        return
    if kind == "numeric":
        v = numbers(values)
        if name in frame:
            count(accs, keys.missing(name), np.isnan(v) if is_float(values) else values.isna().to_numpy(dtype=bool))
        hist(accs, name, bin_codes(ref.edges, v), ref.bins)
        if ref.min is not None:
            count(accs, keys.below(name), v < ref.min)
            count(accs, keys.above(name), v > ref.max)
    elif kind == "text":
        # Mostly distinct texts are read row by row; otherwise each distinct text once.
        rows = text_rows(values) if name in frame else None
        factorized = factorize(values) if rows is None else None
        v, missing = lengths(values, factorized) if rows is None else (rows[0], np.isnan(rows[0]))
        if name in frame:
            count(accs, keys.missing(name), missing)
        idx = bin_codes(ref.edges, v)
        hist(accs, keys.length(name), idx, ref.bins)
        latency_by_length(latency, accs, keys.length(name), ref, idx)
        del idx
        if ref.vocabulary and rows is not None:
            fold_oov_rows(name, ref, values, rows[1], missing, accs)
        elif ref.vocabulary and factorized is not None:
            fold_oov(name, ref, factorized, accs)
        del missing, rows
    else:
        idx = category_codes(ref, values)
        if name in frame:
            count(accs, keys.missing(name), idx < 0)
        hist(accs, name, idx, ref.bins)
        unseen = idx == len(ref.categories)
        del idx
        count(accs, keys.unseen(name), unseen)
        rows = np.flatnonzero(unseen)
        del unseen
        top_values(accs, name, rows, values.iloc[rows].to_numpy(dtype=object).astype(str))
