"""Interval coverage: in 500 seeded repetitions the 95% intervals hold the true value at least 93% of the
time (Wilson for recall, the bootstrap for F1 and ROC AUC), on a population whose values are known."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from checks.quality import Labelled, measure, probabilities

pytestmark = pytest.mark.slow  # ~18 s of CPU: 500 repetitions x 200 resamples

CLS = ("No", "Yes")
N, REPS = 1000, 500
BASE, HIT, FALSE_ALARM, SEPARATION = 0.3, 0.7, 0.1, 1.0
TRUE_RECALL = HIT
TRUE_F1 = 2 * BASE * HIT / (2 * BASE * HIT + (1 - BASE) * FALSE_ALARM + BASE * (1 - HIT))
TRUE_AUC = float(stats.norm.cdf(SEPARATION / np.sqrt(2)))  # binormal scores, unit variances


def draw(rng: np.random.Generator) -> Labelled:
    yes = rng.random(N) < BASE
    pred = np.where(yes, rng.random(N) < HIT, rng.random(N) < FALSE_ALARM)
    z = rng.normal(SEPARATION * yes, 1.0)
    score = 1 / (1 + np.exp(-z))
    return Labelled(np.where(yes, "Yes", "No").astype(object), np.where(pred, "Yes", "No").astype(object),
                    probabilities(score[:, None], CLS, [1]), CLS)


def test_intervals_cover_the_true_value() -> None:
    rng = np.random.default_rng(2026)
    covered = {"recall": 0, "f1": 0, "roc_auc": 0}
    truth = {"recall": TRUE_RECALL, "f1": TRUE_F1, "roc_auc": TRUE_AUC}
    for rep in range(REPS):
        m = {(x.metric, x.cls): x for x in measure(draw(rng), "Yes", samples=200, seed=rep)}
        for metric in covered:
            lo, hi = m[(metric, "Yes")].interval
            covered[metric] += lo <= truth[metric] <= hi
    rates = {k: v / REPS for k, v in covered.items()}
    assert all(r >= 0.93 for r in rates.values()), rates
    assert all(r <= 0.99 for r in rates.values()), rates  # not so wide that they say nothing
