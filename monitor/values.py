"""Categorical feature values: one spelling per value, whatever the source wrote.

The reference, every log format and SQL read a category through `category_values`, so a value profiled
from a Parquet `True` and served as a JSON `true` is the same bin. A category is named as a class is
(monitor.classes): booleans as `true` / `false`, numbers by value (`1`, `1.0`, `"1"` are `1`), text
stripped, empty text missing; in lower case for a feature the schema lists under `fold_case`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from monitor.classes import class_names


def category_values(values: Any, fold_case: bool = False) -> Any:
    """Each value's category name. A pandas Series gives an object Series on its index (None for
    missing); an Arrow array gives Arrow text (dictionary-encoded when it was)."""
    named = class_names(values)
    if not fold_case:
        return named
    if isinstance(named, pa.ChunkedArray | pa.Array):
        return _lower_arrow(named)
    codes, uniques = pd.factorize(named)
    lowered = np.array([u.lower() for u in uniques.tolist()] + [None], dtype=object)
    return pd.Series(lowered[codes], index=named.index, dtype=object)


def _lower_arrow(values: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Arrow text in lower case as Python writes it (str.lower), each distinct text lowered once."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    is_dict = pa.types.is_dictionary(values.type)
    out = []
    for chunk in chunks:
        encoded = chunk if is_dict else pc.dictionary_encode(chunk)
        lowered = pa.array([None if v is None else v.lower() for v in encoded.dictionary.to_pylist()], pa.string())
        taken = pc.take(lowered, encoded.indices)
        out.append(pc.dictionary_encode(taken) if is_dict else taken)
    if isinstance(values, pa.ChunkedArray):
        return pa.chunked_array(out, type=out[0].type) if out else pa.chunked_array([], pa.string())
    return out[0]


def spelling_key(name: str) -> str:
    """A category name with its case and whitespace set aside: two names with one key differ only in
    spelling."""
    return "".join(name.casefold().split())


def respelled(reference: Iterable[str], seen: Iterable[str]) -> list[tuple[str, str]]:
    """(reference name, seen name) for each seen category name that is not a reference name but differs
    from one only in spelling (case, whitespace); in the order seen, each pair once."""
    known = set(reference)
    keys: dict[str, str] = {}
    for name in reference:
        keys.setdefault(spelling_key(name), name)
    out: list[tuple[str, str]] = []
    for name in seen:
        match = keys.get(spelling_key(name)) if name not in known else None
        if match is not None and (match, name) not in out:
            out.append((match, name))
    return out
