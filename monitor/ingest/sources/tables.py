"""Parsed blocks as Arrow tables and pandas frames: combining blocks whose inferred types differ, flagging
oversize text cells, and opening Parquet files with dictionary-encoded text."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from monitor.ingest.frame import is_text
from monitor.ingest.sources.batch import LINE, OVERSIZE, empty_frame


def to_frame(tables: list[pa.Table], max_chars: int) -> pd.DataFrame:
    """One DataFrame from parsed blocks whose inferred column types may differ, oversize rows flagged."""
    if not tables:
        return empty_frame()
    try:
        return flag_oversize(pa.concat_tables(tables, promote_options="permissive"), max_chars).to_pandas()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        # Blocks disagree on a column's type (number here, string there): object columns; validation sorts it
        # out. Made object before the concat, so that no column's type depends on which blocks held only
        # nulls; a column every block holds in one type keeps it.
        frames = [flag_oversize(t, max_chars).to_pandas() for t in tables]
        types: dict[str, set] = {}
        for f in frames:
            for c in f.columns:
                types.setdefault(c, set()).add(f[c].dtype)
        mixed = {c for c, seen in types.items() if c != LINE and (len(seen) > 1 or any(c not in f for f in frames))}
        return pd.concat([f.astype({c: object for c in f.columns if c in mixed}) for f in frames], ignore_index=True)


def combine(tables: list[pa.Table], max_chars: int) -> tuple[pa.Table | None, pd.DataFrame]:
    """Parsed blocks as one Arrow table, and apart (as pandas) the few whose column types do not merge with it.

    A line whose field has another type than in its neighbours ends up in a table of its own; it is
    kept apart so that one odd line does not turn a whole column into Python objects.
    """
    if not tables:
        return None, empty_frame()
    try:
        return flag_oversize(pa.concat_tables(tables, promote_options="permissive"), max_chars), empty_frame()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    main: list[pa.Table] = []
    odd: list[pa.Table] = []
    schema = None
    for t in sorted(tables, key=lambda t: -t.num_rows):  # the biggest blocks set the types
        try:
            merged = t.schema if schema is None else pa.unify_schemas([schema, t.schema], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            odd.append(t)
            continue
        schema = merged
        main.append(t)
    main.sort(key=lambda t: t[LINE][0].as_py())
    try:
        table = flag_oversize(pa.concat_tables(main, promote_options="permissive"), max_chars)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None, to_frame(tables, max_chars).sort_values(LINE, kind="stable", ignore_index=True)
    return table, to_frame(odd, max_chars).sort_values(LINE, kind="stable", ignore_index=True)


def open_parquet(source) -> pq.ParquetFile:
    """The file, its text columns but `request_id` read as dictionaries.

    A dictionary column decodes each distinct text once (most repeat: versions, statuses, categories) and
    reaches fold as category codes, with no text hashed per row; ids are distinct and stay plain text.
    pyarrow takes `read_dictionary` only when a file is opened: the footer read first is handed on.
    """
    metadata = pq.read_metadata(source)
    schema = metadata.schema.to_arrow_schema()
    return pq.ParquetFile(source, metadata=metadata,
                          read_dictionary=[f.name for f in schema if is_text(f.type) and f.name != "request_id"])


def flag_oversize(table: pa.Table, max_chars: int) -> pa.Table:
    """Add OVERSIZE when a text cell is longer than `max_chars` bytes (checked in Arrow: no Python loop)."""
    over = None
    for col in table.columns:
        t = col.type
        if is_text(t):
            lengths = pc.binary_length(col)
            longest = pc.max(lengths).as_py()
        elif pa.types.is_dictionary(t) and is_text(t.value_type):
            # Each distinct text measured once; the rows' lengths are taken only when one is too long.
            longest = max((pc.max(pc.binary_length(c.dictionary)).as_py() or 0 for c in col.chunks), default=0)
            if longest > max_chars:
                lengths = pa.chunked_array([pc.take(pc.binary_length(c.dictionary), c.indices) for c in col.chunks])
        else:
            continue
        if longest is None or longest <= max_chars:
            continue  # the usual case: no cell to flag, no mask to build
        # A null cell is not oversize; without fill_null a null would hide a hit in another column.
        hit = pc.fill_null(pc.greater(lengths, max_chars), False)
        over = hit if over is None else pc.or_(over, hit)
    if over is None or not pc.any(over).as_py():
        return table
    return table.append_column(OVERSIZE, over)
