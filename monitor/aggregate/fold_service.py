"""What a fold counts of the service besides latency: cache outcomes (stale hits, cold and warm, time per
outcome), time to first token, tokens, arrival and completion times, and traffic per routing value."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from monitor.aggregate import keys
from monitor.aggregate.profile import numbers
from monitor.aggregate.sketch import Values
from monitor.aggregate.totals import Totals, add_up, count, count_codes, sketch, top_values

ROUTING = ("route", "expert", "replica")
ROUTE_VALUES = 256  # values per routing field a fold keeps apart; the rarer ones count as ROUTE_OTHER
ROUTE_OTHER = "<other>"
CACHE_STATES = ("cold", "warm")
PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


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


def fold_cache(frame: pd.DataFrame, hits: np.ndarray, misses: np.ndarray, accs: list[Totals]) -> None:
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
        count(accs, keys.VERSIONED_HIT, versioned)
        count(accs, keys.STALE_HITS, stale)
        top_values(accs, keys.STALE, rows[~fresh], cached[~fresh])
    state = None
    if "cache_state" in frame:
        state = frame["cache_state"].astype(object).map(lambda x: str(x).lower() if isinstance(x, str) else None)
    elif "cold" in frame:
        state = frame["cold"].map({True: "cold", False: "warm"})
    if state is not None:
        for name in CACHE_STATES:
            on = state.eq(name).to_numpy(dtype=bool)
            count(accs, keys.cache_hit(name), hits & on)
            count(accs, keys.cache_miss(name), misses & on)


def fold_cache_time(frame: pd.DataFrame, hits: np.ndarray, misses: np.ndarray, accs: list[Totals]) -> None:
    """Per cache outcome of the timed requests, their count and summed total and stage times (CACHE_TIME).
    A stage a hit skips has no timing row: it counts as 0 ms, which is what the request spent in it."""
    outcomes = [(outcome, rows) for outcome, rows in (("hit", hits), ("miss", misses)) if rows.any()]
    for outcome, rows in outcomes:
        count(accs, keys.cache_time(outcome, keys.ROWS), rows)
    for name in [keys.LATENCY] + [c for c in frame.columns if c.startswith(keys.STAGE_PREFIX)]:
        if name in frame and outcomes:
            us = np.rint(np.nan_to_num(numbers(frame[name]), nan=0.0, posinf=0.0, neginf=0.0) * 1000)
            for outcome, rows in outcomes:
                add_up(accs, keys.cache_time(outcome, name), np.where(rows, us, 0.0))


def epoch_seconds(ts: pd.Series) -> np.ndarray:
    """Seconds since the epoch (NaN for NaT), as float64."""
    dtype = ts.dtype
    if isinstance(dtype, pd.DatetimeTZDtype) and dtype.unit in PER_SECOND and not ts.isna().any():
        return ts.array.asi8 / PER_SECOND[dtype.unit]  # one array, no timedelta copy
    return ((ts - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)).to_numpy(dtype=float, na_value=np.nan)


def fold_service(frame: pd.DataFrame, accs: list[Totals], lat: Values | None, everyone: Totals) -> None:
    """What the latency and hotspot checks add to latency (`lat`, None without it): time to first
    token, output tokens per second, token totals, arrival and completion times (throughput, queue
    trend), and traffic per routing value; latency per routing value into `everyone` only."""
    latency = lat.v if lat is not None else None
    if keys.TTFT in frame:
        sketch(accs, keys.TTFT, numbers(frame[keys.TTFT]))
    for kind in ("input", "output"):
        if f"{kind}_tokens" in frame:
            sketch(accs, keys.token_counts(kind), numbers(frame[f"{kind}_tokens"]))
    if latency is not None and "output_tokens" in frame:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # 0 ms: inf, which sketches skip
            sketch(accs, keys.TOKENS_PER_S, numbers(frame["output_tokens"]) / (latency / 1000.0))
    if frame["ts"].dtype.kind == "M":
        arrival = epoch_seconds(frame["ts"])
        sketch(accs, keys.ARRIVAL, arrival)
        if latency is not None:
            sketch(accs, keys.COMPLETION, arrival + latency / 1000.0)
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
        names = [keys.route(name, v) for v in values]
        count_codes(accs, names, codes)
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
            table = lat.table(Totals(pair, everyone.groups * k), None if every else on)
            if table is not None:
                for key, part in zip(names, table.split(k), strict=True):
                    if len(part.present):
                        everyone.sketches[key] = part
