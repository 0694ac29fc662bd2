"""Enforce the contract on parsed rows: typed accepted rows, and one Reject per row that breaks it.

Vectorized over the whole batch; only rejected rows are touched one by one (for their excerpt).
"""

from __future__ import annotations

import re
from datetime import datetime

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from monitor.classes import class_names
from monitor.config import Limits
from monitor.contract import (
    BOOL_OPTIONAL,
    DURATIONS,
    NUMERIC_OPTIONAL,
    REQUIRED,
    STATUSES,
    STRING_OPTIONAL,
    Reason,
    RecordKind,
    Reject,
)
from monitor.ingest.frame import is_text
from monitor.ingest.quarantine import quoted, row_excerpt, table_excerpt
from monitor.ingest.sources.batch import FILE, LINE, OVERSIZE, RawLines
from monitor.schema import Schema
from monitor.values import category_values

_TRUE = {"true", "1", "yes", "t", "y"}
_FALSE = {"false", "0", "no", "f", "n"}
# RFC 3339 text that pyarrow's cast parses exactly as pandas does; any other text goes through pandas.
_RFC3339 = r"^(19|20)\d\d-[01]\d-[0-3]\dT[0-2]\d:[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-][0-2]\d:[0-5]\d)$"
re.compile(_RFC3339)
# Text that ends in a UTC offset (or Z); a time without one is local to a zone only the source can name.
_OFFSET = re.compile(r"(?:[zZ]|[+-]\d\d(?::?\d\d)?)$")


def field_kinds(kind: RecordKind, schema: Schema) -> dict[str, str]:
    """Every column this record kind keeps, with its type: id, str, ts, num, bool, text, class; a feature's
    is fnum (numeric: booleans are 1/0), cat (categorical, named by monitor.values) or icat (categorical
    read in lower case: schema.fold_case)."""
    if kind == RecordKind.timings:
        return {"request_id": "id", "stage": "str", "duration_ms": "num", "start_ts": "ts"}
    if kind == RecordKind.labels:
        return {"request_id": "id", "label": "class", "label_ts": "ts"}
    kinds: dict[str, str] = {}
    if kind == RecordKind.predictions:
        kinds |= {"request_id": "id", "ts": "ts", "model_version": "str", "status": "str"}
        kinds |= dict.fromkeys(NUMERIC_OPTIONAL, "num") | dict.fromkeys(STRING_OPTIONAL, "str")
        kinds |= dict.fromkeys(BOOL_OPTIONAL, "bool") | dict.fromkeys(schema.signals, "num")
        kinds |= {"prediction": "class"} | {schema.score_column(c): "num" for c in schema.classes}
    else:
        kinds |= {"label": "class", "prediction": "class"} | {schema.score_column(c): "num" for c in schema.classes}
    kinds |= {s: "str" for s in schema.segments}
    kinds |= {name: {"numeric": "fnum", "categorical": "icat" if name in schema.fold_case else "cat",
                     "text": "text"}[k] for name, k in schema.features.items()}
    return kinds


def validate(kind: RecordKind, frame: pd.DataFrame | pa.Table, file: str, schema: Schema, limits: Limits,
             now: datetime, timezone: str | None = None,
             lines: RawLines | None = None) -> tuple[pd.DataFrame, list[Reject]]:
    """Split parsed rows into accepted (typed, contract columns only, plus LINE and FILE) and rejected rows.

    `frame` may be an Arrow table: its columns are then checked in Arrow and only accepted contract
    columns become pandas (same result as for the DataFrame, without a Python object per cell).
    `timezone`: the zone of timestamps written without an offset (None: they are `wrong_type`).
    Positions name `file`, or each row's FILE when the rows come from several files. A reject quotes its
    line from `lines` when they hold it, else the parsed row.
    """
    if isinstance(frame, pa.Table):
        return _validate_table(kind, frame, file, schema, limits, now, timezone, lines)
    n = len(frame)
    marks = _Marks(n)
    mark, reason, flagged = marks.mark, marks.reason, marks.flagged

    if OVERSIZE in frame:
        mark(frame[OVERSIZE].to_numpy(dtype=bool, na_value=False), Reason.oversize_field)
    # A null duration cannot be told from NaN once parsed: both are `bad_duration`, checked below.
    marks.missing({name: frame[name].isna().to_numpy() if name in frame else np.ones(n, bool)
                   for name in REQUIRED[kind] if name not in frame or name not in DURATIONS})

    out: dict[str, pd.Series] = {}
    for name, typ in field_kinds(kind, schema).items():
        if name not in frame:
            continue
        values, bad = (_named(frame[name], typ, schema) if typ in _NAMED
                       else _convert(frame[name], typ, timezone))
        mark(bad, Reason.wrong_type, name)
        out[name] = values

    _check_values(out, kind, limits, now, mark)

    rejected = np.flatnonzero(flagged)
    files = frame[FILE].to_numpy(dtype=object) if FILE in frame else None
    rejects = [quoted(Reject(f"{file if files is None else files[i]}:{frame[LINE].iat[i]}", reason(i), "",
                             marks.field(i)), lines, lambda i=i: row_excerpt(frame, i)) for i in rejected]
    keep = ~flagged
    accepted = pd.DataFrame({name: s[keep] for name, s in out.items()}, copy=False)
    accepted[LINE] = frame[LINE].to_numpy()[keep]
    if files is not None:
        accepted[FILE] = files[keep]
    return accepted.reset_index(drop=True), rejects


def _validate_table(kind: RecordKind, table: pa.Table, file: str, schema: Schema, limits: Limits,
                    now: datetime, timezone: str | None, lines: RawLines | None) -> tuple[pd.DataFrame, list[Reject]]:
    """`validate` for an Arrow table: the same checks in the same order, strings left in Arrow."""
    n = table.num_rows
    names = set(table.column_names)
    marks = _Marks(n)
    mark, reason, flagged = marks.mark, marks.reason, marks.flagged

    if OVERSIZE in names:
        mark(_bools(table[OVERSIZE]), Reason.oversize_field)
    marks.missing({name: _bools(table[name].is_null(nan_is_null=True)) if name in names else np.ones(n, bool)
                   for name in REQUIRED[kind] if name not in names or name not in DURATIONS})

    out: dict[str, pd.Series | pa.ChunkedArray] = {}
    for name, typ in field_kinds(kind, schema).items():
        if name not in names:
            continue
        values, bad = (_named(table[name], typ, schema) if typ in _NAMED
                       else _convert_arrow(table[name], typ, timezone))
        mark(bad, Reason.wrong_type, name)
        out[name] = values

    _check_values(out, kind, limits, now, mark)

    numbers = table[LINE].to_numpy()
    rejected = np.flatnonzero(flagged)
    files = table[FILE].to_numpy() if FILE in names else None
    rejects = [quoted(Reject(f"{file if files is None else files[i]}:{numbers[i]}", reason(i), "", marks.field(i)),
                      lines, lambda i=i: table_excerpt(table, int(i))) for i in rejected]
    keep = ~flagged
    some = len(rejected) > 0
    mask = pa.array(keep) if some else None
    columns: dict[str, pd.Series] = {}
    for name, values in out.items():
        if isinstance(values, pa.ChunkedArray):
            kept = values.filter(mask) if some else values
            if pa.types.is_dictionary(kept.type):
                # A category: fold and profile take its codes as they are, no text hashed per row.
                columns[name] = kept.to_pandas()
            else:
                # Strings stay in Arrow (no Python object per cell, no block to consolidate).
                columns[name] = pd.Series(pd.arrays.ArrowExtensionArray(_as_string(kept)), copy=False)
        else:
            columns[name] = values[keep].reset_index(drop=True) if some else values
    # copy=False: the columns are not consolidated into 2-D blocks (a copy of every numeric column that
    # nothing downstream needs; pipeline frames are never written in place).
    accepted = (pd.DataFrame(columns, copy=False) if columns
                else pd.DataFrame(index=pd.RangeIndex(int(keep.sum()))))
    accepted[LINE] = numbers[keep] if some else numbers
    if files is not None:
        accepted[FILE] = files[keep] if some else files
    return accepted, rejects


_REASONS = list(Reason)


class _Marks:
    """One reason code per row, and the field it names: the first check that flags a row names them."""

    def __init__(self, n: int):
        # Reasons as small integers (index in _REASONS): an object array per batch cost more than the checks.
        self.code = np.zeros(n, dtype=np.int8)
        self.flagged = np.zeros(n, dtype=bool)
        self.fields: list[str | None] = [None]  # index 0: the row as a whole
        self.named = np.zeros(n, dtype=np.int16)

    def mark(self, mask, code: Reason, field: str | None = None) -> None:
        mask = np.asarray(mask, dtype=bool) & ~self.flagged
        if mask.any():
            self.code[mask] = _REASONS.index(code)
            self.flagged |= mask
            if field is not None:
                self.fields.append(field)
                self.named[mask] = len(self.fields) - 1

    def missing(self, absent: dict[str, np.ndarray]) -> None:
        """`missing_field` for rows lacking required fields, naming every one a row lacks ("ts, status")."""
        if not absent:
            return
        pattern = np.zeros(len(self.flagged), dtype=np.int64)
        for bit, mask in enumerate(absent.values()):
            pattern |= np.asarray(mask, dtype=np.int64) << bit
        names = list(absent)
        for code in np.unique(pattern[pattern > 0]).tolist():
            self.mark(pattern == code, Reason.missing_field,
                      ", ".join(name for bit, name in enumerate(names) if code >> bit & 1))

    def reason(self, row: int) -> Reason:
        return _REASONS[self.code[row]]

    def field(self, row: int) -> str | None:
        return self.fields[self.named[row]]


_NAMED = ("class", "cat", "icat")


def _named(values: pd.Series | pa.ChunkedArray, typ: str, schema: Schema) -> tuple[pd.Series | pa.ChunkedArray,
                                                                                 np.ndarray]:
    """Labels or predictions as class names (monitor.classes), categorical features as category names
    (monitor.values, as the reference is profiled); a list or object is `wrong_type`."""

    def name(v):
        return class_names(v, schema.classes) if typ == "class" else category_values(v, typ == "icat")

    if isinstance(values, pa.ChunkedArray):
        t = values.type.value_type if pa.types.is_dictionary(values.type) else values.type
        if not (pa.types.is_nested(t) or pa.types.is_struct(t)):
            return name(values), np.zeros(len(values), bool)
        values = values.to_pandas()
    bad = np.zeros(len(values), bool)
    if values.dtype == object and pd.api.types.infer_dtype(values, skipna=True) not in ("string", "empty"):
        bad = np.array([isinstance(v, dict | list | tuple | np.ndarray) for v in values.to_numpy(dtype=object)],
                       dtype=bool)
        values = values.where(~bad) if bad.any() else values
    return name(values), bad


def _check_values(out: dict, kind: RecordKind, limits: Limits, now: datetime, mark) -> None:
    """The checks on converted values, shared by both paths: timestamps, status, durations, and a
    required class name that named nothing (empty text) is a missing field."""
    if kind == RecordKind.labels and "label" in out:
        label = out["label"]
        mark(_bools(label.is_null()) if isinstance(label, pa.ChunkedArray) else label.isna().to_numpy(),
             Reason.missing_field, "label")
    for name in ("ts", "label_ts", "start_ts"):
        if name in out:
            ts = out[name]
            mark((ts < pd.Timestamp(limits.min_ts)).to_numpy(), Reason.bad_timestamp, name)
            mark((ts > pd.Timestamp(now) + limits.max_future).to_numpy(), Reason.future_timestamp, name)
    if "status" in out and kind == RecordKind.predictions:
        status = out["status"]
        if isinstance(status, pa.ChunkedArray):
            mark(~_known(status, STATUSES), Reason.unknown_status, "status")
        else:
            mark(~status.isin(STATUSES).to_numpy(), Reason.unknown_status, "status")
    for name in DURATIONS:
        if name in out:
            v = out[name].to_numpy(dtype=float)
            required = name in REQUIRED[kind]
            bad = ~np.isfinite(v) if required else np.isinf(v)
            mark(bad | (v < 0), Reason.bad_duration, name)


def _known(values: pa.ChunkedArray, allowed: tuple[str, ...]) -> np.ndarray:
    """Which values are one of `allowed` (null: not); a dictionary's distinct values are looked up once."""
    if not pa.types.is_dictionary(values.type):
        return _bools(pc.is_in(values, value_set=pa.array(allowed)))
    parts = []
    for chunk in values.chunks:
        known = np.append(_bools(pc.is_in(chunk.dictionary, value_set=pa.array(allowed))), False)
        parts.append(known[pc.fill_null(chunk.indices, -1).to_numpy(zero_copy_only=False)])  # -1: null
    return np.concatenate(parts) if parts else np.zeros(0, bool)


def _as_string(values: pa.ChunkedArray) -> pa.ChunkedArray:
    """Text as Arrow `string` (one pandas dtype, `string[pyarrow]`, whichever way it was read)."""
    if values.type == pa.string():
        return values
    try:
        return pc.cast(values, pa.string())
    except pa.ArrowInvalid:  # more than 2 GiB of text in one chunk: it stays `large_string`
        return values


def _bools(values) -> np.ndarray:
    """An Arrow boolean array as numpy, null as False."""
    return pc.fill_null(values, False).to_numpy(zero_copy_only=False).astype(bool, copy=False)


def _convert_arrow(col: pa.ChunkedArray, typ: str,
                   timezone: str | None = None) -> tuple[pd.Series | pa.ChunkedArray, np.ndarray]:
    """`_convert` for an Arrow column: the common types convert in Arrow; any other goes through pandas."""
    t = col.type
    n = len(col)
    none = np.zeros(n, bool)
    if pa.types.is_dictionary(t):
        if typ in ("str", "text") and is_text(t.value_type):
            return col, none  # read as a dictionary (Parquet): each distinct text is one object, not one per row
        col = pc.cast(col, t.value_type)  # ids, times, numbers: their values, checked as any other column's
        t = col.type
    if typ in ("id", "str", "text") and is_text(t):
        return col, none
    if typ in ("num", "fnum") and (pa.types.is_integer(t) or pa.types.is_floating(t)):
        return pd.Series(pc.cast(col, pa.float64()).to_numpy()), none
    if typ == "bool" and pa.types.is_boolean(t):
        return col.to_pandas(), none
    if typ == "ts" and is_text(t):
        return _rfc3339_to_utc(col, timezone)
    if typ == "ts" and pa.types.is_timestamp(t) and (t.tz is not None or timezone is None):
        return _timestamps_to_ns(col)
    return _convert(col.to_pandas(), typ, timezone)


_NS_PER = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
_NS_MAX = 2**63 - 1  # pd.Timestamp.max in ns; pd.Timestamp.min is its negative


def _timestamps_to_ns(col: pa.ChunkedArray) -> tuple[pd.Series, np.ndarray]:
    """`_to_utc` of an Arrow timestamp column (any unit; an instant whatever its zone, naive read as UTC)
    in integers: no pandas copy per step. Instants nanoseconds cannot hold are NaT and flagged, as `_as_ns`."""
    per = _NS_PER[col.type.unit]
    present = _bools(col.is_valid())
    raw = pc.fill_null(pc.cast(col, pa.int64()), 0).to_numpy()
    fits = present & (raw >= -(_NS_MAX // per)) & (raw <= _NS_MAX // per)
    ns = np.where(fits, raw, 0) * per
    ns[~fits] = np.iinfo(np.int64).min  # NaT
    return pd.Series(ns.view("M8[ns]"), copy=False).dt.tz_localize("UTC"), present & ~fits


def _rfc3339_to_utc(col: pa.ChunkedArray, timezone: str | None = None) -> tuple[pd.Series, np.ndarray]:
    """RFC 3339 text parsed by pyarrow; text of any other form (few rows, usually) by `_to_utc`."""
    present = _bools(col.is_valid())
    rfc = _bools(pc.match_substring_regex(col, _RFC3339))
    n = len(col)
    values = np.full(n, np.datetime64("NaT"), dtype="datetime64[ns]")  # UTC
    if rfc.any():
        try:
            parsed = pc.cast(col if rfc.all() else col.filter(pa.array(rfc)), pa.timestamp("ns", "UTC"))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            rfc[:] = False  # e.g. a month 13: leave every value to pandas
        else:
            if rfc.all():
                return pd.Series(parsed.to_pandas(), dtype="datetime64[ns, UTC]"), np.zeros(n, bool)
            values[rfc] = pc.cast(parsed, pa.timestamp("ns")).to_numpy()
    rest = present & ~rfc
    if rest.any():
        rows = np.flatnonzero(rest)
        text = col.take(pa.array(rows)).to_pandas()
        converted, _ = _to_utc(text, np.ones(len(rows), bool), timezone)
        values[rows] = converted.dt.tz_localize(None).to_numpy()
    result = pd.Series(values).dt.tz_localize("UTC")
    return result, present & np.isnat(values)


def _convert(s: pd.Series, typ: str, timezone: str | None = None) -> tuple[pd.Series, np.ndarray]:
    """The column in its contract type, and a mask of values present but not convertible."""
    present = s.notna().to_numpy()
    if typ == "ts":
        return _to_utc(s, present, timezone)
    if typ == "fnum":
        if pd.api.types.is_bool_dtype(s):  # a boolean numeric feature is 1/0
            return s.astype(float), np.zeros(len(s), bool)
        raw = s.to_numpy(dtype=object)
        if s.dtype == object or pd.api.types.is_string_dtype(s):
            # CSV writes a boolean as text: `true` / `false` count as 1 / 0 for a numeric feature.
            text = s.astype(str).str.strip().str.lower()
            words = text.isin(("true", "false")).to_numpy() & present
            if words.any():
                raw = raw.copy()
                raw[words] = (text[words] == "true").to_numpy()
                s = pd.Series(raw, index=s.index, dtype=object)
        flags = np.array([isinstance(v, bool | np.bool_) for v in raw], dtype=bool) if s.dtype == object else None
        if flags is not None and flags.any():
            rest, bad = _convert(s.where(~flags), "num")
            rest = rest.astype(object)
            rest[flags] = raw[flags].astype(bool).astype(float)
            return rest.astype(float), bad & ~flags
        typ = "num"
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
        # Absent values (None, NaN) are `present`'s business; element-wise `v != v` breaks on array values.
        ok = np.array([_is_scalar_text(v) for v in s.to_numpy(dtype=object)], dtype=bool)
        bad = present & ~ok
        values = s.where(~bad).map(_as_text, na_action="ignore")
        return values.astype(object), bad
    if pd.api.types.is_integer_dtype(s):
        return s.map(_as_text, na_action="ignore").astype(object), np.zeros(len(s), bool)
    if typ != "id" and pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s):
        # Whole numbers read as floats are text too ("3.0" -> "3"); fractions, NaN and inf are not.
        raw = s.to_numpy(dtype=float, na_value=np.nan)
        whole = np.isfinite(raw) & (np.floor(raw) == raw)
        bad = present & ~whole
        return s.where(whole).map(_as_text, na_action="ignore").astype(object), bad
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


def _to_utc(s: pd.Series, present: np.ndarray, timezone: str | None = None) -> tuple[pd.Series, np.ndarray]:
    """RFC 3339 text or epoch seconds -> datetime64[ns, UTC]; unconvertible values are flagged, and so is
    text without an offset unless `timezone` names the zone it was written in."""
    if isinstance(s.dtype, pd.DatetimeTZDtype):
        return _as_ns(s.dt.tz_convert("UTC"), present)
    if pd.api.types.is_datetime64_dtype(s):
        local = s.dt.tz_localize(timezone, ambiguous="NaT", nonexistent="NaT") if timezone else s.dt.tz_localize("UTC")
        return _as_ns(local.dt.tz_convert("UTC"), present)
    if pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s):
        values = _from_epoch(s.astype(float))
        return values, present & values.isna().to_numpy()
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
            offset = rest.str.strip().str.contains(_OFFSET).to_numpy(dtype=bool)
            if offset.any():
                result[rest.index[offset]] = pd.to_datetime(rest[offset], utc=True, errors="coerce", format="ISO8601")
            if timezone is not None and not offset.all():
                naive = pd.to_datetime(rest[~offset], errors="coerce", format="ISO8601")
                if isinstance(naive.dtype, pd.DatetimeTZDtype):  # parsed an offset the pattern missed
                    naive = naive.dt.tz_convert("UTC")
                else:
                    naive = naive.dt.tz_localize(timezone, ambiguous="NaT", nonexistent="NaT").dt.tz_convert("UTC")
                result[rest.index[~offset]] = naive
            # Without a zone a time without an offset stays NaT: flagged `wrong_type` below.
    if is_num.any():
        result[is_num] = _from_epoch(s[is_num].astype(float))
    if is_dt.any():
        result[is_dt] = pd.to_datetime(s[is_dt], utc=True, errors="coerce")  # out of ns range: NaT, flagged
    return result, present & result.isna().to_numpy()


def _as_ns(s: pd.Series, present: np.ndarray) -> tuple[pd.Series, np.ndarray]:
    """Aware UTC datetimes of any unit as nanoseconds, the one unit every frame is joined and folded in;
    instants nanoseconds cannot hold (a year 9999 read as seconds) are flagged."""
    fits = (s >= pd.Timestamp.min.tz_localize("UTC")) & (s <= pd.Timestamp.max.tz_localize("UTC"))
    fits = fits.to_numpy(dtype=bool, na_value=False)
    return s.where(fits).astype("datetime64[ns, UTC]"), present & ~fits


_MAX_EPOCH = 9.2e9  # year ~2261: past it, nanoseconds since 1970 overflow int64


def _from_epoch(seconds: pd.Series) -> pd.Series:
    """Epoch seconds as UTC instants, to the microsecond: a float near 1.8e9 holds about 0.24 us, so finer
    digits are float noise (1796256000.096 is 1796256000.0959999561), not a time anyone wrote."""
    v = seconds.to_numpy(dtype=float)
    ok = np.isfinite(v) & (np.abs(v) < _MAX_EPOCH)
    whole = np.floor(np.where(ok, v, 0))
    ns = whole.astype("int64") * 10**9 + np.round((np.where(ok, v, 0) - whole) * 1e6).astype("int64") * 1000
    out = pd.Series(pd.to_datetime(ns, utc=True), index=seconds.index)
    out[~ok] = pd.NaT
    return out
