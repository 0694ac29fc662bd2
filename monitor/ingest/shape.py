"""Logs in the user's shape: a source's columns renamed to the contract's field names, and its times and
durations brought to the contract's units (epoch seconds or RFC 3339 text; milliseconds), before the
contract is checked. A value that does not convert is left as written, so the check names it."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from monitor.config import FileSource, SqlSource
from monitor.contract import DURATIONS, TIMESTAMPS
from monitor.value_maps import mapped_frame

PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}
_TO_MS = {"ms": 1.0, "s": 1000.0, "us": 0.001}
_NUMBER = r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$"
_MAX_EPOCH = 9.2e9  # seconds: past it, nanoseconds since 1970 overflow int64


def column_of(source: FileSource | SqlSource, field: str) -> str:
    """The source's name for contract field `field`."""
    return source.columns.get(field, field)


def is_plain(source: FileSource | SqlSource) -> bool:
    """Whether the source writes the contract's own names, values and units (nothing to convert)."""
    return (not source.columns and not source.values and source.durations == "ms"
            and source.timestamps.epoch_unit == "s" and source.timestamps.format is None)


def to_contract(raw: pd.DataFrame | pa.Table, source: FileSource | SqlSource,
                folded: Collection[str] = ()) -> pd.DataFrame | pa.Table:
    """`raw` parsed rows with the source's columns under their contract names, its values as the
    contract and schema name them (`values:`; `folded`: fields compared in lower case, the schema's
    fold_case) and in the contract's units. Every reader passes here before the contract is checked.

    A column named like a contract field that the mapping takes from another column is left out."""
    if is_plain(source):
        return raw
    return _converted(mapped_frame(_renamed(raw, source), source.values, folded), source)


def _renamed(raw: pd.DataFrame | pa.Table, source: FileSource | SqlSource) -> pd.DataFrame | pa.Table:
    """`raw` with the source's columns under their contract names."""
    table = isinstance(raw, pa.Table)
    names = list(raw.column_names if table else raw.columns)
    renamed = {theirs: ours for ours, theirs in source.columns.items() if theirs != ours}
    shadowed = [n for n in names if n in source.columns and source.columns[n] != n and n not in renamed]
    if shadowed:
        raw = raw.drop_columns(shadowed) if table else raw.drop(columns=shadowed)
        names = [n for n in names if n not in shadowed]
    if renamed:
        names = [renamed.get(n, n) for n in names]
        raw = raw.rename_columns(names) if table else raw.set_axis(names, axis=1)
    return raw


def _converted(raw: pd.DataFrame | pa.Table, source: FileSource | SqlSource) -> pd.DataFrame | pa.Table:
    """`raw` (contract names) with its times and durations in the contract's units."""
    table = isinstance(raw, pa.Table)
    names = list(raw.column_names if table else raw.columns)
    stamps, unit = source.timestamps, source.durations
    for name in names:
        if name in TIMESTAMPS and (stamps.epoch_unit != "s" or stamps.format is not None):
            convert = lambda col: _times(col, stamps.epoch_unit, stamps.format, source.timezone)  # noqa: E731
        elif name in DURATIONS and unit != "ms":
            convert = lambda col: _durations(col, _TO_MS[unit])  # noqa: E731
        else:
            continue
        if table:
            raw = raw.set_column(names.index(name), name, convert(raw[name]))
        else:
            raw[name] = convert(raw[name])
    return raw


def _times(col: pd.Series | pa.ChunkedArray, epoch_unit: str, fmt: str | None,
           zone: str | None) -> pd.Series | pa.ChunkedArray:
    """Times as the contract reads them: numbers as epoch seconds, text in `fmt` as RFC 3339 text."""
    per = PER_SECOND[epoch_unit]
    if isinstance(col, pa.ChunkedArray):
        t = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            return pc.divide(pc.cast(col, pa.float64()), float(per))
        if not pa.types.is_string(t) and not pa.types.is_large_string(t):
            return col  # instants already (Parquet, or text pyarrow read as times)
        text = col.to_pandas().astype(object)
        return pa.chunked_array([pa.array(_times_text(text, per, fmt, zone, numbers_as_text=True), pa.string())])
    if pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
        return col.astype(float) / per
    if col.dtype != object and not pd.api.types.is_string_dtype(col):
        return col
    return _times_text(col.astype(object), per, fmt, zone, numbers_as_text=False)


def _times_text(values: pd.Series, per: int, fmt: str | None, zone: str | None,
                numbers_as_text: bool) -> pd.Series:
    """Mixed values (text, numbers, None): numbers and numeric text as epoch seconds (or RFC 3339 text when
    `numbers_as_text`), text that follows `fmt` as RFC 3339 text; anything else as it was."""
    out = values.to_numpy(dtype=object).copy()
    is_text = np.array([isinstance(v, str) for v in out], dtype=bool)
    is_num = np.array([isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool | np.bool_)
                       for v in out], dtype=bool)
    numeric_text = is_text & values.astype(str).str.match(_NUMBER).to_numpy(dtype=bool)
    numbers = is_num | numeric_text
    if numbers.any():
        seconds = pd.to_numeric(pd.Series(out[numbers]), errors="coerce").astype(float) / per
        if numbers_as_text:
            ok = (np.isfinite(seconds) & (seconds.abs() < _MAX_EPOCH)).to_numpy()
            stamps = pd.to_datetime((seconds[ok] * 1e9).round().astype("int64"), utc=True)
            out[np.flatnonzero(numbers)[ok]] = _rfc3339(stamps)
        else:
            out[numbers] = seconds.to_numpy()
    rest = is_text & ~numeric_text
    if fmt is not None and rest.any():
        parsed = pd.to_datetime(pd.Series(out[rest]), format=fmt, errors="coerce")
        if not isinstance(parsed.dtype, pd.DatetimeTZDtype):
            parsed = parsed.dt.tz_localize(zone or "UTC", ambiguous="NaT", nonexistent="NaT")
        ok = parsed.notna().to_numpy()
        out[np.flatnonzero(rest)[ok]] = _rfc3339(parsed[ok].dt.tz_convert("UTC"))
    return pd.Series(out, index=values.index, dtype=object)


def _rfc3339(stamps: pd.Series | pd.DatetimeIndex) -> np.ndarray:
    return pd.Series(stamps).dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ").to_numpy(dtype=object)


def _durations(col: pd.Series | pa.ChunkedArray, factor: float) -> pd.Series | pa.ChunkedArray:
    """Durations in milliseconds: numbers (and numeric text) times `factor`; anything else as it was."""
    if isinstance(col, pa.ChunkedArray):
        t = col.type
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            return pc.multiply(pc.cast(col, pa.float64()), factor)
        if not is_textual(t):
            return col
        values = col.to_numpy(zero_copy_only=False).astype(object)
        number = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=float)
        ok = ~np.isnan(number)
        values[ok] = [repr(v) for v in number[ok] * factor]
        return pa.chunked_array([pa.array(values, pa.string())])
    if pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
        return col.astype(float) * factor
    values = col.to_numpy(dtype=object).copy()
    kinds = np.array([isinstance(v, str | int | float | np.integer | np.floating) and not isinstance(v, bool | np.bool_)
                      for v in values], dtype=bool)
    number = pd.to_numeric(pd.Series(np.where(kinds, values, None)), errors="coerce").to_numpy(dtype=float)
    ok = ~np.isnan(number)
    values[ok] = number[ok] * factor
    return pd.Series(values, index=col.index, dtype=object)


def is_textual(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)
