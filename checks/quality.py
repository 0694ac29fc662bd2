"""Quality of labelled predictions, as pure functions on arrays: per-class and averaged metrics with 95%
intervals, the confidence-based estimate (CBPE) before labels, label coverage and bias, and the pairwise
comparison of two versions on shared requests.

These work on rows (labels join single predictions), not on bucket Partials, so they are plain functions
declared through the check contract (checks.contract.declare), not window checks. Their stored check
names: quality, quality_estimate, label_coverage, label_bias, version_compare (acceptance: checks.acceptance).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats as sps

from checks.base import Finding
from checks.contract import Contract, Count, Share, declare, measured
from checks.stats import mover, pearson, wilson

MISS = "(failed)"  # the prediction of a failed request counted as a miss: no class, always wrong
AVERAGES = ("macro", "weighted")
_BLOCK_CELLS = 4_000_000  # bootstrap weights held at once (resamples x rows): bounds memory to ~32 MB


@dataclass(frozen=True)
class QualityThreshold:
    """A quality figure measures and does not decide: `insufficient` below `min_n` samples, else `ok`."""

    min_n: Count = 30  # quality.min_n


@dataclass(frozen=True)
class BiasThreshold:
    """Labels arrive at different rates per class when the chi-square p-value is below `alpha` and the
    gap between labelled shares exceeds `tolerance` (quality.bias_tolerance)."""

    min_n: Count = 30  # predictions of a class below which it is left out (quality.min_n)
    tolerance: Share = 0.05
    alpha: Share = 1e-3


def _declare(name: str, family: str, unit: str, n_of: str, params: type, doc: str) -> None:
    declare(Contract(name, family, "quality", unit, n_of, params.min_n, params, "services[].quality", doc=doc))


_declare("quality", "quality", "the metric's own (0..1; log loss in nats)", "labelled predictions", QualityThreshold,
         "Every metric (precision, recall, F1 per class and averaged, accuracy, ROC / PR AUC, log loss, "
         "calibration error) of a labelled window per group, with n and a 95% interval; for feedback labels "
         "(quality.feedback), the thumbs-up rate or the mean score instead.")
_declare("quality_estimate", "estimates", "the metric's own (0..1)", "scored predictions", QualityThreshold,
         "Precision, recall, F1 and accuracy estimated from calibrated scores before labels arrive (CBPE), "
         "with the reference's value as baseline and, once labels mature, the realized value.")
_declare("version_compare", "versions", "difference b - a (-1..1)", "shared labelled requests", QualityThreshold,
         "Accuracy, macro F1 and per-class recall of a version minus the accepted version's on the same "
         "labelled requests, with a paired bootstrap interval, and the predictions that flipped.")
_declare("label_coverage", "labels", "share of predictions labelled (0..1)", "predictions", QualityThreshold,
         "The labelled share of a window's predictions, overall and per predicted class, with Wilson intervals.")
_declare("label_bias", "labels", "largest gap between labelled shares (0..1)", "predictions", BiasThreshold,
         "Whether labels arrive at different rates per predicted class: the largest gap between labelled "
         "shares, with the chi-square p-value of labelled x class.")


@dataclass(frozen=True)
class Labelled:
    """The labelled predictions of one slice. `y_pred` holds MISS for failed requests counted as misses;
    `proba` is rows x classes (NaN rows: no scores, left out of the score-based metrics). `predicted`
    False: the logs hold no prediction at all, so the prediction-based metrics are undefined."""

    y_true: np.ndarray
    y_pred: np.ndarray
    proba: np.ndarray
    classes: tuple[str, ...]
    predicted: bool = True

    def __len__(self) -> int:
        return len(self.y_true)

    def take(self, mask: np.ndarray) -> Labelled:
        return Labelled(self.y_true[mask], self.y_pred[mask], self.proba[mask], self.classes, self.predicted)


def window_rows(labels: ArrayLike, predictions: ArrayLike, failed: np.ndarray, proba: np.ndarray,
                classes: Sequence[str]) -> Labelled:
    """A window's rows as one slice: a missing label as "", a failed request's or a missing prediction as
    MISS. `predicted` is False when requests were served but none holds a prediction (no prediction column):
    every label would otherwise be scored against a MISS."""
    served = ~np.asarray(failed, dtype=bool)
    labels, predictions = np.asarray(labels, dtype=object), np.asarray(predictions, dtype=object)
    present = _present(predictions)
    y_true = np.where(_present(labels), labels, "").astype(object)
    y_pred = np.where(served & present, predictions, MISS).astype(object)
    return Labelled(y_true, y_pred, proba, tuple(classes), bool(present[served].any() or not served.any()))


def _present(values: np.ndarray) -> np.ndarray:
    return np.not_equal(values, None) & (values == values)  # NaN != NaN


@dataclass(frozen=True)
class Measure:
    """One metric of one class (or `macro`, `weighted`, `all`) on one slice; value None when undefined."""

    metric: str
    cls: str
    value: float | None
    n: int
    interval: tuple[float, float] | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def seed_of(*parts: Any) -> int:
    """A stable 63-bit seed from the parts (config seed, window, version, group): reruns draw alike."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def score_classes(classes: Sequence[str], positive: str | None) -> list[str]:
    """Classes whose scores are ranked (AUCs, calibration): the positive one of two, else every class."""
    if len(classes) == 2:
        return [positive if positive in classes else classes[-1]]
    return list(classes)


def probabilities(scores: np.ndarray, classes: Sequence[str], score_of: Sequence[int]) -> np.ndarray:
    """Rows x classes probabilities from the score columns present (`score_of` maps each score column to
    its class index): two classes with one score get its complement; rows normalised to sum 1."""
    n, k = len(scores), len(classes)
    proba = np.full((n, k), np.nan)
    for j, ci in enumerate(score_of):
        proba[:, ci] = scores[:, j]
    if k == 2 and len(score_of) == 1:
        other = 1 - score_of[0]
        proba[:, other] = 1 - proba[:, score_of[0]]
    with np.errstate(invalid="ignore", divide="ignore"):
        total = proba.sum(axis=1, keepdims=True)
        return np.where(total > 0, proba / total, np.nan)


# -- metrics ---------------------------------------------------------------------------------------


def _onehot(values: np.ndarray, classes: Sequence[str]) -> np.ndarray:
    return (np.asarray(values, dtype=object)[:, None] == np.asarray(classes, dtype=object)[None, :]).astype(float)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1), np.nan)


def _class_stats(W: np.ndarray, T: np.ndarray, P: np.ndarray) -> dict[tuple[str, int | str], np.ndarray]:
    """Per-class and averaged precision / recall / F1 and accuracy for each row of weights W (B x n):
    arrays of B, NaN where undefined. Averages follow sklearn's defaults: over the classes present in
    the (resampled) labels or predictions, an undefined class counting 0 (zero_division=0)."""
    tp, sup, pred = W @ (T * P), W @ T, W @ P
    out: dict[tuple[str, int | str], np.ndarray] = {}
    prec, rec, f1 = _div(tp, pred), _div(tp, sup), _div(2 * tp, pred + sup)
    for ci in range(T.shape[1]):
        out[("precision", ci)], out[("recall", ci)], out[("f1", ci)] = prec[:, ci], rec[:, ci], f1[:, ci]
    present = (sup > 0) | (pred > 0)
    for name, v in (("precision", prec), ("recall", rec), ("f1", f1)):
        v0 = np.nan_to_num(v, nan=0.0)
        out[(name, "macro")] = _div((v0 * present).sum(axis=1), present.sum(axis=1).astype(float))
        out[(name, "weighted")] = _div((v0 * sup).sum(axis=1), sup.sum(axis=1))
    out[("accuracy", "all")] = _div(tp.sum(axis=1), W.sum(axis=1))
    return out


def _rank_stats(W: np.ndarray, y: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ROC AUC and average precision (sklearn's step-wise PR AUC) of scores `s` for binary truth `y`,
    for each row of weights W (B x m): arrays of B, NaN when one side has no weight. Ties share ranks."""
    order = np.argsort(-s, kind="mergesort")
    s_sorted = s[order]
    starts = np.flatnonzero(np.r_[True, s_sorted[1:] != s_sorted[:-1]])  # groups of tied scores, high first
    Ws = W[:, order]
    pos = np.add.reduceat(Ws * y[order], starts, axis=1)
    neg = np.add.reduceat(Ws, starts, axis=1) - pos
    P, N = pos.sum(axis=1), neg.sum(axis=1)
    # ROC AUC: each positive beats the negatives scored below it, ties count half.
    neg_below = N[:, None] - np.cumsum(neg, axis=1)
    auc = _div((pos * (neg_below + 0.5 * neg)).sum(axis=1), P * N)
    tps, fps = np.cumsum(pos, axis=1), np.cumsum(neg, axis=1)
    precision = _div(tps, tps + fps)
    ap = _div((pos * np.nan_to_num(precision)).sum(axis=1), P)
    auc[(P == 0) | (N == 0)] = np.nan
    ap[P == 0] = np.nan
    return auc, ap


def _weights(rng: np.random.Generator, n: int, samples: int):
    """Bootstrap resamples as count weights (how often each row was drawn, n draws with replacement),
    in blocks that bound memory."""
    block = max(1, min(samples, _BLOCK_CELLS // max(n, 1)))
    done = 0
    while done < samples:
        size = min(block, samples - done)
        draws = rng.integers(0, n, (size, n)) + (np.arange(size) * n)[:, None]
        yield np.bincount(draws.ravel(), minlength=size * n).reshape(size, n).astype(float)
        done += size


def _all_stats(W: np.ndarray, data: Labelled, positive: str | None, bins: int,
               T: np.ndarray, P: np.ndarray) -> dict[tuple[str, Any], np.ndarray]:
    out = _class_stats(W, T, P)
    scored = np.isfinite(data.proba).all(axis=1)
    if scored.any():
        Wp, proba, Ts = (W, data.proba, T) if scored.all() else (W[:, scored], data.proba[scored], T[scored])
        for c in score_classes(data.classes, positive):
            ci = data.classes.index(c)
            y, s = Ts[:, ci], proba[:, ci]
            out[("roc_auc", ci)], out[("pr_auc", ci)] = _rank_stats(Wp, y, s)
            # Expected calibration error: |labelled rate - mean score| per equal-width score bin, weighted.
            b = np.searchsorted(np.linspace(0, 1, bins + 1)[1:-1], s)  # as sklearn's calibration_curve
            gap = Wp @ (np.eye(bins)[b] * (y - s)[:, None])
            out[("calibration_error", ci)] = _div(np.abs(gap).sum(axis=1), Wp.sum(axis=1))
        p_true = np.clip((proba * Ts).sum(axis=1), np.finfo(float).eps, 1 - np.finfo(float).eps)
        known = Ts.sum(axis=1) > 0
        out[("log_loss", "all")] = _div(Wp @ (-np.log(p_true) * known), Wp @ known.astype(float))
    return out


def _percentile(draws: list[np.ndarray], samples: int,
                bounds: tuple[float, float] | None) -> tuple[float, float] | None:
    """95% percentile interval of bootstrap draws. When fewer than half of them (or 10) are defined (a
    class absent from most resamples), the metric's whole range `bounds`: the data cannot narrow it
    (unbounded metrics: the defined draws' percentiles). None without a defined draw."""
    d = np.concatenate(draws)
    d = d[np.isfinite(d)]
    if len(d) >= max(10, samples // 2) or (bounds is None and len(d)):
        lo, hi = np.percentile(d, [2.5, 97.5])
        return float(lo), float(hi)
    return bounds


SCORED = ("roc_auc", "pr_auc", "calibration_error", "log_loss")  # metrics of the scores, not the predictions
WILSON = {"precision": "pred", "recall": "support", "accuracy": "n", "feedback_rate": "n"}  # proportions: Wilson
FEEDBACK_RATE, FEEDBACK_MEAN = "feedback_rate", "feedback_mean"


def feedback_measure(values: np.ndarray, metric: str, bounds: tuple[float | None, float | None] = (None, None)
                     ) -> Measure:
    """Feedback on one slice, without predictions (class `all`): `feedback_rate`, the share of values 1
    among values 1 and 0 (thumbs up / down) with a Wilson interval; `feedback_mean`, the mean of numeric
    scores with a Student t 95% interval clipped to `bounds` (the scale's ends). Value None without any."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    n = len(v)
    if metric == FEEDBACK_RATE:
        k = int((v == 1).sum())
        return Measure(FEEDBACK_RATE, "all", k / n if n else None, n, wilson(k, n) if n else None,
                       {"positive": k, "negative": n - k})
    if not n:
        return Measure(FEEDBACK_MEAN, "all", None, 0)
    mean, sd = float(v.mean()), float(v.std(ddof=1)) if n > 1 else math.nan
    interval = None
    if n > 1:
        half = float(sps.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
        lo, hi = bounds
        interval = (max(mean - half, -math.inf if lo is None else lo), min(mean + half, math.inf if hi is None else hi))
    return Measure(FEEDBACK_MEAN, "all", mean, n, interval, {"sd": sd})


def measure(data: Labelled, positive: str | None, bins: int = 10, samples: int = 200,
            seed: int = 0) -> list[Measure]:
    """Every metric of the slice with its n and 95% interval: Wilson for precision, recall and accuracy;
    a seeded percentile bootstrap (`samples` resamples; 0: no intervals) for F1, the averages, the AUCs,
    log loss and calibration error. A metric undefined on the slice has value None."""
    classes = data.classes
    T, P = _onehot(data.y_true, classes), _onehot(data.y_pred, classes)
    n = len(data)
    point = _all_stats(np.ones((1, n)), data, positive, bins, T, P) if n else {}
    boot: dict[tuple[str, Any], list[np.ndarray]] = {k: [] for k in point}
    if samples and n:
        for W in _weights(np.random.default_rng(seed), n, samples):
            for k, v in _all_stats(W, data, positive, bins, T, P).items():
                boot[k].append(v)
    tp, sup, pred = (T * P).sum(axis=0), T.sum(axis=0), P.sum(axis=0)
    scored = int(np.isfinite(data.proba).all(axis=1).sum())
    out = []
    for (metric, key), v in point.items():
        value = None if math.isnan(v[0]) else float(v[0])
        cls = classes[key] if isinstance(key, int) else key
        ci = key if isinstance(key, int) else None
        if metric in SCORED:
            count, detail = scored, {}
            if ci is not None:
                detail = {"positives": int(T[np.isfinite(data.proba).all(axis=1), ci].sum())}
        elif ci is not None:
            # F1 rests on the rows labelled or predicted as the class (a class never labelled still has one).
            count = int({"precision": pred, "recall": sup, "f1": sup + pred - tp}[metric][ci])
            detail = {"tp": int(tp[ci]), "support": int(sup[ci]), "predicted": int(pred[ci])}
        else:
            count, detail = n, {}
        if metric not in SCORED and not data.predicted:
            # Every label would be compared with a MISS: a 0.0 that measures the logs, not the model.
            value, detail = None, {**detail, "why": "no prediction column: the logs hold no prediction to "
                                                   "compare the labels with"}
        interval = None
        if value is not None and metric in WILSON and (ci is not None or metric == "accuracy"):
            k = tp[ci] if ci is not None else tp.sum()
            interval = wilson(float(k), float(count)) if count else None
        elif value is not None and boot.get((metric, key)):
            interval = _percentile(boot[(metric, key)], samples, None if metric == "log_loss" else (0.0, 1.0))
        out.append(Measure(metric, cls, value, count, interval, detail))
    return out


def confusion(data: Labelled) -> dict[str, Any]:
    """The confusion matrix (rows: true class, columns: predicted class, then MISS) as a JSON document."""
    cols = list(data.classes) + [MISS]
    matrix = (_onehot(data.y_true, data.classes).T @ _onehot(data.y_pred, cols)).astype(int)
    return {"true": list(data.classes), "predicted": cols, "matrix": matrix.tolist()}


def quality_findings(measures: list[Measure], group: str, min_n: int, baselines: Mapping[tuple, float],
                     detail: Mapping[str, Any]) -> list[Finding]:
    """`quality` findings of one slice: status `insufficient` below `min_n` or when undefined, else `ok`
    (a quality figure measures; acceptance rules decide). `baselines` maps (metric, class, group) to the
    reference's value."""
    out = []
    for m in measures:
        base = baselines.get((m.metric, m.cls, group))
        status = measured(m.value, m.n, min_n)
        effect = None if m.value is None or base is None else m.value - base
        out.append(Finding("quality", {"metric": m.metric, "class": m.cls, "group": group}, m.value, status,
                           m.n, base, effect, m.interval, detail={**m.detail, **detail, "estimated": False}))
    return out


# -- the estimate before labels (CBPE) -------------------------------------------------------------


def expected_confusion(y_pred: np.ndarray, proba: np.ndarray, classes: Sequence[str]) -> np.ndarray:
    """CBPE's expected confusion matrix (true x predicted): each prediction adds its calibrated class
    probabilities to its predicted column. Rows without scores or predictions are left out."""
    ok = np.isfinite(proba).all(axis=1)
    return proba[ok].T @ _onehot(y_pred[ok], classes)


def _estimate_stats(T: np.ndarray, P: np.ndarray) -> dict[tuple[str, int | str], np.ndarray]:
    """Precision / recall / F1 per class, macro averages and accuracy from (B x) rows x classes truth T
    (probabilities or drawn labels) and predictions P: arrays of B, NaN where undefined."""
    if T.ndim == 2:
        T = T[None]
    tp, pred, sup = np.einsum("bik,ik->bk", T, P), np.broadcast_to(P.sum(axis=0), T.shape[::2]), T.sum(axis=1)
    out: dict[tuple[str, int | str], np.ndarray] = {}
    present = (sup > 0) | (pred > 0)
    for name, v in (("precision", _div(tp, pred)), ("recall", _div(tp, sup)), ("f1", _div(2 * tp, pred + sup))):
        for ci in range(P.shape[1]):
            out[(name, ci)] = v[:, ci]
        out[(name, "macro")] = _div((np.nan_to_num(v) * present).sum(axis=1), present.sum(axis=1).astype(float))
    out[("accuracy", "all")] = _div(tp.sum(axis=1), sup.sum(axis=1))
    return out


def estimate(y_pred: np.ndarray, proba: np.ndarray, classes: Sequence[str], samples: int = 0,
             seed: int = 0) -> list[Measure]:
    """Estimated precision, recall and F1 per class, their macro averages, and accuracy, from the
    expected confusion matrix of the rows with scores and a predicted class (values None when undefined).
    The interval (`samples` > 0): where the realized figure falls 95% of the time if the scores are
    calibrated (labels drawn from them)."""
    ok = np.isfinite(proba).all(axis=1) & np.isin(y_pred, classes)  # a MISS adds to no predicted column
    Pr, P = proba[ok], _onehot(y_pred[ok], classes)
    n, k = len(Pr), len(classes)
    point = _estimate_stats(Pr, P)
    draws: dict = {key: [] for key in point}
    if samples and n:
        rng = np.random.default_rng(seed)
        cum = np.cumsum(Pr, axis=1)
        block = max(1, min(samples, _BLOCK_CELLS // max(n * k, 1)))
        for done in range(0, samples, block):
            u = rng.random((min(block, samples - done), n, 1))
            drawn = np.minimum((u > cum[None]).sum(axis=2), k - 1)  # each row's label drawn from its scores
            for key, v in _estimate_stats(np.eye(k)[drawn], P).items():
                draws[key].append(v)
    sup = Pr.sum(axis=0)
    out = []
    for (metric, key), v in point.items():
        interval = None
        if draws[(metric, key)] and not math.isnan(v[0]):
            interval = _percentile(draws[(metric, key)], samples, (0.0, 1.0))
        cls = classes[key] if isinstance(key, int) else key
        detail = {"expected_support": float(sup[key])} if isinstance(key, int) else {}
        out.append(Measure(metric, cls, None if math.isnan(v[0]) else float(v[0]), n, interval, detail))
    return out


def estimate_findings(estimates: list[Measure], realized: Mapping[tuple[str, str], float | None], group: str,
                      min_n: int, detail: Mapping[str, Any], baselines: Mapping[tuple, float] | None = None,
                      ) -> list[Finding]:
    """`quality_estimate` findings (detail: estimated=True), each with the reference's value as baseline
    (`baselines`: (metric, class, group) -> value), the realized value once the window's labels have
    matured, and the estimate's error (estimate - realized)."""
    out = []
    for m in estimates:
        real = realized.get((m.metric, m.cls))
        error = None if real is None or m.value is None else m.value - real
        status = measured(m.value, m.n, min_n)
        base = (baselines or {}).get((m.metric, m.cls, group))
        effect = None if m.value is None or base is None else m.value - base
        out.append(Finding("quality_estimate", {"metric": m.metric, "class": m.cls, "group": group}, m.value,
                           status, m.n, base, effect, interval=m.interval,
                           detail={**m.detail, **detail, "estimated": True, "realized": real, "estimate_error": error}))
    return out


# -- label coverage and bias -----------------------------------------------------------------------


def coverage_findings(predicted: np.ndarray, labelled: np.ndarray, classes: Sequence[str], min_n: int,
                      detail: Mapping[str, Any]) -> list[Finding]:
    """`label_coverage`: the labelled share of the window's predictions, overall and per predicted class,
    with Wilson intervals (the only class every prediction has before its label)."""
    out = []
    for cls, mask in [("all", np.ones(len(predicted), bool))] + [(c, predicted == c) for c in classes]:
        n, k = int(mask.sum()), int(labelled[mask].sum())
        value = k / n if n else None
        out.append(Finding("label_coverage", {"class": cls}, value, measured(value, n, min_n), n,
                           interval=wilson(k, n) if n else None, detail={**detail, "labelled": k}))
    return out


def bias_finding(predicted: np.ndarray, labelled: np.ndarray, classes: Sequence[str], min_n: int,
                 tolerance: float, expected_share: Mapping[str, float] | None,
                 detail: Mapping[str, Any]) -> Finding:
    """`label_bias`: do labels arrive at different rates per class? Value: the largest gap between the
    labelled shares of predicted classes; p-value of the chi-square test of labelled x class. Breach
    when p < 0.001 and the gap exceeds `tolerance`, with every compared class at `min_n` or more.
    `expected_share` (calibrated scores, all predictions) is set beside the labels' class shares.
    Interval: Newcombe's, of the difference between the two extreme classes' shares."""
    rows = [(c, int((predicted == c).sum()), int(labelled[predicted == c].sum())) for c in classes]
    rows = [r for r in rows if r[1] >= min_n]
    shares = {c: k / n for c, n, k in rows}
    extra: dict[str, Any] = {**detail, "labelled_share": shares}
    if expected_share is not None:
        extra["expected_class_share"] = dict(expected_share)
    if len(rows) < 2:
        return Finding("label_bias", {}, None, "insufficient", int(len(predicted)), detail=extra)
    (_, n_hi, k_hi), (_, n_lo, k_lo) = max(rows, key=lambda r: r[2] / r[1]), min(rows, key=lambda r: r[2] / r[1])
    gap = k_hi / n_hi - k_lo / n_lo
    interval = mover(k_hi / n_hi, wilson(k_hi, n_hi), k_lo / n_lo, wilson(k_lo, n_lo))
    table = np.array([[k, n - k] for _, n, k in rows], dtype=float)
    # Every prediction labelled (or none): no test to make, and none to count in the window's family.
    p = None if (table.sum(axis=0) == 0).any() else float(sps.chi2.sf(*pearson(table)))
    status = "breach" if p is not None and p < BiasThreshold.alpha and gap > tolerance else "ok"
    return Finding("label_bias", {}, gap, status, int(sum(r[1] for r in rows)), effect=gap, interval=interval,
                   p_value=p, detail=extra)


# -- two versions on the same requests -------------------------------------------------------------


def compare_versions(a: Labelled, b: Labelled, pred_a_all: np.ndarray, pred_b_all: np.ndarray,
                     positive: str | None, samples: int, seed: int) -> list[Measure]:
    """Pairwise comparison of version b against a on the same labelled requests: deltas (b - a) of
    accuracy, macro F1 and each class's recall with a paired bootstrap interval, plus flips: predictions
    that changed side of the threshold (all shared requests) and which flips became right or wrong. Deltas
    are None when either holds no prediction (`predicted` False): every label a MISS on both sides."""
    classes = a.classes
    Ta = _onehot(a.y_true, classes)
    Pa, Pb = _onehot(a.y_pred, classes), _onehot(b.y_pred, classes)
    pos = positive if positive in classes else classes[-1]
    flips = {
        "shared": int(len(pred_a_all)),
        "changed": int((pred_a_all != pred_b_all).sum()),
        "to_positive": int(((pred_a_all != pos) & (pred_b_all == pos)).sum()),
        "to_negative": int(((pred_a_all == pos) & (pred_b_all != pos)).sum()),
        "labelled_changed": int((a.y_pred != b.y_pred).sum()),
        "became_right": int(((a.y_pred != a.y_true) & (b.y_pred == b.y_true)).sum()),
        "became_wrong": int(((a.y_pred == a.y_true) & (b.y_pred != b.y_true)).sum()),
    }
    keys = [("accuracy", "all"), ("f1", "macro")] + [("recall", ci) for ci in range(len(classes))]
    n = len(a)

    def deltas(W):
        sa, sb = _class_stats(W, Ta, Pa), _class_stats(W, Ta, Pb)
        return {k: sb[k] - sa[k] for k in keys}

    point = deltas(np.ones((1, n))) if n and a.predicted and b.predicted else {}
    draws: dict = {k: [] for k in keys}
    if point and samples:
        for W in _weights(np.random.default_rng(seed), n, samples):
            for k, v in deltas(W).items():
                draws[k].append(v)
    out = []
    for metric, key in keys:
        v = point.get((metric, key), np.array([np.nan]))[0]
        interval = None
        if draws[(metric, key)] and not math.isnan(v):
            interval = _percentile(draws[(metric, key)], samples, (-1.0, 1.0))
        cls = classes[key] if isinstance(key, int) else key
        out.append(Measure(metric, cls, None if math.isnan(v) else float(v), n, interval, dict(flips)))
    return out
