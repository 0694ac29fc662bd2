"""Real-data evaluation (docs/evaluation.md): serving logs built from UCI data sets shipped in River's wheel,
replayed with `tailwatch backfill` from a config written from the docs, judged against the ground truth.

`test_short_case` runs the short versions of both cases end to end and asserts the four criteria: the
slowdown's stage named, the quality change found from labels, no false alarm in the healthy range, every
finding with a value carrying n and an interval; and each fault's incident life as `bench/incidents.py`
scores it (onset, resolves, the verdict of its windows). The other tests check the harness itself, for
River's cases and for the Digits and Fair cases of monitor/simulate/realcases.py."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
import yaml

from monitor.simulate import realcases, realdata, realscore

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
    incidents, verdicts = realscore.stored(tmp_path)
    for name, t, s, window in bench.realdata_scores(case, truth, incidents, verdicts):
        assert bench.misses(t, s, window) == [], (bench.row(name, "live", t, s, window),
                                                  [bench.describe(i) for i in incidents])


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """A day of Digits traffic with the timeouts, the hotspot and the int8 version."""
    case = realcases.digits_case(days=1, per_hour=600, timeouts=(0.2, 0.4), hotspot=(0.45, 0.65),
                                 int8=(0.7, 0.95), name="tiny-digits")
    out = tmp_path_factory.mktemp("digits")
    return case, out, realcases.build_case(case, out)


@pytest.fixture(scope="module")
def fair(tmp_path_factory):
    case = realcases.fair_case(days=3, broken=(1, 2.5), name="tiny-fair")
    out = tmp_path_factory.mktemp("fair")
    return case, out, realcases.build_case(case, out)


def _between(preds: pd.DataFrame, fault: dict) -> pd.Series:
    ts = pd.to_datetime(preds["ts"])
    return (ts >= pd.Timestamp(fault["onset"])) & (ts < pd.Timestamp(fault["end"]))


def test_digits_logs_follow_the_contract(digits):
    case, out, truth = digits
    preds = _read(out / "logs" / "predictions")
    timings = _read(out / "logs" / "timings").pivot(index="request_id", columns="stage", values="duration_ms")
    assert len(preds) == truth["predictions"] and preds["request_id"].is_unique
    assert preds["ts"].map(RFC3339_MS.match).all() and set(preds["replica"]) == set(case.replicas)
    data, features, _ = realcases.load("digits")
    assert set(map(tuple, preds[features].to_numpy().tolist())) <= set(map(tuple, data[features].to_numpy().tolist()))
    timeout = preds[preds["status"] == "timeout"]
    ok = preds[preds["status"] == "ok"]
    # A timed-out request is logged at the deadline with no prediction, its timings stopping at the model.
    assert (timeout["latency_ms"] == 250.0).all() and timeout["prediction"].isna().all()
    assert timings.loc[timeout["request_id"], "postprocess"].isna().all()
    assert timings.loc[timeout["request_id"], "model"].notna().all()
    assert (ok["latency_ms"] < 250.0).all() and ok["prediction"].notna().all()
    reference = pd.read_parquet(out / "reference.parquet")
    assert len(reference) == 300 and {"label", "prediction", "score_0", "score_9"} <= set(reference.columns)


def test_digits_faults_and_truth(digits):
    case, out, truth = digits
    preds = _read(out / "logs" / "predictions")
    timings = _read(out / "logs" / "timings").pivot(index="request_id", columns="stage", values="duration_ms")
    timeouts, hotspot, int8 = truth["faults"]
    assert [f["kind"] for f in truth["faults"]] == ["timeouts", "hotspot", "quality"]
    assert [f["expected"][0] for f in truth["faults"]] == ["slower", "slower", "worse"]
    before = pd.to_datetime(preds["ts"]) < pd.Timestamp(timeouts["onset"])
    ok = preds["status"] == "ok"
    # Timeouts: 6% more requests hit the deadline, successful latency stays where it was.
    during = _between(preds, timeouts)
    assert 0.05 < (preds.loc[during, "status"] == "timeout").mean() < 0.09
    assert (preds.loc[before, "status"] == "timeout").mean() < 0.015
    assert 0.9 < preds.loc[during & ok, "latency_ms"].median() / preds.loc[before & ok, "latency_ms"].median() < 1.1
    # Hotspot: api-2 takes 40% of traffic (25% before) and its model stage is 4x the other replicas'.
    hot = _between(preds, hotspot)
    assert 0.35 < (preds.loc[hot, "replica"] == "api-2").mean() < 0.45
    assert 0.2 < (preds.loc[before, "replica"] == "api-2").mean() < 0.3
    model = timings["model"].reindex(preds["request_id"]).to_numpy()
    on_api2 = (preds["replica"] == "api-2").to_numpy()
    assert 3 < pd.Series(model[hot & ok & on_api2]).median() / pd.Series(model[hot & ok & ~on_api2]).median() < 5
    # The int8 version serves only while it is deployed, a little faster and measurably less accurate.
    quant = _between(preds, int8)
    assert set(preds.loc[quant, "model_version"]) == {"digits-int8"}
    assert set(preds.loc[~quant, "model_version"]) == {"digits-mlp-1"}
    assert pd.Series(model[quant & ok]).median() < 0.9 * pd.Series(model[before & ok]).median()
    accepted, quantized = truth["quality"]["digits-mlp-1"]["accuracy"], truth["quality"]["digits-int8"]["accuracy"]
    assert 0.94 < accepted and 0.01 < accepted - quantized < 0.04
    _same_bytes(case, out)


def test_fair_group_drop_hidden_in_the_overall_figure(fair):
    case, out, truth = fair
    preds = _read(out / "logs" / "predictions")
    (fault,) = truth["faults"]
    broken = _between(preds, fault)
    assert set(preds.loc[broken, "model_version"]) == {"fair-gb-2"} and fault["expected"][0] == "worse"
    # The logs keep the raw requests: managerial requests still say how they rate their marriage.
    managerial = preds["occupation"] == 5
    assert 0.09 < managerial.mean() < 0.15 and preds.loc[broken & managerial, "rate_marriage"].nunique() > 2
    q = truth["quality"]
    assert q["fair-gb-1"]["accuracy"] - q["fair-gb-2"]["accuracy"] < 0.03  # within the overall rule's tolerance
    assert q["fair-gb-1/managerial"]["recall_1"] - q["fair-gb-2/managerial"]["recall_1"] > 0.25
    assert abs(q["fair-gb-1/white_collar"]["recall_1"] - q["fair-gb-2/white_collar"]["recall_1"]) < 0.05
    service = yaml.safe_load((out / "tailwatch.yaml").read_text())["services"][0]
    assert service["quality"]["groups"]["managerial"] == "occupation == 5"
    assert service["schema"]["features"]["occupation"] == "categorical"
    assert {"name": "recall by occupation", "metric": "recall", "class": "1", "group": "*", "max_drop": 0.1} \
        in service["quality"]["rules"]
    _same_bytes(case, out)


def _same_bytes(case, out) -> None:
    """The same case builds the same bytes."""
    again = out.parent / f"{out.name}-again"
    realcases.build_case(case, again)
    for kind in ("predictions", "timings", "labels"):
        for path in sorted((out / "logs" / kind).iterdir()):
            assert path.read_bytes() == (again / "logs" / kind / path.name).read_bytes(), path
    assert (out / "truth.json").read_bytes() == (again / "truth.json").read_bytes()


def _bench_incidents():
    """bench/incidents.py as a module (its scoring of an incident's life)."""
    if "bench_incidents" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "bench_incidents", Path(__file__).resolve().parents[2] / "bench" / "incidents.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["bench_incidents"]
