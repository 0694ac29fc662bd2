"""Cross-check with Evidently 0.7 ValueDrift (methods `psi` and `jensenshannon`).

On the same bins the scores agree to 1e-9: tailwatch smooths empty bins exactly as Evidently's
get_binned_data does (1e-4, or a millionth of the smallest share) and both use the natural log. Fed the
raw numbers, Evidently bins on its own (Sturges bins over reference + current, not reference quantiles),
so the scores differ; there the test only asks that both tell drift from no drift at the 0.1 default.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

os.environ["DO_NOT_TRACK"] = "1"
from evidently import DataDefinition, Dataset, Report  # noqa: E402
from evidently.metrics import ValueDrift  # noqa: E402

from checks.drift import DriftThreshold, drift  # noqa: E402


def evidently_scores(reference: pd.DataFrame, current: pd.DataFrame, column: str, numeric: bool) -> dict:
    definition = (DataDefinition(numerical_columns=[column]) if numeric
                  else DataDefinition(categorical_columns=[column]))
    metrics = [ValueDrift(column=column, method=m) for m in ("psi", "jensenshannon")]
    snapshot = Report(metrics).run(Dataset.from_pandas(current[[column]], data_definition=definition),
                                   Dataset.from_pandas(reference[[column]], data_definition=definition))
    values = [m["value"] for m in snapshot.dict()["metrics"]]
    return {"psi": float(values[0]), "js": float(values[1])}


@pytest.fixture(scope="module")
def data():
    from monitor.aggregate.profile import build_profile
    from monitor.schema import Schema

    rng = np.random.default_rng(5)
    schema = Schema(features={"x": "numeric", "c": "categorical"})
    reference = pd.DataFrame({"x": rng.normal(0, 1, 5000), "c": rng.choice(list("abcde"), 5000)})
    currents = {
        "same": pd.DataFrame({"x": rng.normal(0, 1, 800), "c": rng.choice(list("abcde"), 800)}),
        "shifted": pd.DataFrame({"x": rng.normal(0.8, 1.3, 800),
                                 "c": rng.choice(list("abcdef"), 800, p=[0.5, 0.2, 0.1, 0.1, 0.05, 0.05])}),
    }
    return schema, reference, currents, build_profile(reference, schema)


@pytest.mark.parametrize("case", ["same", "shifted"])
def test_same_bins_agree_to_1e9(data, window, make, case):
    schema, reference, currents, profile = data
    current = currents[case]
    ours = {f.labels["field"]: f for f in
            drift(window(make(len(current), **current), schema, profile), profile, None, DriftThreshold())}
    # Numeric: both sides get tailwatch's bin of each value, as a category.
    binned = {name: pd.DataFrame({"bin": [f"b{i}" for i in profile.fields["x"].bin_index(frame["x"])]})
              for name, frame in (("ref", reference), ("cur", current))}
    theirs = evidently_scores(binned["ref"], binned["cur"], "bin", numeric=False)
    assert ours["x"].value == pytest.approx(theirs["psi"], abs=1e-9)
    assert ours["x"].effect == pytest.approx(theirs["js"], abs=1e-9)
    # Categorical: Evidently's own categories; tailwatch's are the reference's plus one `other` bin,
    # the same bins as long as at most one unseen value appears (here: `f`).
    theirs = evidently_scores(reference, current, "c", numeric=False)
    assert ours["c"].value == pytest.approx(theirs["psi"], abs=1e-9)
    assert ours["c"].effect == pytest.approx(theirs["js"], abs=1e-9)


def test_raw_numbers_agree_on_the_decision(data, window, make):
    schema, reference, currents, profile = data
    for case, drifted in (("same", False), ("shifted", True)):
        current = currents[case]
        [ours] = [f for f in drift(window(make(len(current), **current), schema, profile), profile, None,
                                   DriftThreshold()) if f.labels["field"] == "x"]
        theirs = evidently_scores(reference, current, "x", numeric=True)
        assert (ours.value >= 0.1) == (theirs["psi"] >= 0.1) == drifted
        assert (ours.effect >= 0.1) == (theirs["js"] >= 0.1) == drifted
