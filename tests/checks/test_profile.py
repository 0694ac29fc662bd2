"""Reference profile: bins, missing rates, categories, text lengths, outputs; JSON round trip; files."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from monitor.aggregate.profile import (
    MAX_CATEGORIES,
    N_BINS,
    Profile,
    build_profile,
    profile_for,
    read_reference,
)
from monitor.aggregate.tokens import TOKEN_CHARS, tokens
from monitor.schema import Schema

SCHEMA = Schema(features={"x": "numeric", "c": "categorical", "t": "text"}, classes=["yes", "no"])


def reference(n: int = 1000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(10, 2, n)
    x[:50] = np.nan
    return pd.DataFrame({"x": x, "c": rng.choice(["a", "b", "c"], n), "t": ["w" * k for k in rng.integers(0, 40, n)],
                         "prediction": rng.choice(["yes", "no"], n), "label": rng.choice(["yes", "no"], n),
                         "score_yes": rng.uniform(0, 1, n)})


def test_numeric_quantile_bins_with_open_tails():
    p = build_profile(reference(), SCHEMA).fields["x"]
    assert p.kind == "numeric" and p.n == 1000 and p.missing == 50 and p.missing_rate == 0.05
    assert len(p.edges) == N_BINS - 1 and list(p.edges) == sorted(p.edges)
    assert len(p.counts) == N_BINS and sum(p.counts) == 950
    assert max(p.counts) - min(p.counts) <= 2  # quantile bins hold equal shares
    idx = p.bin_index(pd.Series([-math.inf, p.min - 100, math.nan, p.max + 100, math.inf]))
    assert idx.tolist() == [0, 0, -1, N_BINS - 1, N_BINS - 1]


def test_categorical_text_and_outputs():
    prof = build_profile(reference(), SCHEMA)
    c = prof.fields["c"]
    assert set(c.categories) == {"a", "b", "c"} and c.counts[-1] == 0 and sum(c.counts) == 1000
    assert list(c.counts[:-1]) == sorted(c.counts[:-1], reverse=True)
    t = prof.fields["t"]
    assert t.kind == "text" and t.min == 0 and t.max == 39 and sum(t.counts) == 1000
    assert prof.prediction.categories and sum(prof.prediction.counts) == 1000
    assert prof.label is not None and set(prof.label.categories) == {"yes", "no"}
    assert set(prof.scores) == {"yes"}  # score_no is not in the reference


def test_all_missing_single_value_and_inf_fields():
    frame = pd.DataFrame({"x": [np.nan] * 5, "c": ["only"] * 5, "t": [None] * 5})
    prof = build_profile(frame, SCHEMA)
    assert prof.fields["x"].missing_rate == 1 and prof.fields["x"].edges == () and prof.fields["x"].min is None
    assert prof.fields["c"].categories == ("only",) and prof.fields["c"].counts == (5, 0)
    assert prof.fields["t"].missing == 5
    inf = build_profile(pd.DataFrame({"x": [1.0, 2.0, math.inf, -math.inf]}), Schema(features={"x": "numeric"}))
    assert inf.fields["x"].min == 1.0 and inf.fields["x"].max == 2.0 and sum(inf.fields["x"].counts) == 4


def test_absent_column_is_all_missing_and_constant_column_is_one_bin():
    prof = build_profile(pd.DataFrame({"x": [3.0] * 10}), SCHEMA)
    assert prof.fields["x"].edges == (3.0,) and prof.fields["x"].counts == (0, 10)
    assert prof.fields["c"].missing == 10 and prof.fields["t"].missing == 10


def test_many_categories_are_truncated_into_the_other_bin():
    values = [f"v{i}" for i in range(MAX_CATEGORIES + 50)]
    prof = build_profile(pd.DataFrame({"c": values}), Schema(features={"c": "categorical"}))
    c = prof.fields["c"]
    assert c.truncated and len(c.categories) == MAX_CATEGORIES and c.counts[-1] == 50


def test_numeric_categories_are_written_as_the_contract_writes_them():
    prof = build_profile(pd.DataFrame({"c": [1.0, 2.0, np.nan, 2.0]}), Schema(features={"c": "categorical"}))
    assert prof.fields["c"].categories == ("2", "1") and prof.fields["c"].missing == 1


def test_json_round_trip_and_fingerprint():
    prof = build_profile(reference(), SCHEMA)
    again = Profile.from_json(prof.to_json())
    assert again == prof and again.fingerprint == prof.fingerprint
    assert build_profile(reference(seed=1), SCHEMA).fingerprint != prof.fingerprint
    assert "Infinity" not in prof.to_json() and "NaN" not in prof.to_json()


@pytest.mark.parametrize("suffix", ["csv", "jsonl", "parquet"])
def test_reference_files_and_cache(tmp_path, suffix):
    frame = reference(200)
    path = tmp_path / f"ref.{suffix}"
    {"csv": lambda: frame.to_csv(path, index=False),
     "jsonl": lambda: frame.to_json(path, orient="records", lines=True),
     "parquet": lambda: frame.to_parquet(path)}[suffix]()
    assert len(read_reference(path)) == 200
    first = profile_for(path, SCHEMA)
    assert first is profile_for(path, SCHEMA)  # cached while the file is unchanged
    assert first.fields["x"].missing == 50 and first.rows == 200


def _ascii_texts() -> list[str]:
    """ASCII texts that tell the two tokenizer paths apart if they differ: every whitespace byte, other
    control bytes, punctuation at word ends, and texts cut at TOKEN_CHARS in a word, on whitespace and
    right after it."""
    fixed = ["", " ", "\t", "plain words", "tab\tsep", "new\nline\r\nand\x0bvt\x0cff", "sep\x1cfs\x1dgs\x1ers\x1fus",
             "ctl\x01in\x07word \x7fdel \x00nul", "  lead and trail  \n\t", "(quoted), 'words'! ok?", "--- ... !!!",
             "Mixed CASE Words"]
    cut = TOKEN_CHARS
    fixed += ["a" * (cut + 10), "w " * (cut // 2) + "tail", "x" * (cut - 1) + " cut", "x" * (cut - 1) + "\tcut",
              "x" * cut + " next", "x" * (cut - 2) + " ab" + "c" * 20, "y" * (cut - 1) + "\x1fz"]
    rng = np.random.default_rng(7)
    alphabet = np.array(list("abcXYZ019 .,;!?'\"()-") + [chr(c) for c in [*range(0x00, 0x20), 0x7F]])
    for _ in range(300):
        fixed.append("".join(rng.choice(alphabet, int(rng.integers(0, 2 * cut)))))
    return fixed


def test_ascii_fast_path_tokenizes_as_the_unicode_path():
    texts = _ascii_texts()
    assert all(t.isascii() for t in texts)
    fast_flat, fast_parent = tokens(np.array(texts, dtype=object))
    # One non-ASCII text sends the whole batch down the Unicode kernels; its own tokens are left out.
    slow_flat, slow_parent = tokens(np.array([*texts, "caf\u00e9"], dtype=object))
    ours = slow_parent < len(texts)
    fast = list(zip(fast_parent.tolist(), fast_flat.to_pylist(), strict=True))
    slow = list(zip(slow_parent[ours].tolist(), np.array(slow_flat.to_pylist(), dtype=object)[ours].tolist(),
                    strict=True))
    assert fast == slow
    assert len(fast) > 1000
