"""Acceptance rules, the CBPE estimate and its error, label coverage and bias, and version comparison."""

from __future__ import annotations

import numpy as np
import pytest

from checks.acceptance import acceptance_finding, control_fdr
from checks.base import Finding
from checks.quality import (
    Labelled,
    Measure,
    bias_finding,
    compare_versions,
    coverage_findings,
    estimate,
    estimate_findings,
    expected_confusion,
    measure,
    probabilities,
)
from checks.stats import bh, wilson
from monitor.config import QualityRule

CLS = ("No", "Yes")


def observed(k: int, n: int) -> Finding:
    return Finding("quality", {"metric": "recall", "class": "Yes", "group": "all"}, k / n, "ok", n,
                   interval=wilson(k, n), detail={"failed_as_miss": False})


def reference(k: int, n: int) -> Measure:
    return Measure("recall", "Yes", k / n, n, wilson(k, n))


@pytest.mark.parametrize("k, n, status", [
    (360, 500, "insufficient"),  # 0.72 against 0.80: a drop of 0.08, but the difference's interval reaches -0.05
    (300, 500, "breach"),  # 0.60: the whole interval of the difference is below -0.05
    (395, 500, "insufficient"),  # 0.79: likely within the tolerance, but the interval reaches past it
    (400, 500, "ok"),  # 0.80: the whole interval of the difference is above -0.05
    (10, 20, "insufficient"),  # clearly below, but n is under min_n: never a breach
])
def test_max_drop_rule_fires_only_when_the_difference_excludes_the_tolerance(k, n, status) -> None:
    rule = QualityRule(metric="recall", **{"class": "Yes"}, max_drop=0.05)
    base = reference(800, 1000)
    f = acceptance_finding(rule, "all", observed(k, n), base, "reference", min_n=30)
    assert f.check == "acceptance" and f.status == status
    assert f.labels == {"rule": "recall:Yes:all", "metric": "recall", "class": "Yes", "group": "all"}
    assert f.n == n and f.interval == wilson(k, n) and f.detail["baseline_n"] == 1000
    if n >= 30:
        assert f.detail["floor"] == pytest.approx(0.75) and f.effect == pytest.approx(k / n - 0.8)
        lo, hi = f.detail["difference_interval"]
        assert lo < k / n - 0.8 < hi and (hi < -0.05) == (status == "breach") and (lo >= -0.05) == (status == "ok")
        assert (f.p_value < 0.05) == (status == "breach")
        assert (f.detail.get("why") == "the interval cannot exclude a breach") == (status == "insufficient")


def test_the_baselines_uncertainty_counts() -> None:
    """The same window against the same figure from 1,000 or from 50 reference rows: only the first is
    a drop beyond the tolerance. Newcombe's interval as statsmodels computes it."""
    from statsmodels.stats.proportion import confint_proportions_2indep

    rule = QualityRule(metric="recall", **{"class": "Yes"}, max_drop=0.05)
    assert acceptance_finding(rule, "all", observed(330, 500), reference(800, 1000), "reference", 30).status \
        == "breach"
    f = acceptance_finding(rule, "all", observed(330, 500), reference(40, 50), "reference", 30)
    assert f.status == "insufficient" and f.detail["method"] == "newcombe"  # nor can it exclude one
    assert f.detail["difference_interval"] == pytest.approx(
        confint_proportions_2indep(330, 500, 40, 50, method="newcomb", compare="diff"), abs=1e-9)


def test_floor_rule_and_missing_baseline() -> None:
    floor = QualityRule(name="key group floor", metric="recall", **{"class": "Yes"}, group="*", min=0.8)
    assert acceptance_finding(floor, "g", observed(350, 500), None, "reference", 30).status == "breach"
    assert acceptance_finding(floor, "g", observed(38, 50), None, "reference", 30).status == "insufficient"
    assert acceptance_finding(floor, "g", observed(48, 50), None, "reference", 30).status == "ok"
    drop = QualityRule(metric="recall", **{"class": "Yes"}, max_drop=0.01)
    f = acceptance_finding(drop, "all", observed(50, 500), None, "reference", 30)
    assert f.status == "insufficient" and f.detail["why"] == "no baseline"
    with pytest.raises(ValueError):
        QualityRule(metric="recall", max_drop=0.1, min=0.5)


def test_control_fdr_is_benjamini_hochberg_over_the_tested_findings() -> None:
    rule = QualityRule(metric="recall", **{"class": "Yes"}, max_drop=0.0)
    found = [acceptance_finding(rule, "all", observed(k, 500), reference(8000, 10000), "reference", 30)
             for k in (300, 380, 395, 400)] + [acceptance_finding(rule, "all", observed(5, 10), None, "r", 30)]
    ps = [f.p_value for f in found[:4]]
    assert ps[0] < 1e-9 and 0.001 < ps[1] < 0.05 and ps[3] == 1.0
    decided = control_fdr(found, 0.05)
    # The three that do not breach cannot exclude a drop either (max_drop 0): insufficient, yet tested.
    assert [f.status for f in decided] == ["breach", "insufficient", "insufficient", "insufficient", "insufficient"]
    assert [f.detail["p_adjusted"] for f in decided[:4]] == pytest.approx(list(bh(ps)))
    assert all(f.detail["family"] == 4 for f in decided[:4]) and "family" not in decided[4].detail


def calibrated(n: int, seed: int, threshold: float = 0.5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = rng.beta(2, 4, n)
    y = np.where(rng.random(n) < p, "Yes", "No").astype(object)
    pred = np.where(p >= threshold, "Yes", "No").astype(object)
    return y, pred, probabilities(p[:, None], CLS, [1])


def test_expected_confusion_by_hand() -> None:
    pred = np.array(["Yes", "Yes", "No"], dtype=object)
    proba = probabilities(np.array([[0.9], [0.6], [0.2]]), CLS, [1])
    E = expected_confusion(pred, proba, CLS)  # rows: true No, Yes; columns: predicted No, Yes
    assert E == pytest.approx(np.array([[0.8, 0.5], [0.2, 1.5]]))
    est = {(m.metric, m.cls): m.value for m in estimate(pred, proba, CLS)}
    assert est[("precision", "Yes")] == pytest.approx(1.5 / 2.0)
    assert est[("recall", "Yes")] == pytest.approx(1.5 / 1.7)
    assert est[("accuracy", "all")] == pytest.approx(2.3 / 3)


@pytest.mark.parametrize("threshold", [0.5, 0.3])
def test_cbpe_estimate_and_its_error_on_calibrated_scores(threshold: float) -> None:
    y, pred, proba = calibrated(20_000, seed=4, threshold=threshold)
    est = estimate(pred, proba, CLS)
    realized = {(m.metric, m.cls): m.value for m in measure(Labelled(y, pred, proba, CLS), "Yes", samples=0)}
    findings = estimate_findings(est, realized, "all", 30, {"failed_as_miss": False})
    by = {(f.labels["metric"], f.labels["class"]): f for f in findings}
    for key in [("precision", "Yes"), ("recall", "Yes"), ("f1", "Yes"), ("f1", "macro"), ("accuracy", "all")]:
        f = by[key]
        assert f.check == "quality_estimate" and f.detail["estimated"] is True
        assert f.detail["realized"] == pytest.approx(realized[key])
        assert f.detail["estimate_error"] == pytest.approx(f.value - realized[key])
        assert abs(f.detail["estimate_error"]) < 0.02, (key, f.detail)


def test_cbpe_is_wrong_when_scores_are_not_calibrated() -> None:
    """The estimate trusts the scores: shifted (miscalibrated) scores give a visible error."""
    y, pred, proba = calibrated(20_000, seed=5)
    shifted = probabilities(np.clip(proba[:, 1:] + 0.15, 0, 1), CLS, [1])
    est = {(m.metric, m.cls): m.value for m in estimate(pred, shifted, CLS)}
    real = {(m.metric, m.cls): m.value for m in measure(Labelled(y, pred, proba, CLS), "Yes", samples=0)}
    assert est[("precision", "Yes")] - real[("precision", "Yes")] > 0.08


def test_coverage_and_biased_coverage() -> None:
    rng = np.random.default_rng(8)
    pred = np.where(rng.random(4000) < 0.3, "Yes", "No").astype(object)
    labelled = rng.random(4000) < np.where(pred == "Yes", 0.9, 0.6)  # Yes labels arrive more often
    cov = {f.labels["class"]: f for f in coverage_findings(pred, labelled, CLS, 30, {})}
    assert cov["Yes"].value == pytest.approx(labelled[pred == "Yes"].mean())
    assert cov["all"].interval[0] < cov["all"].value < cov["all"].interval[1]
    biased = bias_finding(pred, labelled, CLS, 30, 0.05, {"No": 0.7, "Yes": 0.3}, {})
    assert biased.status == "breach" and biased.value == pytest.approx(0.3, abs=0.03) and biased.p_value < 1e-6
    even = rng.random(4000) < 0.75
    assert bias_finding(pred, even, CLS, 30, 0.05, None, {}).status == "ok"
    assert bias_finding(pred[:40], labelled[:40], CLS, 30, 0.05, None, {}).status == "insufficient"


def test_version_compare_counts_flips_each_side_of_the_threshold() -> None:
    y = np.array(["Yes"] * 6 + ["No"] * 6, dtype=object)
    a = np.array(["Yes", "Yes", "Yes", "No", "No", "No", "No", "No", "No", "No", "Yes", "Yes"], dtype=object)
    b = np.array(["Yes", "No", "No", "No", "No", "Yes", "No", "No", "No", "No", "No", "Yes"], dtype=object)
    nan = np.full((12, 2), np.nan)
    out = compare_versions(Labelled(y, a, nan, CLS), Labelled(y, b, nan, CLS), a, b, "Yes", samples=100, seed=1)
    by = {(m.metric, m.cls): m for m in out}
    flips = by[("accuracy", "all")].detail
    assert flips["to_negative"] == 3 and flips["to_positive"] == 1 and flips["changed"] == 4
    assert flips["became_right"] == 2 and flips["became_wrong"] == 2  # b drops 2 Yes, gains r5 and r10
    assert by[("recall", "Yes")].value == pytest.approx(2 / 6 - 3 / 6)
    assert by[("accuracy", "all")].value == pytest.approx(0.0)
    lo, hi = by[("recall", "Yes")].interval
    assert lo <= by[("recall", "Yes")].value <= hi


def test_estimate_interval_holds_the_realized_figure_when_scores_are_calibrated() -> None:
    hits, reps = {("recall", "Yes"): 0, ("precision", "Yes"): 0, ("accuracy", "all"): 0}, 60
    for seed in range(reps):
        y, pred, proba = calibrated(1500, seed=100 + seed)
        est = {(m.metric, m.cls): m for m in estimate(pred, proba, CLS, samples=200, seed=seed)}
        real = {(m.metric, m.cls): m.value for m in measure(Labelled(y, pred, proba, CLS), "Yes", samples=0)}
        for key in hits:
            lo, hi = est[key].interval
            hits[key] += lo <= real[key] <= hi
    assert all(h / reps >= 0.88 for h in hits.values()), hits


def test_a_matured_estimate_is_not_a_failed_check() -> None:
    """The estimate's error (estimate - realized) is a figure, not a check failure: the verdict of its
    window raises no `error` alert for it."""
    from datetime import UTC, datetime, timedelta

    from monitor.verdicts.verdict import decide

    y, pred, proba = calibrated(5_000, seed=5, threshold=0.5)
    realized = {(m.metric, m.cls): m.value for m in measure(Labelled(y, pred, proba, CLS), "Yes", samples=0)}
    start = datetime(2026, 1, 5, tzinfo=UTC)
    rows = [f.to_row("svc", "v1", start, start + timedelta(days=1), None)
            for f in estimate_findings(estimate(pred, proba, CLS), realized, "all", 30, {})]
    verdict = decide(rows, service="svc", model_version="v1", window_start=start,
                     window_end=start + timedelta(days=1), now=start + timedelta(days=9))
    assert verdict.errors == ()
    assert any(r["detail"]["estimate_error"] for r in rows)
