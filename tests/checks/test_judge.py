"""checks.judge: what `reference build` says to fix in a reference, on small inline frames."""

from __future__ import annotations

import numpy as np
import pandas as pd

from checks.judge import judge, rows_needed, summary
from checks.ranges import RateLimit
from checks.thresholds import range_band
from monitor.aggregate.profile import build_profile
from monitor.schema import Schema


def kinds(frame: pd.DataFrame, features: dict[str, str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for c in judge(build_profile(frame, Schema(features=features))):
        out.setdefault(c.field, set()).add(c.kind)
    return out


def test_each_kind_of_concern_on_a_large_reference():
    rng = np.random.default_rng(3)
    n = 2000
    frame = pd.DataFrame({
        "ok": rng.normal(0, 1, n),
        "zero": np.zeros(n),
        "mostly": np.where(rng.random(n) < 0.97, 0.0, rng.normal(5, 1, n)),
        "code": rng.integers(0, 4, n).astype(float),
        "sparse": np.where(rng.random(n) < 0.9, np.nan, rng.normal(0, 1, n)),
        "gone": np.full(n, np.nan),
        "one": ["a"] * n,
    })
    features = dict.fromkeys(["ok", "zero", "mostly", "code", "sparse", "gone"], "numeric") | {"one": "categorical"}
    found = kinds(frame, features)
    assert found == {"zero": {"constant"}, "mostly": {"near_constant"}, "code": {"few_values"},
                     "sparse": {"sparse_bins"}, "gone": {"all_missing"}, "one": {"constant"}}


def test_rows_needed_follow_the_thresholds_and_a_large_enough_reference_has_no_size_concern():
    needs = rows_needed()
    assert range_band(needs["out_of_range"], RateLimit().band_alpha)[1] <= RateLimit().max_rate
    assert range_band(needs["out_of_range"] - 1, RateLimit().band_alpha)[1] > RateLimit().max_rate
    looser = rows_needed({"out_of_range": RateLimit(max_rate=0.05)})
    assert looser["out_of_range"] < needs["out_of_range"]
    big = pd.DataFrame({"x": np.random.default_rng(1).normal(0, 1, max(needs.values()))})
    assert judge(build_profile(big, Schema(features={"x": "numeric"}))) == []
    assert summary([]) is None
