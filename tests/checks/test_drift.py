"""drift, prediction_drift, length_distribution and the shared statistics."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from checks.drift import DriftThreshold, drift, prediction_drift
from checks.lengths import length_distribution
from checks.stats import bh, chi2_two_sample, jensen_shannon, psi, wilson
from monitor.aggregate.partial import Partial
from monitor.aggregate.profile import build_profile
from monitor.schema import Schema


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


def test_a_shift_under_the_floor_is_ok_but_still_shifted(sample, window, schema, reference_profile):
    """`shifted`: significant and above the learned band, whatever the PSI floor (what an open episode
    holds on); the same distribution is not."""
    rng = np.random.default_rng(8)
    small = by_label(prediction_drift(window(sample(2000, rng, score_yes=rng.beta(2.3, 5, 2000)), schema,
                                             reference_profile), reference_profile, None, DriftThreshold()))
    f = small["score:yes"]
    assert f.status == "ok" and f.value < DriftThreshold().psi_floor and f.detail["shifted"] is True
    same = prediction_drift(window(sample(2000, np.random.default_rng(8)), schema, reference_profile),
                            reference_profile, None, DriftThreshold())
    assert [f.detail["shifted"] for f in same] == [False, False]


def test_statistics():
    assert psi([10, 20, 30], [1, 2, 3]) == pytest.approx(0.0)
    assert jensen_shannon([1, 0], [0, 1]) == pytest.approx(math.sqrt(math.log(2)))
    assert psi([100, 0], [0, 100]) > 5  # empty bins smoothed, not infinite
    assert chi2_two_sample([5], [7]) == (0.0, 1.0) and chi2_two_sample([0, 0], [3, 4]) == (0.0, 1.0)
    low, high = wilson(0, 10)
    assert low == 0 and high == pytest.approx(0.2775, abs=1e-4)
    assert wilson(5, 0) == (0.0, 1.0)
    assert bh([0.01, 0.02, 0.5]) == pytest.approx([0.03, 0.03, 0.5]) and bh([]) == []


def test_sparse_bins_are_pooled_before_the_chi_square():
    from scipy import stats

    # A day of a monthly-scale service: one value in a bin the 3,000-row reference never filled. Taken as
    # its own cell (expecting 0.05 values) it alone made p 1.5e-6; pooled with its neighbour, the table is
    # the test scipy computes on it.
    reference, window = [0, 1256, 1132, 292, 320], [1, 94, 44, 15, 13]
    pooled = stats.chi2_contingency([[1256, 1132, 292, 320], [95, 44, 15, 13]], correction=False)
    assert chi2_two_sample(reference, window) == pytest.approx((pooled.statistic, pooled.pvalue))
    # Tables whose cells all expect enough are left whole, and a real shift is still found.
    full = stats.chi2_contingency([[300, 300, 300, 300], [10, 10, 10, 370]], correction=False)
    assert chi2_two_sample([300, 300, 300, 300], [10, 10, 10, 370]) == pytest.approx((full.statistic, full.pvalue))
    # A short last group joins the one before it; one group left is no evidence.
    assert chi2_two_sample([500, 500, 0], [30, 10, 1])[1] == pytest.approx(
        stats.chi2_contingency([[500, 500], [30, 11]], correction=False).pvalue)
    assert chi2_two_sample([1000, 1], [2, 1]) == (0.0, 1.0)


def test_a_quiet_window_needs_its_psi_interval_above_the_band():
    from checks.drift import histogram_findings
    from monitor.aggregate.profile import FieldProfile

    # A 1,409-row reference of a class score on its deciles; a night window of 236 requests from a healthy
    # week: chi-square p 0.0002, PSI 0.151 above the floor and the band (0.11), yet its interval reaches
    # down to 0.04 -- a chance ripple, not a shift the verdict may call worse.
    reference = (140, 142, 141, 141, 140, 141, 141, 141, 141, 141)
    score = FieldProfile("numeric", sum(reference), 0, reference, edges=tuple(range(9)))
    night = (20, 11, 17, 27, 19, 44, 38, 21, 18, 21)
    (f,) = histogram_findings("prediction_drift", [({"output": "score:Yes"}, score, night, "score:Yes")],
                              DriftThreshold())
    assert f.p_value < DriftThreshold().alpha and f.value > max(DriftThreshold().psi_floor, f.detail["band"][1])
    assert f.interval[0] < f.detail["band"][1] and f.status == "ok"
    # A preprocessing bug's shift of about the same PSI on a day-time window of 1,222 is still a breach.
    bug = (95, 87, 142, 116, 149, 154, 185, 82, 156, 56)
    (f,) = histogram_findings("prediction_drift", [({"output": "score:Yes"}, score, bug, "score:Yes")],
                              DriftThreshold())
    assert f.value < 0.12 and f.status == "breach"
