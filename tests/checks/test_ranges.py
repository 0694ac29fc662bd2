"""out_of_range and unseen_categories: inf, NaN, one category, no profile, empty windows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from checks.ranges import RateLimit, out_of_range, unseen_categories
from monitor.aggregate.partial import Partial
from monitor.aggregate.profile import build_profile
from monitor.schema import Schema


def one(findings, field):
    return next(f for f in findings if f.labels["field"] == field)


def test_out_of_range_counts_inf_and_not_nan(make, window, schema, reference_profile):
    x = [50.0] * 180 + [math.inf] * 10 + [-1e9] * 5 + [math.nan] * 5
    w = window(make(200, x=x), schema, reference_profile)
    f = one(out_of_range(w, reference_profile, None, RateLimit()), "x")
    assert f.n == 195 and f.detail["above"] == 10 and f.detail["below"] == 5
    assert f.value == 15 / 195 and f.status == "breach"


def test_out_of_range_healthy_ok_no_profile_nothing_empty_insufficient(sample, window, schema, reference_profile):
    w = window(sample(500, np.random.default_rng(2)), schema, reference_profile)
    assert one(out_of_range(w, reference_profile, None, RateLimit()), "x").status == "ok"
    assert out_of_range(w, None, None, RateLimit()) == []
    assert one(out_of_range(Partial(), reference_profile, None, RateLimit()), "x").status == "insufficient"


def test_unseen_categories_breach_with_top_values(make, window, schema, reference_profile):
    c = ["a"] * 150 + ["new"] * 30 + ["newer"] * 20
    w = window(make(200, c=c), schema, reference_profile)
    f = one(unseen_categories(w, reference_profile, None, RateLimit()), "c")
    assert f.status == "breach" and f.value == 0.25 and f.detail["top"] == [["new", 30], ["newer", 20]]


def test_single_category_reference_and_single_row(make, window):
    schema = Schema(features={"c": "categorical"})
    prof = build_profile(pd.DataFrame({"c": ["only"] * 50}), schema)
    w = window(make(150, c=["only"] * 150), schema, prof)
    assert one(unseen_categories(w, prof, None, RateLimit()), "c").status == "ok"
    single = window(make(1, c=["other"]), schema, prof)
    f = one(unseen_categories(single, prof, None, RateLimit()), "c")
    assert f.status == "insufficient" and f.value == 1.0 and f.n == 1
