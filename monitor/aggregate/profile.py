"""Reference profile: what the training/validation data looked like, field by field.

The profile fixes the bins that every bucket partial counts into (quantile edges for numbers and text
lengths, the category list for categories), so a window's histogram and the reference's histogram are
always on the same bins. It is a frozen value, stored as JSON.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from monitor.aggregate.bins import atom_edges
from monitor.aggregate.reference_file import ReferenceFile, read_reference
from monitor.aggregate.tokens import most_frequent, text_hash, text_rows, token_counts
from monitor.classes import class_names
from monitor.schema import Schema
from monitor.values import category_values

N_BINS = 10  # quantile bins per numeric field and text length
# Class scores are binned no finer than this, with edges halfway between its steps: a reference keeps a
# probability of 3e-7 where logs write 0.0000 or 0.00, and the two are the same output.
SCORE_RESOLUTION = 0.01
MAX_CATEGORIES = 200  # categories kept per field; the rest of the reference is `truncated` into the other bin
FORMAT = 1  # bump when the JSON layout changes (fields added with a default that to_json leaves out do not)
VOCABULARY = 5000  # tokens kept per text field: the reference's most frequent
VOCABULARY_TEXTS = 131072  # distinct reference texts at most the vocabulary is counted over (a hash sample)
# Fields added after FORMAT 1, left out of the JSON while they hold their default: an old stored profile
# keeps its fingerprint (so partials folded before the upgrade still merge) and still loads.
_OPTIONAL = {"vocabulary": (), "tokens": 0, "oov_tokens": 0, "singletons": 0, "distinct": 0}

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
    # text: the VOCABULARY most frequent reference tokens (see aggregate.tokens), the reference's token
    # count, how many of them are outside the vocabulary, and how many vocabulary tokens occurred once;
    # counted over a hash sample of the distinct texts past VOCABULARY_TEXTS of them.
    vocabulary: tuple[str, ...] = ()
    tokens: int = 0
    oov_tokens: int = 0
    singletons: int = 0
    distinct: int = 0  # numeric / text: distinct finite values (lengths); 0 when not recorded

    @property
    def constant(self) -> bool:
        """Numeric or text: every present reference value (length) is the same, so the reference says
        nothing about how the field varies."""
        return self.kind != "categorical" and self.present > 0 and self.min is not None and self.min == self.max

    @property
    def expected_oov(self) -> float | None:
        """Share of tokens a new sample of the reference's distribution has outside the vocabulary: the
        reference's own out-of-vocabulary share plus the Good-Turing mass of words it saw once (a word
        seen once is as likely to be missing from the next sample as a new one is to appear); None
        without tokens."""
        return (self.oov_tokens + self.singletons) / self.tokens if self.tokens else None

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
            return self.category_index(values)
        v = lengths(values)[0] if self.kind == "text" else numbers(values)
        return bin_codes(self.edges, v).astype("int64", copy=False)

    def category_index(self, values: pd.Series) -> np.ndarray:
        """Categorical bin of each value: category position, len(categories) for any other value, -1 for
        missing."""
        return category_codes(self, values).astype("int64", copy=False)


@dataclass(frozen=True)
class Profile:
    """The reference, per feature and for the model's outputs (prediction classes, class scores)."""

    rows: int
    fields: dict[str, FieldProfile] = field(default_factory=dict)
    prediction: FieldProfile | None = None  # categorical over predicted classes
    label: FieldProfile | None = None  # categorical class balance of the reference labels
    scores: dict[str, FieldProfile] = field(default_factory=dict)  # class -> numeric score distribution
    input_tokens: FieldProfile | None = None  # numeric `input_tokens` of the reference, when it has them

    def to_json(self) -> str:
        body = asdict(self)
        if body["input_tokens"] is None:
            del body["input_tokens"]
        for fp in [*body["fields"].values(), *body["scores"].values(), body["prediction"], body["label"],
                   body.get("input_tokens")]:
            for key, default in _OPTIONAL.items():
                if fp is not None and fp[key] == default:
                    del fp[key]
        return json.dumps({"format": FORMAT, **body}, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Profile:
        raw = json.loads(text)
        if raw.pop("format", None) != FORMAT:
            raise ValueError("reference profile written by another tailwatch version; rebuild it")

        def fp(d: dict | None) -> FieldProfile | None:
            if d is None:
                return None
            return FieldProfile(**{**d, "counts": tuple(d["counts"]), "edges": tuple(d["edges"]),
                                   "categories": tuple(d["categories"]),
                                   "vocabulary": tuple(d.get("vocabulary", ()))})

        return cls(rows=raw["rows"], fields={k: fp(v) for k, v in raw["fields"].items()},
                   prediction=fp(raw["prediction"]), label=fp(raw["label"]),
                   scores={k: fp(v) for k, v in raw["scores"].items()},
                   input_tokens=fp(raw.get("input_tokens")))

    @cached_property
    def fingerprint(self) -> str:
        """16 hex digits naming these bins; partials from different profiles do not merge histograms.
        Computed once per profile (a frozen value)."""
        return hashlib.blake2b(self.to_json().encode(), digest_size=8).hexdigest()


def build_profile(frame: pd.DataFrame, schema: Schema) -> Profile:
    """Profile the reference rows in `frame` for the features, prediction, label and scores of `schema`.

    A declared feature absent from the frame is profiled as all-missing.
    """
    n = len(frame)

    def col(name: str) -> pd.Series:
        return frame[name] if name in frame else pd.Series([None] * n, dtype=object)

    # Numeric columns are sorted on a worker (numpy releases the GIL) while this thread factorizes the
    # categorical and text ones (Python objects: they hold it), then sorts those the worker has not
    # started; both cores, the same profile.
    done: dict[str, FieldProfile] = {}
    numeric = iter([name for name, kind in schema.features.items() if kind == "numeric"])  # shared by both

    def sort_numeric() -> None:
        for name in numeric:
            done[name] = _profile(col(name), "numeric")

    with ThreadPoolExecutor(1, thread_name_prefix="tailwatch-profile") as worker:
        sorting = worker.submit(sort_numeric)
        for name, kind in schema.features.items():
            if kind == "categorical":  # named as serving rows are validated, whichever format either is in
                done[name] = _categorical_profile(col(name), name in schema.fold_case)
            elif kind != "numeric":
                done[name] = _profile(col(name), kind)
        sort_numeric()
        sorting.result()
    fields = {name: done[name] for name in schema.features}
    # Labels and predictions are profiled by class name, as serving rows are validated (1.0, "1" are 1).
    prediction = _profile(class_names(col("prediction"), schema.classes), "categorical") if "prediction" in frame \
        else None
    label = _profile(class_names(col("label"), schema.classes), "categorical") if "label" in frame else None
    scores = {c: _profile(col(schema.score_column(c)), "numeric", resolution=SCORE_RESOLUTION)
              for c in schema.classes if schema.score_column(c) in frame}
    # Token counts keep plain quantile edges: their positions also split latency by input length.
    input_tokens = _profile(frame["input_tokens"], "numeric", atoms=False) if "input_tokens" in frame else None
    return Profile(rows=n, fields=fields, prediction=prediction, label=label, scores=scores,
                   input_tokens=input_tokens)


def _shape_key(reference: Any) -> str:
    """The reference's `columns:` and `values:` as text: a profile of the same file read another way differs."""
    return json.dumps([getattr(reference, "columns", {}), getattr(reference, "values", {})], sort_keys=True)


def profile_for(reference: Any, schema: Schema) -> Profile:
    """The profile of the reference file (a path, or a config `Reference`), rebuilt only when the file,
    its `columns:` / `values:` or the schema change."""
    path = getattr(reference, "path", reference)
    st = Path(path).stat()
    return _cached(str(path), st.st_mtime_ns, st.st_size, schema.model_dump_json(), _shape_key(reference))


@lru_cache(maxsize=8)
def _cached(path: str, _mtime: int, _size: int, schema_json: str, shape: str) -> Profile:
    columns, values = json.loads(shape)
    schema = Schema.model_validate_json(schema_json)
    return build_profile(read_reference(ReferenceFile(path, columns, values), schema.fold_case), schema)


def resolve(profile: Any, schema: Schema | None) -> Profile | None:
    """A Profile from a Profile, a config `Reference` (has `.path`), a path, or None."""
    if profile is None or isinstance(profile, Profile):
        return profile
    if schema is None:
        raise ValueError("a reference path needs the schema to be profiled")
    return profile_for(profile, schema)


def _profile(values: pd.Series, kind: Kind, atoms: bool = True, resolution: float | None = None) -> FieldProfile:
    """The field's profile; `resolution`: bin edges rounded to it (finer differences are no change)."""
    n = len(values)
    if kind == "categorical":
        return _categorical_profile(values)
    vocab: dict[str, Any] = {}
    if kind == "text":
        rows = text_rows(values)  # mostly distinct texts: read row by row, not hashed whole to find them
        if rows is not None:
            v = rows[0]
            missing = int(np.isnan(v).sum())
            vocab = _vocabulary_rows(values, rows[1], np.isnan(v))
        else:
            factorized = factorize(values)  # once, for the lengths and the vocabulary
            v, missing_mask = lengths(values, factorized)
            missing = int(missing_mask.sum())
            vocab = _vocabulary(values, factorized)
    else:
        v = numbers(values)
        missing = int(np.isnan(v).sum()) if is_float(values) else int(values.isna().sum())
    finite = v[np.isfinite(v)]
    if not len(finite):
        return FieldProfile(kind, n, missing, (int(np.isinf(v).sum()),), min=None, max=None, **vocab)
    lo, hi = float(finite.min()), float(finite.max())
    finite.sort()
    edges = np.unique(_quantiles(finite, np.linspace(0, 1, N_BINS + 1)[1:-1]))
    edges = atom_edges(finite, edges, N_BINS) if kind == "numeric" and atoms else edges
    if resolution is not None:  # halfway between the steps values written to `resolution` round to
        edges = np.unique((np.round(edges / resolution - 0.5) + 0.5) * resolution)
    edges = tuple(float(e) for e in edges)
    distinct = int(np.count_nonzero(np.diff(finite))) + 1
    # Bin counts from the sorted values: bin k holds edges[k-1] <= v < edges[k]; -inf / +inf the end bins.
    counts = np.diff(np.r_[0, np.searchsorted(finite, edges, side="left"), len(finite)])
    counts[0] += int(np.isneginf(v).sum())
    counts[-1] += int(np.isposinf(v).sum())
    return FieldProfile(kind, n, missing, tuple(int(c) for c in counts), edges=edges, min=lo, max=hi,
                        distinct=distinct, **vocab)


def _vocabulary(values: pd.Series, factorized: Any) -> dict[str, Any]:
    """FieldProfile's vocabulary fields of a text column (nothing when it holds no word), from the values'
    `factorize`. Each distinct text is tokenized once and its tokens counted as often as it occurs."""
    if factorized is None:
        factorized = pd.factorize(values.map(lambda x: x if isinstance(x, str) else None))
    codes, uniques = factorized
    distinct = np.asarray(uniques, dtype=object)
    if len(distinct) and pd.api.types.infer_dtype(distinct, skipna=False) == "string":  # all str, checked in C
        texts = np.arange(len(distinct))
    else:
        texts = np.flatnonzero(np.fromiter((isinstance(x, str) for x in distinct.tolist()), dtype=bool,
                                           count=len(distinct)))
    if not len(texts):
        return {}
    times = np.bincount(codes[codes >= 0], minlength=len(distinct))[texts]
    every = _every(len(texts))
    if every > 1:
        sample = text_hash(distinct[texts]) % every == 0
        texts, times = texts[sample], times[sample]
    return _counted(distinct[texts], times)


def _vocabulary_rows(values: pd.Series, hashes: np.ndarray, missing: np.ndarray) -> dict[str, Any]:
    """_vocabulary of a column of texts (every value a str or missing) from each row's text_hash: a row
    whose hash no other row has is a distinct text of its own, so only the rows sharing a hash are
    hashed whole to find their distinct texts; the same texts counted, the same sample."""
    present = np.flatnonzero(~missing)
    if not len(present):
        return {}
    column = values.to_numpy(dtype=object)
    shared = pd.Series(hashes[present]).duplicated(keep=False).to_numpy()
    alone, rest = present[~shared], present[shared]
    codes, uniques = pd.factorize(column[rest])
    times = np.bincount(codes, minlength=len(uniques))
    first = np.empty(len(uniques), dtype="int64")
    first[codes[::-1]] = rest[::-1]  # the first row of each distinct text: its hash
    every = _every(len(alone) + len(uniques))
    alone, kept = alone[hashes[alone] % every == 0], hashes[first] % every == 0
    texts = np.concatenate([column[alone], np.asarray(uniques, dtype=object)[kept]])
    return _counted(texts, np.concatenate([np.ones(len(alone), dtype="int64"), times[kept]]))


def _every(distinct: int) -> int:
    """1 in how many of `distinct` texts the vocabulary is counted over (1 up to VOCABULARY_TEXTS): a
    power of two, the texts chosen by text_hash (the same texts in any order). The most frequent words
    are all in such a sample, and its out-of-vocabulary share and Good-Turing mass estimate the whole
    reference's."""
    return 1 << int(np.ceil(np.log2(distinct / VOCABULARY_TEXTS))) if distinct > VOCABULARY_TEXTS else 1


def _counted(texts: np.ndarray, times: np.ndarray) -> dict[str, Any]:
    """The vocabulary fields of distinct `texts` (str), text k occurring `times[k]` times."""
    # Every text once (as when each row's text is unique): plain counts, without a weight per token.
    words, freq = token_counts(texts, None if (times == 1).all() else times)
    if not len(words):
        return {}
    vocabulary, kept = most_frequent(words, freq, VOCABULARY)
    return {"vocabulary": tuple(vocabulary), "tokens": int(freq.sum()),
            "oov_tokens": int(freq.sum() - kept.sum()), "singletons": int((kept == 1).sum())}


def _quantiles(ordered: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """np.quantile(ordered, qs) (linear method) of sorted values without numpy's partition: each
    quantile interpolates its two neighbours exactly as np.quantile does (by calling it on them)."""
    n = len(ordered)
    virtual = (n - 1) * qs
    previous = np.floor(virtual).astype("int64")
    nxt = np.minimum(previous + 1, n - 1)
    gamma = virtual - previous
    return np.array([np.quantile(np.array([ordered[a], ordered[b]]), g)
                     for a, b, g in zip(previous.tolist(), nxt.tolist(), gamma.tolist(), strict=True)])


def _categorical_profile(values: pd.Series, fold_case: bool = False) -> FieldProfile:
    """Categories named as serving rows are validated (monitor.values), each distinct value named once
    after the one factorize that counts them; `fold_case`: names in lower case."""
    n = len(values)
    factorized = factorize(values)
    if factorized is not None and not _exact_distinct(values, factorized[1]):
        factorized = None
    if factorized is None:  # 1, 1.0 and True hash alike: name every row first, then count the names
        values = category_values(values, fold_case)
        factorized = factorize(values)
    codes, uniques = factorized
    names = np.asarray(category_values(pd.Series(uniques), fold_case), dtype=object)
    counts = np.bincount(codes[codes >= 0], minlength=len(names))
    named = np.fromiter((x is not None for x in names.tolist()), dtype=bool, count=len(names))
    missing = n - int(counts[named].sum())  # empty text is missing, as serving rows read it
    freq = pd.Series(counts[named], index=pd.Index(names[named], dtype=object))
    if not freq.index.is_unique:  # values spelled apart that name one category (" a", "a") are summed
        freq = freq.groupby(level=0, sort=False).sum()
    # Most frequent first, ties by value, so the profile is the same for the same data.
    freq = freq.iloc[np.lexsort((freq.index.to_numpy(dtype=str), -freq.to_numpy()))]
    kept = freq.iloc[:MAX_CATEGORIES]
    other = int(freq.iloc[MAX_CATEGORIES:].sum())
    return FieldProfile("categorical", n, missing, tuple(int(c) for c in kept) + (other,),
                        categories=tuple(str(c) for c in kept.index), truncated=len(freq) > MAX_CATEGORIES)


def factorize(values: pd.Series) -> tuple[np.ndarray, Any] | None:
    """Codes (-1 for missing, as isna) and distinct values in order of first appearance; None for
    unhashable values. (pandas hashes a column of strings faster than Arrow's dictionary_encode after
    converting it, whether its rows share str objects or each has its own, as parsed JSON does.)"""
    try:
        # A small size hint: pandas sizes the hash table for every row otherwise (24 MiB per million).
        return pd.factorize(values, size_hint=1024)
    except TypeError:
        return None


def _exact_distinct(values: pd.Series, uniques: Any) -> bool:
    """The factorized distinct values are the column's distinct values as named: a typed column, or an
    object column of texts (a hash table holds the Python values 1, 1.0 and True as one)."""
    if values.dtype != object:
        return True
    u = np.asarray(uniques, dtype=object)
    return not len(u) or pd.api.types.infer_dtype(u, skipna=False) == "string"


def is_float(values: pd.Series) -> bool:
    """The column holds numpy floats (NaN marks its missing values)."""
    return isinstance(values.dtype, np.dtype) and values.dtype.kind == "f"


def bin_codes(edges: tuple[float, ...], v: np.ndarray) -> np.ndarray:
    """Bin of each value on sorted inner `edges` (the number of edges <= v), -1 for NaN; in the smallest
    integer type (int8 for up to 100 edges)."""
    if len(edges) <= 100:
        # A comparison per edge is several times faster than a binary search per value for few edges.
        idx = np.zeros(len(v), dtype="int8")
        for e in edges:
            idx += v >= e
    else:
        idx = np.searchsorted(np.asarray(edges, dtype=float), v, side="right").astype("int64")
    idx[np.isnan(v)] = -1
    return idx


def category_codes(ref: FieldProfile, values: pd.Series) -> np.ndarray:
    """FieldProfile.category_index in a small integer type. Each distinct value is looked up once
    (values are factorized first)."""
    n_cats = len(ref.categories)
    factorized = factorize(values)
    if factorized is not None and _exact_distinct(values, factorized[1]):
        codes, uniques = factorized
        # Object texts are compared as they are; typed values as the contract writes them.
        texts = np.asarray(uniques, dtype=object) if values.dtype == object \
            else as_category(pd.Series(uniques)).to_numpy(dtype=object)
        lookup = pd.Index(list(ref.categories), dtype=object).get_indexer(texts)
        lookup[lookup < 0] = n_cats
        # One more slot for code -1 (missing), then one take.
        small = "int16" if n_cats < 2**15 - 1 else "int64"
        return np.append(lookup, -1).astype(small)[codes]
    if values.dtype != object:
        values = as_category(values)
    codes = pd.Categorical(values, categories=list(ref.categories)).codes.astype("int64")
    codes[(codes < 0) & values.notna().to_numpy()] = n_cats
    return codes


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


def numbers(values: pd.Series) -> np.ndarray:
    """Values as float64, NaN for missing or not a number (read-only: may be the column's own array)."""
    if is_float(values) and values.dtype.itemsize == 8:
        return values.to_numpy()
    return pd.to_numeric(values, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _lengths(values: pd.Series) -> np.ndarray:
    return values.astype(object).where(values.notna(), None).str.len().to_numpy(dtype=float, na_value=np.nan)


def lengths(values: pd.Series, factorized: Any = False) -> tuple[np.ndarray, np.ndarray]:
    """Text length of each value (NaN for missing or non-text), and the missing mask (as isna).
    Lengths are taken once per distinct value; `factorized`: the values' `factorize` when already taken."""
    factorized = factorize(values) if factorized is False else factorized
    if factorized is None:
        return _lengths(values), values.isna().to_numpy()
    codes, uniques = factorized
    missing = codes < 0
    if not len(uniques):
        return np.full(len(values), np.nan), missing
    distinct = np.asarray(uniques, dtype=object)
    if pd.api.types.infer_dtype(distinct, skipna=False) == "string":
        per = np.fromiter(map(len, distinct.tolist()), dtype=float, count=len(distinct))
    else:
        per = _lengths(pd.Series(distinct, dtype=object))
    v = per[codes]
    v[missing] = np.nan
    return v, missing


def store_profile(store, service) -> Profile:
    """Build the profile of `service`'s configured reference file and store it (replacing the old one)."""
    profile = build_profile(read_reference(service.reference, service.schema_.fold_case), service.schema_)
    with store.transaction() as session:
        store.profiles.save(session, service.name, profile.fingerprint, str(service.reference.path),
                            profile.rows, profile.to_json())
    return profile


def stored_profile(store, service) -> tuple[Profile | None, str | None]:
    """The service's stored profile, built and stored first if a reference is configured but none is
    stored yet; with a note saying what happened (None when nothing needed saying)."""
    with store.transaction() as session:
        row = store.profiles.load(session, service.name)
        text = row.profile if row is not None else None
    if text is not None:
        return Profile.from_json(text), None
    if service.reference is None:
        return None, "no reference configured: data checks that need one report insufficient"
    return store_profile(store, service), f"reference profile built from {service.reference.path} and stored"
