"""Class names: one spelling per class for labels, predictions, score keys, the reference and the config.

A class name is text. A number is named by its value (`1`, `1.0`, `"1"`, `"1.0"` and `" 1e0 "` are all
`1`; a fraction keeps its shortest repr, `0.5`); a boolean in any spelling (`true`, `True`, `"TRUE"`) is
`true` / `false`; other text is stripped; missing (None, NaN, empty text) stays missing (None). When the
declared classes are exactly `0` and `1`, booleans name them (true is `1`); when they are exactly `false`
and `true`, 0 and 1 name them.
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Collection
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

_INTEGER = re.compile(r"^[+-]?\d+$")
_NUMBER = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")
_EXACT = 2.0**53  # integral floats below this are exact integers: named without `.0`


def class_name(value: Any, classes: Collection[str] = ()) -> str | None:
    """The class name of one label or prediction value; None when it is missing. `classes`: the
    declared class names (already normalized), which decide whether booleans and 0/1 are one class."""
    name = _name(value)
    if name is None or not classes:
        return name
    return _aliases(frozenset(classes)).get(name, name)


def class_names(values: Any, classes: Collection[str] = ()) -> Any:
    """`class_name` of every value, each distinct value named once. A pandas Series (or list, numpy
    array) gives an object Series on the same index, None for missing; an Arrow array gives Arrow text
    (the input itself when every value is already its own name)."""
    if isinstance(values, pa.ChunkedArray | pa.Array):
        return _arrow(values, frozenset(classes))
    if isinstance(values, pd.Series):
        return _series(values, frozenset(classes))
    s = pd.Series(values) if isinstance(values, np.ndarray) else pd.Series(list(values), dtype=object)
    return _series(s, frozenset(classes))


def _name(value: Any) -> str | None:
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, bool | np.bool_):
        return "true" if value else "false"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, np.floating) and value.dtype.itemsize < 8:
        return _number(float(str(value)))  # float32 0.1 is named 0.1, as the float64 0.1 is
    if isinstance(value, float | np.floating):
        return _number(float(value))
    if isinstance(value, decimal.Decimal):
        if value.is_nan():
            return None
        return str(int(value)) if value == value.to_integral_value() else _number(float(value))
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = str(value).strip()
    if not text:
        return None
    lower = text.lower()
    if lower in ("true", "false"):
        return lower
    if _INTEGER.match(text):
        return str(int(text))  # exact, however long
    if _NUMBER.match(text):
        return _number(float(text))
    return text


def _number(v: float) -> str | None:
    if math.isnan(v):
        return None
    if v.is_integer() and abs(v) < _EXACT:
        return str(int(v))
    return repr(v)


@lru_cache(maxsize=64)
def _aliases(classes: frozenset[str]) -> dict[str, str]:
    # Only a binary class set written one way makes the other way an alias: in `0, 1, 2` true names nothing.
    if classes == {"0", "1"}:
        return {"true": "1", "false": "0"}
    if classes == {"false", "true"}:
        return {"1": "true", "0": "false"}
    return {}


def _series(s: pd.Series, classes: frozenset[str]) -> pd.Series:
    if s.dtype == object:
        # Usually every value is already its own name: one pass to find the distinct values, none to copy.
        # (Only texts and missing values among them: 1, 1.0 and True, which hash alike, are not there.)
        distinct = pd.unique(s)
        if all(isinstance(u, str) and class_name(u, classes) == u or u is None or u != u for u in distinct):
            return s if all(isinstance(u, str) for u in distinct) else s.where(s.notna(), None)
    if s.dtype == object and pd.api.types.infer_dtype(s, skipna=True) not in ("string", "empty"):
        # Mixed Python values: a hash table holds 1, 1.0 and True as one key, so the type is part of the key.
        cache: dict[tuple[type, Any], str | None] = {}
        out = np.empty(len(s), dtype=object)
        for i, v in enumerate(s.to_numpy(dtype=object).tolist()):
            try:
                key = (v.__class__, v)
                out[i] = cache[key] if key in cache else cache.setdefault(key, class_name(v, classes))
            except TypeError:  # unhashable (a list): named as text
                out[i] = class_name(v, classes)
    else:
        codes, uniques = pd.factorize(s)
        names = np.array([class_name(u, classes) for u in uniques] + [None], dtype=object)
        out = names[codes]
    return pd.Series(out, index=s.index, dtype=object)


def _arrow(values: pa.ChunkedArray | pa.Array, classes: frozenset[str]) -> pa.ChunkedArray | pa.Array:
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    is_dict = pa.types.is_dictionary(values.type)
    value_type = values.type.value_type if is_dict else values.type
    if pa.types.is_string(value_type) or pa.types.is_large_string(value_type):
        # Usually every text is already its own name: look at the distinct texts only, copy nothing.
        distinct = [c.dictionary for c in chunks] if is_dict else [pc.unique(values)]
        if all(class_name(v, classes) == v for d in distinct for v in d.to_pylist() if v is not None):
            return values
    try:
        encoded = [c if is_dict else pc.dictionary_encode(c) for c in chunks]
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # a type Arrow cannot hash: name through pandas
        named = _series(values.to_pandas(), classes)
        return pa.chunked_array([pa.array(named, pa.string())]) if isinstance(values, pa.ChunkedArray) \
            else pa.array(named, pa.string())
    out = []
    for chunk in encoded:
        distinct = chunk.dictionary.to_pylist()
        names = [class_name(v, classes) for v in distinct]
        taken = pc.take(pa.array(names, pa.string()), chunk.indices)
        out.append(pc.dictionary_encode(taken) if is_dict else taken)
    if isinstance(values, pa.ChunkedArray):
        return pa.chunked_array(out, type=out[0].type) if out else pa.chunked_array([], pa.string())
    return out[0]
