"""Reading a reference file: Parquet, CSV or JSON Lines, in the reference's own shape (`columns:`,
`values:`) brought to the schema's and the contract's names."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from monitor.value_maps import mapped_frame


@dataclass(frozen=True)
class ReferenceFile:
    """A reference file as `read_reference` takes it (a config `Reference` has the same attributes)."""

    path: str
    columns: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)


def read_reference(reference: Any, folded: Collection[str] = ()) -> pd.DataFrame:
    """The reference file as a frame: Parquet, CSV or JSON Lines (by extension; .gz allowed for text).

    `reference`: a path, or a config `Reference` (`.path`), whose `columns:` are renamed to the fields
    they hold and whose `values:` map is applied (`folded`: fields compared in lower case)."""
    path = getattr(reference, "path", reference)
    name = str(path).lower().removesuffix(".gz")
    if name.endswith(".parquet") or name.endswith(".pq"):
        frame = pd.read_parquet(path)
    elif name.endswith(".csv"):
        frame = pd.read_csv(path)
    elif name.endswith(".jsonl") or name.endswith(".json") or name.endswith(".ndjson"):
        frame = pd.read_json(path, lines=True)
    else:
        raise ValueError(f"reference {path}: unknown format (use .parquet, .csv or .jsonl)")
    columns = {theirs: ours for ours, theirs in getattr(reference, "columns", {}).items() if theirs != ours}
    if columns:
        # A column named like a field the mapping reads from another column is not that field: left out.
        frame = frame.drop(columns=[c for c in frame.columns if c in columns.values() and c not in columns])
        frame = frame.rename(columns=columns)
    return mapped_frame(frame, getattr(reference, "values", {}), folded)
