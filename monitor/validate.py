"""Enforce the contract on parsed rows: typed accepted rows, and one Reject per row that breaks it.

Vectorized over the whole batch; only rejected rows are touched one by one (for their excerpt).
"""

from __future__ import annotations

import json
from datetime import datetime

import numpy as np
import pandas as pd

from monitor.config import Limits, Schema
from monitor.contract import (
    BOOL_OPTIONAL,
    NUMERIC_OPTIONAL,
    REQUIRED,
    STATUSES,
    STRING_OPTIONAL,
    Reason,
    RecordKind,
    Reject,
    excerpt,
)
from monitor.sources import LINE, OVERSIZE

# Fields whose values are durations: NaN, infinite or negative is `bad_duration`, not a missing value.
DURATIONS = ("duration_ms", "latency_ms", "ttft_ms")
_TRUE = {"true", "1", "yes", "t", "y"}
_FALSE = {"false", "0", "no", "f", "n"}


def field_kinds(kind: RecordKind, schema: Schema) -> dict[str, str]:
    """Every column this record kind keeps, with its type: id, str, ts, num, bool, text."""
    if kind == RecordKind.timings:
        return {"request_id": "id", "stage": "str", "duration_ms": "num", "start_ts": "ts"}
    if kind == RecordKind.labels:
        return {"request_id": "id", "label": "str", "label_ts": "ts"}
    kinds: dict[str, str] = {}
    if kind == RecordKind.predictions:
        kinds |= {"request_id": "id", "ts": "ts", "model_version": "str", "status": "str"}
        kinds |= dict.fromkeys(NUMERIC_OPTIONAL, "num") | dict.fromkeys(STRING_OPTIONAL, "str")
        kinds |= dict.fromkeys(BOOL_OPTIONAL, "bool") | dict.fromkeys(schema.signals, "num")
        kinds |= {schema.score_column(c): "num" for c in schema.classes}
    else:
        kinds |= {"label": "str", "prediction": "str"} | {schema.score_column(c): "num" for c in schema.classes}
    kinds |= {s: "str" for s in schema.segments}
    kinds |= {name: {"numeric": "num", "categorical": "str", "text": "text"}[k] for name, k in schema.features.items()}
    return kinds


def validate(kind: RecordKind, frame: pd.DataFrame, file: str, schema: Schema, limits: Limits,
             now: datetime) -> tuple[pd.DataFrame, list[Reject]]:
    """Split parsed rows into accepted (typed, contract columns only, plus LINE) and rejected rows."""
    n = len(frame)
    reason = np.full(n, "", dtype=object)

    def mark(mask, code: Reason) -> None:
        mask = np.asarray(mask, dtype=bool) & (reason == "")
        reason[mask] = code.value

    if OVERSIZE in frame:
        mark(frame[OVERSIZE].to_numpy(dtype=bool, na_value=False), Reason.oversize_field)
    for name in REQUIRED[kind]:
        # A null duration cannot be told from NaN once parsed: both are `bad_duration`, checked below.
        if name not in frame or name not in DURATIONS:
            mark(frame[name].isna().to_numpy() if name in frame else np.ones(n, bool), Reason.missing_field)

    out: dict[str, pd.Series] = {}
    for name, typ in field_kinds(kind, schema).items():
        if name not in frame:
            continue
        values, bad = _convert(frame[name], typ)
        mark(bad, Reason.wrong_type)
        out[name] = values

    for name in ("ts", "label_ts", "start_ts"):
        if name in out:
            ts = out[name]
            mark((ts < pd.Timestamp(limits.min_ts)).to_numpy(), Reason.bad_timestamp)
            mark((ts > pd.Timestamp(now) + limits.max_future).to_numpy(), Reason.future_timestamp)
    if "status" in out and kind == RecordKind.predictions:
        mark(~out["status"].isin(STATUSES).to_numpy(), Reason.unknown_status)
    for name in DURATIONS:
        if name in out:
            v = out[name].to_numpy(dtype=float)
            required = name in REQUIRED[kind]
            bad = ~np.isfinite(v) if required else np.isinf(v)
            mark(bad | (v < 0), Reason.bad_duration)

    rejected = np.flatnonzero(reason != "")
    rejects = [Reject(f"{file}:{frame[LINE].iat[i]}", Reason(reason[i]), _row_excerpt(frame, i)) for i in rejected]
    keep = reason == ""
    accepted = pd.DataFrame({name: s[keep] for name, s in out.items()})
    accepted[LINE] = frame[LINE].to_numpy()[keep]
    return accepted.reset_index(drop=True), rejects


def _convert(s: pd.Series, typ: str) -> tuple[pd.Series, np.ndarray]:
    """The column in its contract type, and a mask of values present but not convertible."""
    present = s.notna().to_numpy()
    if typ == "ts":
        return _to_utc(s, present)
    if typ == "num":
        if pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s):
            return s.astype(float), np.zeros(len(s), bool)
        odd = np.array([_is_container_or_bool(v) for v in s.to_numpy(dtype=object)], dtype=bool)
        values = pd.to_numeric(s.where(~odd), errors="coerce")
        textual_nan = s.astype(str).str.lower().isin(("nan", "")).to_numpy()
        return values.astype(float), present & values.isna().to_numpy() & ~textual_nan
    if typ == "bool":
        if pd.api.types.is_bool_dtype(s):
            return s, np.zeros(len(s), bool)
        text = s.astype(str).str.strip().str.lower()
        values = pd.Series(np.where(text.isin(_TRUE), True, np.where(text.isin(_FALSE), False, None)),
                           index=s.index, dtype=object)
        values[~present] = None
        return values, present & values.isna().to_numpy()
    # id / str / text: strings; integers are accepted and written as text.
    if s.dtype == object or pd.api.types.is_string_dtype(s):
        inferred = pd.api.types.infer_dtype(s, skipna=True)
        if inferred in ("string", "empty"):  # the common case, checked in C: nothing to convert
            return s.astype(object), np.zeros(len(s), bool)
        ok = np.array([v is None or v != v or _is_scalar_text(v) for v in s.to_numpy(dtype=object)], dtype=bool)
        bad = present & ~ok
        values = s.where(~bad).map(_as_text, na_action="ignore")
        return values.astype(object), bad
    if pd.api.types.is_integer_dtype(s) or (typ != "id" and pd.api.types.is_numeric_dtype(s)):
        return s.map(_as_text, na_action="ignore").astype(object), np.zeros(len(s), bool)
    return pd.Series([None] * len(s), index=s.index, dtype=object), present


def _is_container_or_bool(value) -> bool:
    return isinstance(value, dict | list | tuple | bool | np.ndarray)


def _is_scalar_text(value) -> bool:
    if isinstance(value, str):
        return True
    if isinstance(value, bool | np.bool_):
        return False
    if isinstance(value, int | np.integer):
        return True
    return isinstance(value, float | np.floating) and float(value).is_integer()


def _as_text(value) -> str:
    if isinstance(value, float | np.floating):
        return str(int(value))
    return str(value)


def _to_utc(s: pd.Series, present: np.ndarray) -> tuple[pd.Series, np.ndarray]:
    """RFC 3339 text or epoch seconds -> datetime64[ns, UTC]; unconvertible values are flagged."""
    if isinstance(s.dtype, pd.DatetimeTZDtype):
        return s.dt.tz_convert("UTC"), np.zeros(len(s), bool)
    if pd.api.types.is_datetime64_dtype(s):
        return s.dt.tz_localize("UTC"), np.zeros(len(s), bool)
    if pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s):
        return _from_epoch(s.astype(float)), present & ~np.isfinite(s.to_numpy(dtype=float))
    # Mixed: text, numbers, maybe datetimes from blocks that inferred them.
    raw = s.to_numpy(dtype=object)
    is_text = np.array([isinstance(v, str) for v in raw], dtype=bool)
    is_dt = np.array([isinstance(v, datetime) for v in raw], dtype=bool)
    is_num = np.array([isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool)
                       for v in raw], dtype=bool) & present
    result = pd.Series(pd.NaT, index=s.index, dtype="datetime64[ns, UTC]")
    if is_text.any():
        text = s[is_text]
        # Epoch seconds written as text (CSV) are numbers too.
        as_num = pd.to_numeric(text, errors="coerce")
        numeric_text = as_num.notna().to_numpy()
        result[text.index[numeric_text]] = _from_epoch(as_num[numeric_text])
        rest = text[~numeric_text]
        if len(rest):
            result[rest.index] = pd.to_datetime(rest, utc=True, errors="coerce", format="ISO8601")
    if is_num.any():
        result[is_num] = _from_epoch(s[is_num].astype(float))
    if is_dt.any():
        result[is_dt] = pd.to_datetime(s[is_dt], utc=True)
    return result, present & result.isna().to_numpy()


_MAX_EPOCH = 1e11  # year ~5138: beyond it pandas cannot hold the value in nanoseconds


def _from_epoch(seconds: pd.Series) -> pd.Series:
    v = seconds.to_numpy(dtype=float)
    ok = np.isfinite(v) & (np.abs(v) < _MAX_EPOCH)
    ns = np.where(ok, v * 1e9, 0).astype("int64")
    out = pd.Series(pd.to_datetime(ns, utc=True), index=seconds.index)
    out[~ok] = pd.NaT
    return out


def _row_excerpt(frame: pd.DataFrame, i: int) -> str:
    row = {k: v for k, v in frame.iloc[i].items() if k not in (LINE, OVERSIZE) and not _isna(v)}
    try:
        return excerpt(json.dumps(row, default=str, ensure_ascii=False))
    except (TypeError, ValueError):
        return excerpt(repr(row))


def _isna(value) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False
