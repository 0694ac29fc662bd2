"""A `values:` map: the values a source (or a reference) writes, as the contract and the schema name them
(`finished` -> `ok`, `200` -> `ok`, `thumbs_up` -> `1`).

A value matches a key by its name (monitor.classes: text stripped, `1`, `1.0` and `"1"` one key, booleans
`true` / `false`; in lower case for a `fold_case` feature); a matched value becomes its target (None:
missing), any other value stays as written, so the contract checks and names it as it would without a map.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from monitor.values import category_values

ValueMap = Mapping[str, str | None]  # a value's name -> what it means (None: missing)


def map_values(values: pd.Series | pa.ChunkedArray, mapping: ValueMap,
               fold_case: bool = False) -> pd.Series | pa.ChunkedArray:
    """`values` with each one whose name is a key of `mapping` replaced by its target; unchanged (the same
    object) when no value matches. A pandas Series keeps its index; an Arrow column comes back as text."""
    if not mapping:
        return values
    names = category_values(values, fold_case)
    if isinstance(values, pa.ChunkedArray | pa.Array):
        return _map_arrow(values, names, mapping)
    hit = names.isin(list(mapping)).to_numpy(dtype=bool)
    if not hit.any():
        return values
    out = values.astype(object).to_numpy(copy=True)
    out[hit] = [mapping[name] for name in names.to_numpy(dtype=object)[hit]]
    return pd.Series(out, index=values.index, dtype=object)


def _map_arrow(values: pa.ChunkedArray | pa.Array, names, mapping: ValueMap) -> pa.ChunkedArray | pa.Array:
    if pa.types.is_dictionary(names.type):
        names = names.cast(pa.string())
    keys = pa.array(list(mapping), pa.string())
    at = pc.index_in(names, value_set=keys)
    hit = pc.is_valid(at)
    if not pc.any(hit).as_py():
        return values
    targets = pc.take(pa.array(list(mapping.values()), pa.string()), at)
    written = values.cast(pa.string()) if _castable(values.type) else pa.chunked_array(
        [pa.array(pd.Series(values.to_pandas(), dtype=object).map(str, na_action="ignore"), pa.string())])
    out = pc.if_else(hit, targets, written)
    # A dictionary column (Parquet text) stays one: fold takes its codes, no text hashed per row.
    return pc.dictionary_encode(out) if pa.types.is_dictionary(values.type) else out


def _castable(t: pa.DataType) -> bool:
    value = t.value_type if pa.types.is_dictionary(t) else t
    return (pa.types.is_string(value) or pa.types.is_large_string(value) or pa.types.is_integer(value)
            or pa.types.is_floating(value) or pa.types.is_boolean(value))


def mapped_frame(frame: pd.DataFrame | pa.Table, maps: Mapping[str, ValueMap],
                 folded: Collection[str] = ()) -> pd.DataFrame | pa.Table:
    """`frame` with the `values:` map of each of its columns applied (`folded`: columns compared in lower
    case); the frame itself when no map applies."""
    table = isinstance(frame, pa.Table)
    names = frame.column_names if table else list(frame.columns)
    for name, mapping in maps.items():
        if name not in names or not mapping:
            continue
        column = frame[name]
        mapped = map_values(column, mapping, name in folded)
        if mapped is column:
            continue
        if table:
            frame = frame.set_column(names.index(name), name, mapped)
        else:
            frame = frame.copy(deep=False)  # the parsed frame may be shared; its other columns are not copied
            frame[name] = mapped
    return frame

