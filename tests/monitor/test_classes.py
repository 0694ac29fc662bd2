"""monitor.classes: one class name per class, whatever the spelling; the scalar and vectorized forms agree;
the config names its classes the same way."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor import config as config_mod
from monitor.classes import class_name, class_names
from monitor.config import ConfigError, Limits
from monitor.contract import RecordKind
from monitor.ingest.sources.batch import LINE
from monitor.ingest.validate import validate
from monitor.schema import Schema

# -- the function ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "name"), [
    (1, "1"), (1.0, "1"), ("1", "1"), ("1.0", "1"), (" 1e0 ", "1"), ("+1", "1"), (np.int64(1), "1"),
    (np.float64(1.0), "1"), (-0.0, "0"), ("0.0", "0"), (0.5, "0.5"), ("0.50", "0.5"), (np.float32(0.1), "0.1"),
    (2**70, "1180591620717411303424"), ("1180591620717411303424", "1180591620717411303424"),
    (float("inf"), "inf"), (True, "true"), (False, "false"), (np.bool_(True), "true"), ("True", "true"),
    ("TRUE", "true"), (" false ", "false"), (" Yes ", "Yes"), ("No", "No"), ("cat", "cat"),
    (None, None), (float("nan"), None), (np.nan, None), (pd.NA, None), ("", None), ("   ", None),
])
def test_class_name(value, name) -> None:
    assert class_name(value) == name


@pytest.mark.parametrize(("value", "classes", "name"), [
    (True, ["0", "1"], "1"), ("False", ["0", "1"], "0"), (1.0, ["0", "1"], "1"),
    (1, ["false", "true"], "true"), ("0.0", ["false", "true"], "false"), ("True", ["false", "true"], "true"),
    # Only a binary pair written the other way is an alias: in 0, 1, 2 (or Yes / No) true stays true.
    (True, ["0", "1", "2"], "true"), (1, ["No", "Yes"], "1"), (True, [], "true"), (1, [], "1"),
])
def test_booleans_and_zero_one_are_one_class_when_the_declared_classes_say_so(value, classes, name) -> None:
    assert class_name(value, classes) == name


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.0, 1.0, 0.5, np.nan, 2.25]),
                    st.sampled_from(["1", "1.0", " 0 ", "True", "false", "Yes", " no", "", "0.50"]))


@settings(deadline=None, max_examples=200)
@given(st.lists(_VALUES, max_size=30), st.sampled_from([(), ("0", "1"), ("false", "true")]))
def test_vectorized_names_each_value_as_the_scalar_function_does(values, classes) -> None:
    expected = [class_name(v, classes) for v in values]
    series = class_names(pd.Series(values, dtype=object, index=range(10, 10 + len(values))), classes)
    assert series.tolist() == expected and list(series.index) == list(range(10, 10 + len(values)))
    assert class_names(values, classes).tolist() == expected
    for typed in _typed_columns(values):  # one type per column: how a CSV or Parquet reader hands them over
        want = [class_name(v, classes) for v in typed]
        assert class_names(pd.Series(typed), classes).tolist() == want
        whole = pa.array(typed)
        arrow = pa.chunked_array([whole.slice(0, 3), whole.slice(3)]) if len(typed) > 3 else whole
        assert class_names(arrow, classes).to_pylist() == want
        assert class_names(pa.array(typed).dictionary_encode(), classes).to_pylist() == want


def _typed_columns(values: list) -> list[list]:
    out = []
    for kind in (bool, int, float, str):
        typed = [v for v in values if v is None or (type(v) is kind)]
        if typed and any(v is not None for v in typed):
            out.append(typed)
    return out


def test_arrow_text_already_named_is_handed_back_as_it_is() -> None:
    column = pa.chunked_array([pa.array(["Yes", "No", None]), pa.array(["No"])])
    assert class_names(column) is column
    assert class_names(pa.chunked_array([pa.array(["1.0", " Yes"])])).to_pylist() == ["1", "Yes"]


def test_config_names_classes_as_labels_are_named() -> None:
    s = Schema(classes=[0, 1], positive_class=True, score_columns={True: "p1"})
    assert (s.classes, s.positive_class, s.score_columns) == (["0", "1"], "1", {"1": "p1"})
    s = Schema(classes=["False", "True"], positive_class="true")
    assert (s.classes, s.positive_class, s.score_column("true")) == (["false", "true"], "true", "score_True")
    assert Schema.model_validate_json(s.model_dump_json()) == s  # the cached profile re-reads its schema
    with pytest.raises(ValueError, match="same class twice"):
        Schema(classes=[1, "1.0"])


def test_a_rule_names_a_declared_class_in_any_spelling(tmp_path: Path) -> None:
    raw = _raw(tmp_path, [False, True], [{"metric": "recall", "class": 1, "max_drop": 0.1}])
    cfg = config_mod.parse(raw, base_dir=tmp_path)
    assert cfg.services[0].quality.rules[0].class_ == "true"
    raw = _raw(tmp_path, [0, 1], [{"metric": "recall", "class": "Yes", "max_drop": 0.1}])
    with pytest.raises(ConfigError, match="not among schema.classes"):
        config_mod.parse(raw, base_dir=tmp_path)


def _raw(root: Path, classes: list, rules: list) -> dict:
    for d in ("predictions", "labels"):
        (root / d).mkdir(parents=True, exist_ok=True)
    return {"storage": {"url": "sqlite://"}, "services": [{
        "name": "svc", "schema": {"classes": classes},
        "sources": {"predictions": {"kind": "files", "path": str(root / "predictions")},
                    "labels": {"kind": "files", "path": str(root / "labels")}},
        "quality": {"rules": rules}}]}


@pytest.mark.parametrize("arrow", [False, True])
def test_validate_names_labels_and_predictions(arrow: bool) -> None:
    now = datetime(2026, 11, 2, tzinfo=UTC)
    schema = Schema(classes=["0", "1"])
    labels = pd.DataFrame({"request_id": ["a", "b", "c", "d"], "label": [" 1.0", "0", "", None], LINE: [1, 2, 3, 4]})
    preds = pd.DataFrame({"request_id": ["a", "b", "c"], "ts": ["2026-11-01T00:00:00Z"] * 3, "model_version": "v1",
                          "status": "ok", "prediction": [True, False, None], LINE: [1, 2, 3]})
    as_input = (lambda f: pa.Table.from_pandas(f, preserve_index=False)) if arrow else (lambda f: f)
    accepted, rejects = validate(RecordKind.labels, as_input(labels), "l", schema, Limits(), now)
    assert accepted["label"].tolist() == ["1", "0"]
    assert [(r.position, r.reason.value) for r in rejects] == [("l:3", "missing_field"), ("l:4", "missing_field")]
    accepted, rejects = validate(RecordKind.predictions, as_input(preds), "p", schema, Limits(), now)
    assert not rejects and [None if pd.isna(v) else v for v in accepted["prediction"]] == ["1", "0", None]


def test_a_label_that_is_a_list_is_wrong_type() -> None:
    frame = pd.DataFrame({"request_id": ["a", "b"], "label": pd.Series([[1], True], dtype=object), LINE: [1, 2]})
    accepted, rejects = validate(RecordKind.labels, frame, "l", Schema(), Limits(), datetime(2026, 11, 2, tzinfo=UTC))
    assert accepted["label"].tolist() == ["true"] and [r.reason.value for r in rejects] == ["wrong_type"]
