"""Real-data evaluation (docs/evaluation.md): serving logs built from UCI data sets shipped in River's wheel,
replayed with `tailwatch backfill` from a config written from the docs, judged against the ground truth.

`test_short_case` runs the short versions of both cases end to end and asserts the four criteria: the
slowdown's stage named, the quality change found from labels, no false alarm in the healthy range, every
finding with a value carrying n and an interval; and each fault's incident life as `bench/incidents.py`
scores it (onset, resolves, the verdict of its windows). `test_logs_*` check the harness itself."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from monitor.simulate import realdata, realscore

RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _read(folder) -> pd.DataFrame:
    return pd.concat([pd.read_json(p, lines=True, dtype=False) for p in sorted(folder.glob("*.jsonl"))],
                     ignore_index=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Four days of shuttle traffic with both faults, labels 30 days late (the full case's delay)."""
    case = realdata.shuttle_case(days=4, slowdown=(1, 2), quality=(2.5, 4), quality_windows=("7d",), name="tiny")
    out = tmp_path_factory.mktemp("tiny")
    return case, out, realdata.build(case, out)


def test_logs_follow_the_contract_and_the_data(tiny):
    case, out, truth = tiny
    preds = _read(out / "logs" / "predictions")
    timings = _read(out / "logs" / "timings")
    labels = _read(out / "logs" / "labels")
    assert len(preds) == truth["predictions"] and preds["request_id"].is_unique
    assert 4 * 165 * 0.85 < len(preds) < 4 * 165 * 1.15
    assert preds["ts"].map(RFC3339_MS.match).all() and labels["label_ts"].map(RFC3339_MS.match).all()
    assert pd.to_datetime(preds["ts"]).is_monotonic_increasing
    assert set(preds["status"]) <= {"ok", "timeout", "error"}
    failed = preds[preds["status"] != "ok"]
    assert failed["prediction"].isna().all() and preds.loc[preds["status"] == "ok", "prediction"].notna().all()
    # Feature values are rows of the data set, as served.
    data, features, _ = realdata.load("shuttle")
    known = set(map(tuple, data[features].to_numpy().tolist()))
    assert set(map(tuple, preds[features].to_numpy().tolist())) <= known
    # Timings: no start_ts, one row per stage reached, joined by request id only.
    assert list(timings.columns) == ["request_id", "stage", "duration_ms"]
    assert set(timings["request_id"]) == set(preds["request_id"])
    assert set(timings["stage"]) == set(realdata.STAGES)
    # Labels 30 days (plus up to 6 hours) after their prediction, for most requests.
    joined = labels.merge(preds[["request_id", "ts"]], on="request_id")
    delay = pd.to_datetime(joined["label_ts"]) - pd.to_datetime(joined["ts"])
    assert len(joined) == len(labels) and 0.9 * len(preds) < len(labels) < len(preds)
    assert delay.min() >= timedelta(days=30) and delay.max() <= timedelta(days=30, hours=6)
    assert pd.to_datetime(labels["label_ts"]).is_monotonic_increasing


def test_faults_and_ground_truth(tiny):
    case, out, truth = tiny
    preds = _read(out / "logs" / "predictions").set_index("request_id")
    timings = _read(out / "logs" / "timings")
    ts = pd.to_datetime(preds["ts"])
    slow, quality = truth["faults"]
    assert (slow["kind"], slow["stage"], quality["kind"]) == ("slowdown", "model", "quality")
    model = timings[(timings["stage"] == "model")].set_index("request_id")["duration_ms"]
    ok = preds["status"] == "ok"
    during = ok & (ts >= pd.Timestamp(slow["onset"])) & (ts < pd.Timestamp(slow["end"]))
    before = ok & (ts < pd.Timestamp(slow["onset"]))
    ratio = model[during[during].index].median() / model[before[before].index].median()
    assert 3 < ratio < 5  # the model stage 4x, the others unchanged
    parse = timings[timings["stage"] == "parse"].set_index("request_id")["duration_ms"]
    assert 0.7 < parse[during[during].index].median() / parse[before[before].index].median() < 1.4
    versions = preds.groupby(ts >= pd.Timestamp(quality["onset"]))["model_version"].unique()
    assert list(versions[False]) == ["shuttle-rf-1"] and list(versions[True]) == ["shuttle-rf-2"]
    assert truth["healthy"] == [truth["start"], slow["onset"]]
    reference = pd.read_parquet(out / "reference.parquet")
    assert {"label", "prediction", "score_0", "score_1"} <= set(reference.columns) and len(reference) == 3000
    config = (out / "tailwatch.yaml").read_text()
    assert "quality:" in config and "max_drop" in config and "start_ts" not in config
    assert json.loads((out / "truth.json").read_text()) == truth
    # Deterministic: the same case builds the same bytes.
    again = out.parent / "again"
    realdata.build(case, again)
    for kind in ("predictions", "timings", "labels"):
        for path in sorted((out / "logs" / kind).iterdir()):
            assert path.read_bytes() == (again / "logs" / kind / path.name).read_bytes(), path


@pytest.mark.slow  # about a minute per case: a backfill of 24 hourly or 33 daily steps
@pytest.mark.parametrize("case", realdata.short_cases(), ids=lambda c: c.name)
def test_short_case(case, tmp_path):
    truth = realdata.build(case, tmp_path)
    assert datetime.fromisoformat(truth["end"]) > datetime.fromisoformat(truth["start"])
    realscore.run(tmp_path)
    result = realscore.score(tmp_path)
    assert [c.name for c in result.criteria] == [
        "slowdown stage named", "quality change found from labels", "no false alarm in the healthy range",
        "every finding with a value has n and an interval"]
    assert result.passed, "\n" + realscore.table([result])
    bench = _bench_incidents()
    incidents, verdicts = _stored(tmp_path)
    for name, t, s, window in bench.realdata_scores(case, truth, incidents, verdicts):
        assert bench.misses(t, s, window) == [], (bench.row(name, "live", t, s, window),
                                                  [bench.describe(i) for i in incidents])


def _bench_incidents():
    """bench/incidents.py as a module (its scoring of an incident's life)."""
    if "bench_incidents" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "bench_incidents", Path(__file__).resolve().parents[2] / "bench" / "incidents.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["bench_incidents"]


def _stored(out) -> tuple[list[dict], list[dict]]:
    """The incidents and verdicts a run stored."""
    import yaml

    from storage.store import Store

    service = yaml.safe_load((out / "tailwatch.yaml").read_text())["services"][0]["name"]
    store = Store(f"sqlite:///{out / 'tailwatch.db'}")
    try:
        with store.transaction() as session:
            return store.incidents.load(session, service), store.verdicts.load(session, service)
    finally:
        store.dispose()
