"""A config that matches nothing is a warning, not silence: a quality group, class, segment or acceptance
rule that no reference row (or no sampled log row) holds is named with the values its columns hold, and a
categorical value the logs spell otherwise than the reference is named with both spellings. On the
`fair` data set bundled with statsmodels, whose `occupation` holds floats 1.0 .. 6.0."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from monitor import config as config_mod
from monitor.cli import app

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
START = NOW - timedelta(hours=2)
FLOATS = "occupation holds 1.0, 2.0, 3.0, 4.0, 5.0, 6.0 (floats)"


@pytest.fixture(scope="module")
def fair() -> pd.DataFrame:
    sm = pytest.importorskip("statsmodels.datasets.fair")
    data = sm.load_pandas().data
    return data.assign(label=(data["affairs"] > 0).astype(int), plan=["Gold", "Silver"] * (len(data) // 2))


def _service(tmp_path, reference: pd.DataFrame, groups: dict, classes=("0", "1"), rules=(), segments=()):
    (tmp_path / "p").mkdir(exist_ok=True)
    (tmp_path / "l").mkdir(exist_ok=True)
    reference.to_parquet(tmp_path / "reference.parquet", index=False)
    raw = {"storage": {"url": f"sqlite:///{tmp_path / 'tw.db'}"},
           "services": [{"name": "fair",
                         "sources": {"predictions": {"kind": "files", "path": str(tmp_path / "p")},
                                     "labels": {"kind": "files", "path": str(tmp_path / "l")}},
                         "schema": {"features": {"occupation": "numeric", "age": "numeric", "plan": "categorical"},
                                    "segments": list(segments), "classes": list(classes)},
                         "reference": {"path": str(tmp_path / "reference.parquet")},
                         "quality": {"groups": groups, "rules": list(rules)}}]}
    (tmp_path / "tw.yaml").write_text(yaml.safe_dump(raw))
    return config_mod.parse(raw)


@pytest.mark.parametrize(("expression", "warning"), [
    ("occupation == '2'", f"group g (occupation == '2') matches no row of the reference; {FLOATS}"),
    ("occupation == 2", None),
    ("occupation > 6", f"group g (occupation > 6) matches no row of the reference; {FLOATS}"),
    ("age < 10 and occupation == 2",
     f"group g (age < 10 and occupation == 2) matches no row of the reference; age holds 17.5, 22.0, 27.0, 32.0, "
     f"37.0, 42.0 (floats); {FLOATS}"),
    ("plan == 'Gold'", None),
    ("plan == 'gold'", "group g (plan == 'gold') matches no row of the reference; plan holds Gold, Silver (text)"),
])
def test_a_group_that_matches_no_reference_row_is_named_with_the_values_held(tmp_path, fair, expression, warning):
    from monitor.ingest.labels import unmatched

    service = _service(tmp_path, fair, {"g": expression}).services[0]
    assert unmatched(fair, service, "the reference") == ([warning] if warning else [])


@pytest.mark.parametrize(("classes", "rules", "segments", "warnings"), [
    (["0", "1", "2"], [], [], ["class 2 matches no label of the reference; label holds 0, 1 (integers)"]),
    (["0", "1"], [{"metric": "recall", "class": "1", "group": "religious=9", "max_drop": 0.05}], ["religious"],
     ["rule recall: group religious=9 matches no row of the reference (groups: all, religious=1.0, religious=2.0, "
      "religious=3.0, religious=4.0)"]),
    (["0", "1"], [{"name": "kids", "metric": "recall", "class": "1", "group": "all", "max_drop": 0.05}],
     ["children_seg"], ["segment children_seg matches no row of the reference: no column children_seg"]),
])
def test_classes_rules_and_segments_that_match_nothing(tmp_path, fair, classes, rules, segments, warnings):
    from monitor.ingest.labels import unmatched

    service = _service(tmp_path, fair, {}, classes, rules, segments).services[0]
    assert unmatched(fair, service, "the reference") == warnings


def _logs(tmp_path, fair: pd.DataFrame, n: int = 200) -> None:
    rows = [{"request_id": f"r{i}", "ts": (START + timedelta(seconds=i)).isoformat(), "model_version": "v1",
             "status": "ok", "occupation": float(r.occupation), "age": float(r.age), "plan": r.plan.lower()}
            for i, r in enumerate(fair.head(n).itertuples())]
    (tmp_path / "p" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _run(tmp_path, monkeypatch, *args: str):
    monkeypatch.chdir(tmp_path)
    return CliRunner().invoke(app, ["--config", "tw.yaml", *args], catch_exceptions=False, env={"COLUMNS": "200"})


def test_reference_build_and_check_logs_warn(tmp_path, fair, monkeypatch):
    _service(tmp_path, fair, {"clerical": "occupation == '2'", "professional": "occupation == 5"})
    _logs(tmp_path, fair)
    assert _run(tmp_path, monkeypatch, "db", "upgrade").exit_code == 0
    built = _run(tmp_path, monkeypatch, "reference", "build", "--format", "json")
    assert built.exit_code == 0, built.output
    [record] = json.loads(built.stdout)
    assert record["warnings"] == [
        f"group clerical (occupation == '2') matches no row of the reference; {FLOATS}",
        "field plan: reference has 'Gold', logs have 'gold' (list plan under schema.fold_case to read them as one)",
        "field plan: reference has 'Silver', logs have 'silver' (list plan under schema.fold_case to read them as one)",
    ]
    table = _run(tmp_path, monkeypatch, "reference", "build")
    assert "warning: service fair: group clerical (occupation == '2') matches no row" in table.stderr
    checked = _run(tmp_path, monkeypatch, "check-logs", "--now", NOW.isoformat(), "--format", "json")
    predictions = next(s for s in json.loads(checked.stdout) if s["source"] == "predictions")
    # The sample is judged on its own values: 200 rows, the occupations they hold.
    held = sorted(fair.head(200)["occupation"].unique())
    assert predictions["warnings"] == [
        "field plan: reference has 'Gold', logs have 'gold' (list plan under schema.fold_case to read them as one)",
        "field plan: reference has 'Silver', logs have 'silver' (list plan under schema.fold_case to read them as one)",
        "group clerical (occupation == '2') matches no row of the logs' first 200 rows; occupation holds "
        + ", ".join(str(v) for v in held) + " (floats)",
    ]
    table = _run(tmp_path, monkeypatch, "check-logs", "--now", NOW.isoformat())
    assert "warning: group clerical (occupation == '2') matches no row of the logs' first 200 rows" in table.stdout


def test_the_first_tick_warns_about_a_group_the_reference_does_not_hold(tmp_path, fair):
    from monitor.daemon.runner import tick
    from storage.store import Store

    cfg = _service(tmp_path, fair, {"clerical": "occupation == '2'"})
    _logs(tmp_path, fair)
    store = Store(cfg.storage.url)
    store.upgrade()
    try:
        [first] = tick(cfg, store, NOW)
        [second] = tick(cfg, store, NOW)
    finally:
        store.dispose()
    assert first.status == "ok", first.error
    assert f"group clerical (occupation == '2') matches no row of the reference; {FLOATS}" in first.warnings
    assert not any("clerical" in w for w in second.warnings)  # said once, when the profile is built
