"""A degenerate reference: a few hundred rows of scikit-learn's Digits (64 pixels, many always or almost
always 0) and synthetic columns of the same kinds (constant, one nonzero value in 300, a sparse pixel,
integer levels). Healthy windows of a few hundred to tens of thousands of rows from the same
distribution stay clear of input breaches; a real shift, even one inside the reference's range, breaches."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_digits

from checks.evaluate import evaluate
from monitor.aggregate.profile import build_profile
from monitor.schema import Schema
from monitor.verdicts.verdict import INPUT_CHECKS

PIXELS = [f"px{i:02d}" for i in range(64)]
DIGITS_SCHEMA = Schema(features=dict.fromkeys(PIXELS, "numeric"))
REFERENCE_ROWS = 300


@pytest.fixture(scope="module")
def digits() -> tuple[pd.DataFrame, pd.DataFrame]:
    """(reference, served population): 300 Digits rows, and the other 1,497."""
    X = load_digits().data
    order = np.random.default_rng(0).permutation(len(X))
    frame = pd.DataFrame(X, columns=PIXELS)
    return frame.iloc[order[:REFERENCE_ROWS]].reset_index(drop=True), frame.iloc[order[REFERENCE_ROWS:]]


def input_breaches(make, window, frame: pd.DataFrame, schema: Schema, profile, baseline) -> list[tuple[str, str]]:
    """(check, field) of every input finding that breaches on `frame` folded as one window."""
    w = window(make(len(frame), **{c: frame[c].to_numpy() for c in frame}), schema, profile)
    return [(f.check, f.labels.get("field")) for f in evaluate(w, profile, baseline)
            if f.check in INPUT_CHECKS and f.status == "breach"]


def served(population: pd.DataFrame, n: int, rng: np.random.Generator) -> pd.DataFrame:
    return population.iloc[rng.integers(0, len(population), n)].reset_index(drop=True)


def test_healthy_digits_windows_are_clear_in_99_percent(make, window, digits):
    reference, population = digits
    profile = build_profile(reference, DIGITS_SCHEMA)
    rng = np.random.default_rng(5)
    baseline = window(make(5000, **served(population, 5000, rng)), DIGITS_SCHEMA, profile)
    sizes = [300] * 70 + [3000] * 25 + [20000] * 5
    breaching = [(n, b) for n in sizes if (b := input_breaches(make, window, served(population, n, rng),
                                                                 DIGITS_SCHEMA, profile, baseline))]
    assert len(breaching) <= len(sizes) // 100, breaching


def test_a_near_constant_pixel_turning_nonzero_inside_its_range_breaches(make, window, digits):
    """The pixel keeps within the reference's min..max, so only its histogram can show the change."""
    reference, population = digits
    profile = build_profile(reference, DIGITS_SCHEMA)
    rare = [c for c in PIXELS if 0.95 <= (reference[c] == 0).mean() < 1]
    assert rare
    rng = np.random.default_rng(11)
    for name in rare:
        frame = served(population, 1000, rng)
        nonzero = reference[name][reference[name] > 0].to_numpy()
        turned = rng.random(len(frame)) < 0.3
        frame.loc[turned, name] = rng.choice(nonzero, turned.sum())
        assert ("drift", name) in input_breaches(make, window, frame, DIGITS_SCHEMA, profile, None), name


def degenerate(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Columns of every degenerate kind, drawn from fixed distributions."""
    return {
        "constant": np.zeros(n),
        "one_in_300": np.where(rng.random(n) < 1 / 300, rng.integers(1, 17, n), 0).astype(float),
        "sparse": np.where(rng.random(n) < 0.03, rng.integers(1, 17, n), 0).astype(float),
        "levels": rng.choice(5, n, p=[0.6, 0.2, 0.1, 0.07, 0.03]).astype(float),
        "normal": rng.normal(5, 2, n),
    }


SYNTHETIC = Schema(features=dict.fromkeys(degenerate(1, np.random.default_rng(0)), "numeric"))


def _turn(values: np.ndarray, rng: np.random.Generator, share: float, to) -> np.ndarray:
    out = values.copy()
    hit = rng.random(len(out)) < share
    out[hit] = to(out[hit]) if callable(to) else to
    return out


# (field, shift within the reference's range or not): what a real change does to one column.
SHIFTS = [
    ("one_in_300", lambda v, rng: _turn(v, rng, 0.3, 1.0)),  # a rare pixel nonzero in 30% of rows
    ("sparse", lambda v, rng: _turn(v, rng, 0.3, lambda x: rng.integers(1, 9, len(x)).astype(float))),
    ("levels", lambda v, rng: np.where(v == 2, 3.0, v)),  # every level-2 row read as level 3
    ("levels", lambda v, rng: v * 2),
    ("normal", lambda v, rng: v * 2),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n", [300, 3000, 30000])
def test_synthetic_degenerate_columns_stay_clear_when_healthy(make, window, seed, n):
    rng = np.random.default_rng(seed)
    profile = build_profile(pd.DataFrame(degenerate(REFERENCE_ROWS, rng)), SYNTHETIC)
    baseline = window(make(5000, **degenerate(5000, rng)), SYNTHETIC, profile)
    assert input_breaches(make, window, pd.DataFrame(degenerate(n, rng)), SYNTHETIC, profile, baseline) == []


@pytest.mark.parametrize("seed", [0, 2])
@pytest.mark.parametrize(("field", "shift"), SHIFTS)
def test_a_real_shift_of_a_degenerate_column_breaches(make, window, field, shift, seed):
    rng = np.random.default_rng(seed)
    profile = build_profile(pd.DataFrame(degenerate(REFERENCE_ROWS, rng)), SYNTHETIC)
    frame = pd.DataFrame(degenerate(1000, rng))
    frame[field] = shift(frame[field].to_numpy(), rng)
    assert field in {f for _, f in input_breaches(make, window, frame, SYNTHETIC, profile, None)}


@pytest.mark.parametrize(("values", "edges"), [
    ([0.0] * 297 + [5.0, 9.0, 16.0], (0.0, 0.005)),  # an atom at 0 with a few values above: 0 alone
    ([0.0] * 300, (0.0,)),  # constant: nothing above to split from
    ([0.0] * 150 + [1.0] * 150, (0.0, 0.5, 1.0)),  # the quantiles already part the two values
    ([float(i) for i in range(300)], None),  # no atom: the plain deciles
])
def test_an_atom_of_the_reference_is_a_bin_of_its_own(values, edges):
    profile = build_profile(pd.DataFrame({"x": values}), Schema(features={"x": "numeric"}))
    ref = profile.fields["x"]
    if edges is None:
        assert ref.edges == tuple(np.quantile(values, np.linspace(0, 1, 11)[1:-1]))
    else:
        assert ref.edges == pytest.approx(edges)
    assert sum(ref.counts) == len(values)


@pytest.mark.parametrize("digits_logged", [4, 3, 2])
def test_class_scores_written_at_another_precision_than_the_reference_do_not_drift(make, window, digits_logged):
    """A classifier's probabilities for the classes it does not predict are tiny (1e-7 .. 1e-4): the
    reference keeps them at 6 decimals, the logs at `digits_logged`, where they read 0. The same model on
    the same inputs: its score histograms must not drift."""
    rng = np.random.default_rng(5)
    schema = Schema(features={}, classes=["a", "b", "c"])

    def scores(n: int, decimals: int) -> pd.DataFrame:
        z = rng.normal(0, 1, (n, 3)) * 6 + np.array([9.0, 0.0, 0.0])
        z[: n // 3] = z[: n // 3][:, [1, 0, 2]]  # a third of the rows predicted b
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        frame = pd.DataFrame({f"score_{c}": p[:, i].round(decimals) for i, c in enumerate("abc")})
        frame["prediction"] = np.array(list("abc"))[p.argmax(axis=1)]
        return frame

    reference = scores(600, 6)
    profile = build_profile(reference, schema)
    logged = scores(5000, digits_logged)
    w = window(make(len(logged), **{c: logged[c].to_numpy() for c in logged}), schema, profile)
    drifted = [(f.labels, f.value) for f in evaluate(w, profile, None, only=("prediction_drift",))
               if f.status == "breach"]
    assert drifted == []
    # A real change of the scores still drifts: class a's probabilities halved for every row.
    moved = logged.assign(score_a=(logged["score_a"] / 2).round(digits_logged))
    w = window(make(len(moved), **{c: moved[c].to_numpy() for c in moved}), schema, profile)
    assert any(f.status == "breach" and f.labels.get("output") == "score:a"
               for f in evaluate(w, profile, None, only=("prediction_drift",))), "a real shift must drift"
