"""The config is cross-checked when it loads and in `check-logs`: a name one section uses that no other
declares is an error naming the nearest existing one; a column read twice (by a mapping and as a schema
field, or listed twice) is an error; a labels source nothing reads is a warning; quality on logs without a
prediction or score column and a SQL cursor column are reported by `check-logs`.

The logs are the Fair affairs survey bundled with statsmodels (6,366 answers; `occupation` coded 1-6,
ages and years married as floats), served by a model that predicts whether a person had an affair.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa
import statsmodels.api as sm
import yaml
from typer.testing import CliRunner

from monitor import config as config_mod
from monitor.cli import app

START = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
FAIR = sm.datasets.fair.load_pandas().data.head(300)


def logs(root: Path, prediction: bool = True) -> None:
    """Predictions (the survey's answers as features) and labels (whether the person had an affair)."""
    (root / "preds").mkdir(exist_ok=True)
    (root / "labels").mkdir(exist_ok=True)
    had = np.where(FAIR["affairs"] > 0, "affair", "none")
    rows = []
    for i, r in enumerate(FAIR.itertuples()):
        row = {"request_id": f"fair-{i}", "ts": (START + timedelta(seconds=30 * i)).isoformat(),
               "model_version": "fair-v1", "status": "ok", "age": r.age, "yrs_married": r.yrs_married,
               "occupation": int(r.occupation)}
        if prediction:
            row["predicted"] = "affair" if r.rate_marriage < 4 else "none"
        rows.append(row)
    (root / "preds" / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "labels" / "l.jsonl").write_text("".join(
        json.dumps({"request_id": f"fair-{i}", "label": h}) + "\n" for i, h in enumerate(had)))


def base_config(root: Path) -> dict:
    return {"storage": {"url": f"sqlite:///{root / 'tw.db'}"},
            "services": [{"name": "fair",
                          "sources": {"predictions": {"kind": "files", "path": str(root / "preds"),
                                                      "columns": {"prediction": "predicted"}},
                                      "labels": {"kind": "files", "path": str(root / "labels")}},
                          "schema": {"features": {"age": "numeric", "yrs_married": "numeric",
                                                  "occupation": "categorical"},
                                     "segments": ["occupation"], "classes": ["none", "affair"],
                                     "positive_class": "affair"},
                          "quality": {"groups": {"young_wives": "age < 25"},
                                      "rules": [{"metric": "recall", "class": "affair", "group": "young_wives",
                                                 "min": 0.5}]}}]}


def rule(**fields):
    def change(svc):
        svc["quality"]["rules"][0] |= fields
    return change


def schema(**fields):
    def change(svc):
        svc["schema"] |= fields
    return change


def features(**fields):
    def change(svc):
        svc["schema"]["features"] |= fields
    return change


# (what is changed in the service's config, what the error says)
ERRORS = [
    (rule(group="young_wive"), "quality.rules[0].group: 'young_wive' is not a group; did you mean 'young_wives'?"),
    (rule(group="young_wive"), "the rule would never be decided"),
    (rule(group="occupaton=2"), "'occupaton' is not a segment; did you mean 'occupation'?"),
    (rule(metric="recal"), "did you mean 'recall'?"),
    (rule(**{"class": "afair"}), "classes ['afair'] are not among schema.classes ['none', 'affair']; did you mean "
                                 "'affair'?"),
    (features(predicted="categorical"),
     "sources.predictions.columns: column 'predicted' is read as prediction and is also declared as schema feature "
     "'predicted'"),
    (schema(segments=["occupation", "occupation"]), "schema.segments: occupation listed twice"),
    (schema(signals=["yrs_married", "yrs_married"]), "schema.signals: yrs_married listed twice"),
    (schema(segments=["occupation", "age"]), "age is a segment (split by its values as text) and a numeric feature"),
    (schema(signals=["occupation"]), "occupation is a signal (a number) and a categorical feature"),
]


@pytest.mark.parametrize("change, message", ERRORS)
def test_a_config_naming_what_no_section_declares_or_reading_a_column_twice_is_an_error(change, message, tmp_path):
    logs(tmp_path)
    raw = base_config(tmp_path)
    config_mod.parse(copy.deepcopy(raw))  # as written it loads
    change(raw["services"][0])
    with pytest.raises(config_mod.ConfigError) as err:
        config_mod.parse(raw)
    text = str(err.value)
    assert message in text
    assert all(line.startswith("services[0]") for line in text.splitlines())


@pytest.mark.parametrize("group", ["all", "*", "young_wives", "occupation=2", "occupation=9"])
def test_groups_the_config_defines_are_accepted(group, tmp_path):
    """A segment's value is known only from the data: `check-logs` and `reference build` say when none
    matches; the config cannot."""
    logs(tmp_path)
    raw = base_config(tmp_path)
    raw["services"][0]["quality"]["rules"][0]["group"] = group
    assert config_mod.parse(raw).services[0].quality.rules[0].group == group


def test_a_length_bucket_group_is_known(tmp_path):
    logs(tmp_path)
    raw = base_config(tmp_path)
    svc = raw["services"][0]
    svc["schema"]["features"]["notes"] = "text"
    svc["quality"]["length_buckets"] = {"notes": [40, 200]}
    for group in ("notes_length<40", "40<=notes_length<200", "notes_length>=200"):
        svc["quality"]["rules"][0]["group"] = group
        config_mod.parse(copy.deepcopy(raw))
    svc["quality"]["rules"][0]["group"] = "notes_length<50"
    with pytest.raises(config_mod.ConfigError, match="did you mean 'notes_length<40'"):
        config_mod.parse(raw)


def test_a_key_written_twice_in_the_file_is_an_error_naming_both_lines(tmp_path):
    logs(tmp_path)
    text = yaml.safe_dump(base_config(tmp_path), sort_keys=False).replace(
        "      age: numeric\n", "      age: numeric\n      yrs_married: categorical\n", 1)
    path = tmp_path / "tailwatch.yaml"
    path.write_text(text)
    assert yaml.safe_load(text)["services"][0]["schema"]["features"]["yrs_married"] == "numeric"  # YAML's own
    with pytest.raises(config_mod.ConfigError) as err:
        config_mod.load(path)
    first = text.splitlines().index("      yrs_married: categorical") + 1
    assert "key 'yrs_married' is written twice in one mapping" in str(err.value)
    assert f"(lines {first} and {first + 1})" in str(err.value)


def test_a_labels_source_without_a_quality_section_is_a_warning(tmp_path, monkeypatch):
    logs(tmp_path)
    raw = base_config(tmp_path)
    del raw["services"][0]["quality"]
    cfg = config_mod.parse(raw)
    [warning] = cfg.warnings()
    assert warning.startswith("services[0] (fair): sources.labels is configured but never read")
    (tmp_path / "tailwatch.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["check-logs"], env={"COLUMNS": "200"})
    assert "sources.labels is configured but never read" in " ".join(result.output.split())
    assert config_mod.parse(base_config(tmp_path)).warnings() == []


def check_logs(raw: dict, root: Path, monkeypatch) -> tuple[int, str]:
    (root / "tailwatch.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(root)
    result = CliRunner().invoke(app, ["check-logs"], env={"COLUMNS": "200"})
    return result.exit_code, " ".join(result.output.split())


def test_quality_on_logs_without_a_prediction_or_score_column_is_an_error_of_check_logs(tmp_path, monkeypatch):
    logs(tmp_path, prediction=False)
    code, text = check_logs(base_config(tmp_path), tmp_path, monkeypatch)
    assert code == 1
    assert ("error: quality: the logs hold no prediction (column predicted) and no score column "
            "(score_none, score_affair) in 300 rows") in text
    logs(tmp_path, prediction=True)
    code, text = check_logs(base_config(tmp_path), tmp_path, monkeypatch)
    assert code == 0 and "error:" not in text, text


def test_the_cursor_of_a_sql_source_is_not_an_unread_column(tmp_path, monkeypatch):
    logs(tmp_path)
    url = f"sqlite:///{tmp_path / 'serving.db'}"
    rows = pd.read_json(tmp_path / "preds" / "p.jsonl", lines=True).assign(row_id=np.arange(len(FAIR)) + 1)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        rows.assign(ts=rows["ts"].astype(str)).to_sql("predictions", conn, index=False)
    engine.dispose()
    raw = base_config(tmp_path)
    raw["services"][0]["sources"]["predictions"] = {"kind": "sql", "url": url, "table": "predictions",
                                                    "cursor_column": "row_id", "columns": {"prediction": "predicted"}}
    code, text = check_logs(raw, tmp_path, monkeypatch)
    assert code == 0, text
    assert "row_id: the cursor column" in text
    assert "columns no field is read from" not in text


def test_metrics_groups_name_groups_a_quality_section_scores(tmp_path):
    from monitor.config.crosscheck import metrics_errors

    logs(tmp_path)
    raw = base_config(tmp_path)
    raw["services"][0]["schema"]["features"]["notes"] = "text"
    raw["services"][0]["quality"]["length_buckets"] = {"notes": [40]}
    services = config_mod.parse(raw).services
    assert metrics_errors(["all", "young_wives", "occupation=2", "notes_length>=40"], services) == []
    [group, segment, star] = metrics_errors(["young_wive", "occupaton=2", "*"], services)
    assert group.startswith("metrics.groups[0]: 'young_wive' is not a quality group; did you mean 'young_wives'?")
    assert "its series would never be exported" in group
    assert segment == ("metrics.groups[1]: 'occupaton=2': 'occupaton' is not a segment of a service with a "
                       "quality section; did you mean 'occupation'? (segments: occupation)")
    assert star.startswith("metrics.groups[2]: '*' is not a quality group")  # a rule's wildcard, not a group
    del raw["services"][0]["quality"], raw["services"][0]["sources"]["labels"]
    assert metrics_errors(["all"], config_mod.parse(raw).services) == [
        "metrics.groups[0]: 'all': no service has a `quality:` section, so no group is scored"]


def test_the_length_buckets_quality_scores_are_the_groups_the_config_knows(tmp_path):
    from monitor.config.crosscheck import length_buckets, length_groups
    from monitor.ingest.labels import groups

    logs(tmp_path)
    raw = base_config(tmp_path)
    raw["services"][0]["schema"]["features"]["notes"] = "text"
    raw["services"][0]["quality"]["length_buckets"] = {"notes": [40, 200.5]}
    service = config_mod.parse(raw).services[0]
    buckets = length_buckets("notes", [40, 200.5])
    assert [name for name, _, _ in buckets] == length_groups("notes", [40, 200.5]) == [
        "notes_length<40", "40<=notes_length<200.5", "notes_length>=200.5"]
    lengths = np.array([0, 39, 40, 200, 200.5, 1e6, np.nan])
    masks = groups(pd.DataFrame({"notes_length": lengths, "age": 30.0, "occupation": "2"}), service)
    assert [g for g in masks if g.startswith(("notes", "40"))] == [name for name, _, _ in buckets]
    for name, lo, hi in buckets:
        assert masks[name].tolist() == [bool(lo <= x < hi) for x in lengths], name


def test_a_metrics_group_no_quality_section_scores_is_a_config_error(tmp_path):
    logs(tmp_path)
    raw = base_config(tmp_path)
    raw["metrics"] = {"groups": ["all", "young_wives", "occupation=3"]}
    assert config_mod.parse(copy.deepcopy(raw)).metrics.groups == ["all", "young_wives", "occupation=3"]
    raw["metrics"]["groups"].append("young_wive")
    with pytest.raises(config_mod.ConfigError) as err:
        config_mod.parse(raw)
    assert str(err.value).startswith("config: metrics.groups[3]: 'young_wive' is not a quality group; "
                                     "did you mean 'young_wives'?")
