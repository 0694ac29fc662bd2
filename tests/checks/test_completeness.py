"""missing_rate on tiny windows: all-missing, healthy, empty, one row, no reference."""

from __future__ import annotations

import numpy as np

from checks.completeness import RateIncrease, missing_rate
from monitor.aggregate.partial import Partial


def by_field(findings):
    return {f.labels["field"]: f for f in findings}


def test_all_missing_field_breaches(make, window, schema, reference_profile):
    w = window(make(200, x=[np.nan] * 200, c=["a"] * 200, t=["hi"] * 200), schema, reference_profile)
    f = by_field(missing_rate(w, reference_profile, None, RateIncrease()))
    assert f["x"].status == "breach" and f["x"].value == 1.0 and f["x"].baseline == 0.0 and f["x"].n == 200
    assert f["x"].interval[0] > 0.95 and f["c"].status == "ok" and f["c"].value == 0.0


def test_healthy_window_is_ok(sample, window, schema, reference_profile):
    w = window(sample(500, np.random.default_rng(1)), schema, reference_profile)
    assert {f.status for f in missing_rate(w, reference_profile, None, RateIncrease())} == {"ok"}


def test_empty_window_and_single_row_are_insufficient(make, window, schema, reference_profile):
    for w in (Partial(), window(make(1, x=[None], c=["a"], t=["a"]), schema, reference_profile)):
        findings = missing_rate(w, reference_profile, None, RateIncrease())
        assert findings and {f.status for f in findings} == {"insufficient"}
    empty = by_field(missing_rate(Partial(), reference_profile, None, RateIncrease()))
    assert empty["x"].value is None and empty["x"].interval is None and empty["x"].n == 0


def test_without_profile_the_baseline_is_expected_and_without_both_insufficient(make, window, schema):
    half = [None, "a"] * 100
    w = window(make(200, c=["a"] * 200, x=[1.0] * 200, t=half), schema)
    base = window(make(400, c=["a"] * 400, x=[1.0] * 400, t=[None, "a"] * 200), schema)
    assert by_field(missing_rate(w, None, base, RateIncrease()))["t"].status == "ok"
    assert by_field(missing_rate(w, None, base, RateIncrease()))["t"].baseline == 0.5
    assert by_field(missing_rate(w, None, None, RateIncrease()))["t"].status == "insufficient"
    # A field with nothing missing anywhere and no profile yields no finding.
    assert "x" not in by_field(missing_rate(w, None, base, RateIncrease()))
