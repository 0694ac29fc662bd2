"""drift, prediction_drift, length_distribution and the shared statistics."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from checks.drift import DriftThreshold, drift, prediction_drift
from checks.lengths import length_distribution
from checks.stats import bh, chi2_two_sample, jensen_shannon, psi, wilson
from monitor.config import Schema
from monitor.partials import Partial
from monitor.profile import build_profile


def by_label(findings):
    return {next(iter(f.labels.values())): f for f in findings}


def test_shifted_numeric_and_categorical_features_breach(sample, window, schema, reference_profile):
    rng = np.random.default_rng(3)
    shifted = sample(600, rng, x=rng.normal(60, 10, 600), c=rng.choice(["a", "d"], 600))
    f = by_label(drift(window(shifted, schema, reference_profile), reference_profile, None, DriftThreshold()))
    assert f["x"].status == "breach" and f["x"].value > 0.3 and f["x"].p_value < 1e-6
    assert f["c"].status == "breach" and 0 < f["c"].effect <= math.sqrt(math.log(2))
    assert f["x"].detail["bins"] == 10 and sum(f["x"].detail["window"]) == 600


def test_same_distribution_is_ok_and_bh_only_raises_p(sample, window, schema, reference_profile):
    w = window(sample(2000, np.random.default_rng(4)), schema, reference_profile)
    findings = drift(w, reference_profile, None, DriftThreshold())
    assert {f.status for f in findings} == {"ok"}
    assert all(f.p_value >= f.detail["p_raw"] for f in findings)


def test_small_empty_and_profile_less_windows(sample, window, schema, reference_profile):
    small = window(sample(50, np.random.default_rng(5), x=np.full(50, 1e6)), schema, reference_profile)
    assert {f.status for f in drift(small, reference_profile, None, DriftThreshold())} == {"insufficient"}
    empty = drift(Partial(), reference_profile, None, DriftThreshold())
    assert empty == []  # an empty window has no histograms at all
    no_hists = window(sample(300, np.random.default_rng(6)), schema)  # folded without a profile
    assert drift(no_hists, reference_profile, None, DriftThreshold()) == []
    assert drift(no_hists, None, None, DriftThreshold()) == []


def test_single_category_field_never_drifts(make, window):
    schema = Schema(features={"c": "categorical"})
    prof = build_profile(pd.DataFrame({"c": ["only"] * 500}), schema)
    f = drift(window(make(300, c=["only"] * 300), schema, prof), prof, None, DriftThreshold())[0]
    assert f.status == "ok" and f.value == pytest.approx(0.0) and f.p_value == 1.0


def test_nan_and_inf_values_land_in_missing_and_tail_bins(make, window, reference_profile, schema):
    x = [np.nan] * 100 + [np.inf] * 100 + [-np.inf] * 100
    f = by_label(drift(window(make(300, x=x), schema, reference_profile), reference_profile, None, DriftThreshold()))
    assert f["x"].n == 200 and f["x"].detail["window"][0] == 100 and f["x"].detail["window"][-1] == 100
    assert f["x"].status == "breach"


def test_prediction_drift_and_length_distribution(sample, window, schema, reference_profile):
    rng = np.random.default_rng(7)
    w = window(sample(800, rng, prediction=rng.choice(["yes", "no"], 800, p=[0.7, 0.3]),
                      t=["w" * k for k in rng.integers(60, 90, 800)]), schema, reference_profile)
    pred = by_label(prediction_drift(w, reference_profile, None, DriftThreshold()))
    assert pred["prediction"].status == "breach" and pred["score:yes"].status == "ok"
    lengths = length_distribution(w, reference_profile, None, DriftThreshold())
    assert [(f.labels, f.status) for f in lengths] == [({"field": "t"}, "breach")]
    assert length_distribution(w, None, None, DriftThreshold()) == []


def test_statistics():
    assert psi([10, 20, 30], [1, 2, 3]) == pytest.approx(0.0)
    assert jensen_shannon([1, 0], [0, 1]) == pytest.approx(math.sqrt(math.log(2)))
    assert psi([100, 0], [0, 100]) > 5  # empty bins smoothed, not infinite
    assert chi2_two_sample([5], [7]) == (0.0, 1.0) and chi2_two_sample([0, 0], [3, 4]) == (0.0, 1.0)
    low, high = wilson(0, 10)
    assert low == 0 and high == pytest.approx(0.2775, abs=1e-4)
    assert wilson(5, 0) == (0.0, 1.0)
    assert bh([0.01, 0.02, 0.5]) == pytest.approx([0.03, 0.03, 0.5]) and bh([]) == []
