"""Reference profile: what the training/validation data looked like, field by field.

The profile fixes the bins that every bucket partial counts into (quantile edges for numbers and text
lengths, the category list for categories), so a window's histogram and the reference's histogram are
always on the same bins. It is a frozen value, stored as JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from monitor.config import Schema

N_BINS = 10  # quantile bins per numeric field and text length
MAX_CATEGORIES = 200  # categories kept per field; the rest of the reference is `truncated` into the other bin
FORMAT = 1  # bump when the JSON layout changes

Kind = Literal["numeric", "categorical", "text"]


@dataclass(frozen=True)
class FieldProfile:
    """One reference column: missing count and the histogram on its own bins.

    numeric / text: `edges` are the inner bin edges (bins are open-ended: -inf..e0, e0..e1, ..., ek..+inf;
    a value equal to an edge falls in the upper bin); text bins count lengths in characters.
    categorical: `categories` (most frequent first) then one last bin for every other value.
    """

    kind: Kind
    n: int  # reference rows
    missing: int  # of which null / NaN (numeric inf counts as present)
    counts: tuple[int, ...]  # reference histogram; len(edges) + 1 or len(categories) + 1 bins
    edges: tuple[float, ...] = ()
    categories: tuple[str, ...] = ()
    min: float | None = None  # finite min / max of the values (numeric) or lengths (text)
    max: float | None = None
    truncated: bool = False  # categorical: the reference had more than MAX_CATEGORIES values

    @property
    def missing_rate(self) -> float | None:
        """Share of reference rows with no value; None for an empty reference."""
        return self.missing / self.n if self.n else None

    @property
    def present(self) -> int:
        return self.n - self.missing

    @property
    def bins(self) -> int:
        return len(self.counts)

    def bin_index(self, values: pd.Series) -> np.ndarray:
        """Bin of each value (int64); -1 for missing. Text: pass the strings, lengths are taken here."""
        if self.kind == "categorical":
            if values.dtype != object:
                values = as_category(values)
            codes = pd.Categorical(values, categories=list(self.categories)).codes.astype("int64")
            codes[(codes < 0) & values.notna().to_numpy()] = len(self.categories)
            return codes
        v = _lengths(values) if self.kind == "text" else _numbers(values)
        idx = np.searchsorted(np.asarray(self.edges, dtype=float), v, side="right").astype("int64")
        idx[np.isnan(v)] = -1
        return idx


@dataclass(frozen=True)
class Profile:
    """The reference, per feature and for the model's outputs (prediction classes, class scores)."""

    rows: int
    fields: dict[str, FieldProfile] = field(default_factory=dict)
    prediction: FieldProfile | None = None  # categorical over predicted classes
    label: FieldProfile | None = None  # categorical class balance of the reference labels
    scores: dict[str, FieldProfile] = field(default_factory=dict)  # class -> numeric score distribution

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Profile:
        raw = json.loads(text)
        if raw.pop("format", None) != FORMAT:
            raise ValueError("reference profile written by another tailwatch version; rebuild it")

        def fp(d: dict | None) -> FieldProfile | None:
            if d is None:
                return None
            return FieldProfile(**{**d, "counts": tuple(d["counts"]), "edges": tuple(d["edges"]),
                                   "categories": tuple(d["categories"])})

        return cls(rows=raw["rows"], fields={k: fp(v) for k, v in raw["fields"].items()},
                   prediction=fp(raw["prediction"]), label=fp(raw["label"]),
                   scores={k: fp(v) for k, v in raw["scores"].items()})

    @property
    def fingerprint(self) -> str:
        """16 hex digits naming these bins; partials from different profiles do not merge histograms."""
        return hashlib.blake2b(self.to_json().encode(), digest_size=8).hexdigest()


def build_profile(frame: pd.DataFrame, schema: Schema) -> Profile:
    """Profile the reference rows in `frame` for the features, prediction, label and scores of `schema`.

    A declared feature absent from the frame is profiled as all-missing.
    """
    n = len(frame)

    def col(name: str) -> pd.Series:
        return frame[name] if name in frame else pd.Series([None] * n, dtype=object)

    fields = {name: _profile(col(name), kind) for name, kind in schema.features.items()}
    prediction = _profile(col("prediction"), "categorical") if "prediction" in frame else None
    label = _profile(col("label"), "categorical") if "label" in frame else None
    scores = {c: _profile(col(schema.score_column(c)), "numeric")
              for c in schema.classes if schema.score_column(c) in frame}
    return Profile(rows=n, fields=fields, prediction=prediction, label=label, scores=scores)


def read_reference(path: str | os.PathLike) -> pd.DataFrame:
    """The reference file as a frame: Parquet, CSV or JSON Lines (by extension; .gz allowed for text)."""
    name = str(path).lower().removesuffix(".gz")
    if name.endswith(".parquet") or name.endswith(".pq"):
        return pd.read_parquet(path)
    if name.endswith(".csv"):
        return pd.read_csv(path)
    if name.endswith(".jsonl") or name.endswith(".json") or name.endswith(".ndjson"):
        return pd.read_json(path, lines=True)
    raise ValueError(f"reference {path}: unknown format (use .parquet, .csv or .jsonl)")


def profile_for(path: str | os.PathLike, schema: Schema) -> Profile:
    """The profile of the reference file at `path`, rebuilt only when the file or schema changes."""
    st = Path(path).stat()
    return _cached(str(path), st.st_mtime_ns, st.st_size, schema.model_dump_json())


@lru_cache(maxsize=8)
def _cached(path: str, _mtime: int, _size: int, schema_json: str) -> Profile:
    return build_profile(read_reference(path), Schema.model_validate_json(schema_json))


def resolve(profile: Any, schema: Schema | None) -> Profile | None:
    """A Profile from a Profile, a config `Reference` (has `.path`), a path, or None."""
    if profile is None or isinstance(profile, Profile):
        return profile
    if schema is None:
        raise ValueError("a reference path needs the schema to be profiled")
    return profile_for(getattr(profile, "path", profile), schema)


def _profile(values: pd.Series, kind: Kind) -> FieldProfile:
    n, missing = len(values), int(values.isna().sum())
    if kind == "categorical":
        text = as_category(values).dropna()
        freq = text.value_counts(sort=False)
        # Most frequent first, ties by value, so the profile is the same for the same data.
        freq = freq.iloc[np.lexsort((freq.index.to_numpy(dtype=str), -freq.to_numpy()))]
        kept = freq.iloc[:MAX_CATEGORIES]
        other = int(freq.iloc[MAX_CATEGORIES:].sum())
        return FieldProfile("categorical", n, missing, tuple(int(c) for c in kept) + (other,),
                            categories=tuple(str(c) for c in kept.index), truncated=len(freq) > MAX_CATEGORIES)
    v = _lengths(values) if kind == "text" else _numbers(values)
    finite = v[np.isfinite(v)]
    edges = tuple(float(e) for e in np.unique(np.quantile(finite, np.linspace(0, 1, N_BINS + 1)[1:-1]))) \
        if len(finite) else ()
    probe = FieldProfile(kind, n, missing, (), edges=edges)
    idx = probe.bin_index(values)
    counts = tuple(int(c) for c in np.bincount(idx[idx >= 0], minlength=len(edges) + 1))
    lo, hi = (float(finite.min()), float(finite.max())) if len(finite) else (None, None)
    return FieldProfile(kind, n, missing, counts, edges=edges, min=lo, max=hi)


def as_category(values: pd.Series) -> pd.Series:
    """Category values as text the way the contract writes them (integral numbers without `.0`)."""
    if pd.api.types.is_bool_dtype(values) or values.dtype == object or pd.api.types.is_string_dtype(values):
        return values.astype(object).where(values.notna(), None).map(str, na_action="ignore")
    if pd.api.types.is_float_dtype(values):
        v = values.to_numpy(dtype=float)
        integral = np.isfinite(v) & (v == np.round(v))
        whole = np.where(integral, v, 0).astype("int64").astype(str)
        text = pd.Series(np.where(integral, whole, v.astype(str)), index=values.index, dtype=object)
        return text.where(values.notna(), None)
    return values.map(str, na_action="ignore").astype(object)


def _numbers(values: pd.Series) -> np.ndarray:
    return pd.to_numeric(values, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _lengths(values: pd.Series) -> np.ndarray:
    return values.astype(object).where(values.notna(), None).str.len().to_numpy(dtype=float, na_value=np.nan)


def store_profile(store, service) -> Profile:
    """Build the profile of `service`'s configured reference file and store it (replacing the old one)."""
    profile = build_profile(read_reference(service.reference.path), service.schema_)
    with store.transaction() as session:
        store.save_profile(session, service.name, profile.fingerprint, str(service.reference.path),
                           profile.rows, profile.to_json())
    return profile


def stored_profile(store, service) -> tuple[Profile | None, str | None]:
    """The service's stored profile, built and stored first if a reference is configured but none is
    stored yet; with a note saying what happened (None when nothing needed saying)."""
    with store.transaction() as session:
        row = store.load_profile(session, service.name)
        text = row.profile if row is not None else None
    if text is not None:
        return Profile.from_json(text), None
    if service.reference is None:
        return None, "no reference configured: data checks that need one report insufficient"
    return store_profile(store, service), f"reference profile built from {service.reference.path} and stored"
