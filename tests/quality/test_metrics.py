"""Quality metrics against scikit-learn on fixed sets, edge cases, intervals and `insufficient`."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn import metrics as skm

from checks.quality import (
    MISS,
    Labelled,
    _rank_stats,
    confusion,
    measure,
    probabilities,
    quality_findings,
)
from checks.stats import wilson

CLS = ("No", "Yes")


def binary(n: int, seed: int = 1, rounding: int = 2) -> Labelled:
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(n) < 0.3, "Yes", "No").astype(object)
    s = np.where(y == "Yes", rng.beta(4, 3, n), rng.beta(2, 5, n)).round(rounding)  # rounding: tied scores
    p = np.where(s >= 0.5, "Yes", "No").astype(object)
    return Labelled(y, p, probabilities(s[:, None], CLS, [1]), CLS)


def by_key(ms):
    return {(m.metric, m.cls): m for m in ms}


def test_binary_metrics_equal_sklearn() -> None:
    d = binary(1500)
    m = by_key(measure(d, "Yes", samples=0))
    y, p, s = d.y_true.astype(str), d.y_pred.astype(str), d.proba[:, 1]
    for c in CLS:
        assert m[("precision", c)].value == pytest.approx(skm.precision_score(y, p, pos_label=c))
        assert m[("recall", c)].value == pytest.approx(skm.recall_score(y, p, pos_label=c))
        assert m[("f1", c)].value == pytest.approx(skm.f1_score(y, p, pos_label=c))
        assert m[("recall", c)].n == (y == c).sum()  # support
    for avg in ("macro", "weighted"):
        assert m[("precision", avg)].value == pytest.approx(skm.precision_score(y, p, average=avg))
        assert m[("recall", avg)].value == pytest.approx(skm.recall_score(y, p, average=avg))
        assert m[("f1", avg)].value == pytest.approx(skm.f1_score(y, p, average=avg))
    assert m[("accuracy", "all")].value == pytest.approx(skm.accuracy_score(y, p))
    assert m[("roc_auc", "Yes")].value == pytest.approx(skm.roc_auc_score(y == "Yes", s))
    assert m[("pr_auc", "Yes")].value == pytest.approx(skm.average_precision_score(y == "Yes", s))
    assert m[("log_loss", "all")].value == pytest.approx(skm.log_loss(y, d.proba, labels=list(CLS)))
    # Expected calibration error over 10 equal-width bins, from sklearn's calibration_curve per bin.
    from sklearn.calibration import calibration_curve

    bins = np.searchsorted(np.linspace(0, 1, 11)[1:-1], s)
    true, pred = calibration_curve(y == "Yes", s, n_bins=10, strategy="uniform")
    counts = np.bincount(bins, minlength=10)
    ece = float(np.sum(counts[counts > 0] / len(s) * np.abs(true - pred)))
    assert m[("calibration_error", "Yes")].value == pytest.approx(ece)
    assert not any(k[0] in ("roc_auc", "pr_auc") and k[1] == "No" for k in m)  # ranked for the positive class


def test_multiclass_metrics_equal_sklearn() -> None:
    rng = np.random.default_rng(5)
    cls = ("a", "b", "c")
    n = 900
    y = rng.choice(cls, n, p=[0.5, 0.3, 0.2]).astype(object)
    logits = rng.normal(0, 1, (n, 3)) + 1.5 * (y[:, None] == np.array(cls)[None, :])
    prob = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    p = np.array(cls, dtype=object)[prob.argmax(axis=1)]
    d = Labelled(y, p, probabilities(prob, cls, [0, 1, 2]), cls)
    m = by_key(measure(d, None, samples=0))
    for avg in ("macro", "weighted"):
        assert m[("f1", avg)].value == pytest.approx(skm.f1_score(y.astype(str), p.astype(str), average=avg))
    for i, c in enumerate(cls):
        assert m[("roc_auc", c)].value == pytest.approx(skm.roc_auc_score(y == c, prob[:, i]))
        assert m[("pr_auc", c)].value == pytest.approx(skm.average_precision_score(y == c, prob[:, i]))
    assert m[("log_loss", "all")].value == pytest.approx(skm.log_loss(y, prob, labels=list(cls)))


@pytest.mark.parametrize("case", ["class_absent", "single_class", "one_prediction"])
def test_edge_cases_equal_sklearn_or_undefined(case: str) -> None:
    rng = np.random.default_rng(3)
    n = 200
    cls = ("a", "b", "c")
    y = rng.choice(cls, n).astype(object)
    p = rng.choice(cls, n).astype(object)
    if case == "class_absent":  # class c neither labelled nor predicted in this window
        y[y == "c"], p[p == "c"] = "a", "b"
    elif case == "single_class":
        y[:] = "a"
    else:
        p[:] = "b"
    d = Labelled(y, p, np.full((n, 3), np.nan), cls)
    m = by_key(measure(d, None, samples=0))
    ys, ps = y.astype(str), p.astype(str)
    for avg in ("macro", "weighted"):
        for metric, fn in (("precision", skm.precision_score), ("recall", skm.recall_score), ("f1", skm.f1_score)):
            assert m[(metric, avg)].value == pytest.approx(fn(ys, ps, average=avg, zero_division=0))
    assert m[("accuracy", "all")].value == pytest.approx(skm.accuracy_score(ys, ps))
    for c in cls:
        support, predicted = (ys == c).sum(), (ps == c).sum()
        prec, rec = m[("precision", c)], m[("recall", c)]
        # Defined: equal to sklearn. Undefined (0/0): None, never NaN, and `insufficient` as a finding.
        if predicted:
            assert prec.value == pytest.approx(skm.precision_score(ys, ps, labels=[c], average="micro"))
        else:
            assert prec.value is None
        if support:
            assert rec.value == pytest.approx(skm.recall_score(ys, ps, labels=[c], average="micro"))
        else:
            assert rec.value is None
    findings = quality_findings(list(m.values()), "all", 30, {}, {})
    for f in findings:
        assert f.value is None or math.isfinite(f.value)
        if f.value is None:
            assert f.status == "insufficient"
    if case == "single_class":  # no scores at all: the score metrics are simply absent
        assert ("roc_auc", "a") not in m


def test_single_class_auc_is_undefined_not_nan() -> None:
    d = binary(300)
    only_no = d.take(d.y_true == "No")
    m = by_key(measure(only_no, "Yes", samples=50, seed=1))
    assert m[("roc_auc", "Yes")].value is None and m[("pr_auc", "Yes")].value is None
    assert m[("roc_auc", "Yes")].interval is None


def test_failed_requests_counted_as_misses() -> None:
    y = np.array(["Yes", "Yes", "No", "No", "Yes"], dtype=object)
    p = np.array(["Yes", MISS, "No", MISS, "No"], dtype=object)
    m = by_key(measure(Labelled(y, p, np.full((5, 2), np.nan), CLS), "Yes", samples=0))
    assert m[("recall", "Yes")].value == pytest.approx(1 / 3)  # the failed Yes is a false negative
    assert m[("precision", "Yes")].value == pytest.approx(1.0)  # a miss is not a prediction of Yes
    assert m[("accuracy", "all")].value == pytest.approx(2 / 5)
    assert confusion(Labelled(y, p, np.full((5, 2), np.nan), CLS))["matrix"] == [[1, 0, 1], [1, 1, 1]]


def test_weighted_rank_stats_equal_sklearn_with_sample_weight() -> None:
    """The bootstrap's resampled AUCs are weighted AUCs: check them against sklearn's sample_weight."""
    d = binary(400, rounding=1)
    y, s = (d.y_true == "Yes").astype(float), d.proba[:, 1]
    W = np.random.default_rng(0).multinomial(400, np.full(400, 1 / 400), size=5).astype(float)
    auc, ap = _rank_stats(W, y, s)
    for i, w in enumerate(W):
        assert auc[i] == pytest.approx(skm.roc_auc_score(y, s, sample_weight=w))
        assert ap[i] == pytest.approx(skm.average_precision_score(y, s, sample_weight=w))


def test_intervals_wilson_and_bootstrap() -> None:
    d = binary(800)
    m = by_key(measure(d, "Yes", samples=200, seed=11))
    r = m[("recall", "Yes")]
    tp = int(((d.y_true == "Yes") & (d.y_pred == "Yes")).sum())
    assert r.interval == pytest.approx(wilson(tp, r.n))
    for key in [("f1", "Yes"), ("f1", "macro"), ("roc_auc", "Yes"), ("pr_auc", "Yes"), ("log_loss", "all")]:
        lo, hi = m[key].interval
        assert lo <= m[key].value <= hi and hi - lo < 0.2
    again = by_key(measure(d, "Yes", samples=200, seed=11))
    assert again[("f1", "Yes")].interval == m[("f1", "Yes")].interval  # seeded: a rerun draws alike


def test_below_min_n_is_insufficient_and_twelve_samples_raise_nothing() -> None:
    d = binary(12)
    findings = quality_findings(measure(d, "Yes", samples=100, seed=1), "tiny", 30, {}, {})
    assert findings and all(f.status == "insufficient" for f in findings)
    assert all(f.value is None or math.isfinite(f.value) for f in findings)
    big = quality_findings(measure(binary(500), "Yes", samples=0), "all", 30, {("recall", "Yes", "all"): 0.9}, {})
    rec = next(f for f in big if f.labels == {"metric": "recall", "class": "Yes", "group": "all"})
    assert rec.status == "ok" and rec.baseline == 0.9 and rec.effect == pytest.approx(rec.value - 0.9)
    assert not any(f.status == "breach" for f in big)  # a quality figure measures; rules decide
