"""What a fold counts of text: latency per input-length bucket, and tokens outside the reference
vocabulary over a hash-sampled share of the distinct texts."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from monitor.aggregate import keys
from monitor.aggregate.profile import FieldProfile
from monitor.aggregate.sketch import Values
from monitor.aggregate.tokens import steps, text_hash
from monitor.aggregate.totals import Totals, add_up, sketch

LENGTH_SPLITS = (0.5, 0.8, 0.9)  # reference length quantiles splitting latency by input length
OOV_SAMPLE = 8  # oov counts take the distinct texts whose text_hash is 0 mod this (the same texts in any split)


def length_buckets(ref: FieldProfile) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """The reference length edges (at LENGTH_SPLITS quantiles of `ref`'s bins) that split latency by
    input length, and the bucket labels (`<120`, `120-400`, `400+`)."""
    edges = ref.edges
    if not edges:
        return (), ("all",)
    picks = sorted({min(max(round(q * (len(edges) + 1)) - 1, 0), len(edges) - 1) for q in LENGTH_SPLITS})
    cuts = tuple(edges[i] for i in picks)
    labels = [f"<{cuts[0]:g}"] + [f"{a:g}-{b:g}" for a, b in itertools.pairwise(cuts)] + [f"{cuts[-1]:g}+"]
    return cuts, tuple(labels)


def latency_by_length(latency: Values | None, accs: list[Totals], source: str, ref: FieldProfile,
                       idx: np.ndarray) -> None:
    """Latency sketches per input-length bucket; `idx` the rows' bins on `ref.edges` (-1 missing)."""
    if latency is None or not ref.edges:
        return
    cuts, labels = length_buckets(ref)
    # Bin i of ref.edges lies at or above edges[i - 1]: its bucket is the number of cuts <= that edge.
    lower = np.r_[-np.inf, np.asarray(ref.edges, dtype=float)]
    bucket_of = np.searchsorted(np.asarray(cuts), lower, side="right")
    bucket = np.where(idx >= 0, bucket_of[np.maximum(idx, 0)], -1)
    for b, label in enumerate(labels):
        rows = bucket == b
        if rows.any():
            sketch(accs, keys.latency_by(source, label), latency, rows)


def fold_oov_rows(name: str, ref: FieldProfile, values: pd.Series, hashes: np.ndarray, missing: np.ndarray,
                  accs: list[Totals]) -> None:
    """fold_oov over rows read by text_rows: each row's text sampled by the same hash, counted where it
    is."""
    chosen = np.flatnonzero((hashes % OOV_SAMPLE == 0) & ~missing)
    _count_oov(name, ref, values.to_numpy(dtype=object), chosen, np.arange(len(values)), accs)


def fold_oov(name: str, ref: FieldProfile, factorized: tuple[np.ndarray, Any], accs: list[Totals]) -> None:
    """Tokens and out-of-vocabulary tokens (`tokens:<f>`, `oov:<f>`) and the texts they came from
    (`oov_texts:<f>`), over the distinct texts sampled by hash (1 in OOV_SAMPLE)."""
    codes, uniques = factorized
    distinct = np.asarray(uniques, dtype=object)
    if not len(distinct):
        return
    if pd.api.types.infer_dtype(distinct, skipna=False) == "string":  # all str, checked in C
        texts = np.arange(len(distinct))
    else:
        texts = np.fromiter((isinstance(x, str) for x in distinct.tolist()), dtype=bool, count=len(distinct)).nonzero()[0]
    chosen = texts[text_hash(distinct[texts]) % OOV_SAMPLE == 0] if len(texts) else texts
    if not len(chosen):
        return
    _count_oov(name, ref, distinct, chosen, codes, accs)


def _count_oov(name: str, ref: FieldProfile, texts: np.ndarray, chosen: np.ndarray, codes: np.ndarray,
               accs: list[Totals]) -> None:
    """Add up the tokens and out-of-vocabulary tokens of `texts[chosen]` for the rows reading text
    `codes` (-1: none)."""
    vocabulary = pa.array(list(ref.vocabulary), type=pa.large_string())
    per_tokens = np.zeros(len(texts) + 1)
    per_oov = np.zeros(len(texts) + 1)
    per_text = np.zeros(len(texts) + 1)
    for first, w in steps(texts[chosen]):
        # Each distinct word of the step is looked up once.
        known = pc.is_in(w.words, value_set=vocabulary).to_numpy(zero_copy_only=False)[w.code[w.valid]]
        parent = w.parent[w.valid]
        rows = chosen[first:first + w.texts]
        per_tokens[rows] = np.bincount(parent, minlength=len(rows))
        per_oov[rows] = np.bincount(parent, weights=~known, minlength=len(rows))
    per_text[chosen] = 1
    add_up(accs, keys.tokens(name), per_tokens[codes])  # code -1 (missing) reads the last slot: 0
    add_up(accs, keys.oov(name), per_oov[codes])
    add_up(accs, keys.oov_texts(name), per_text[codes])
