"""`query logs` against a direct pandas computation over the generated files, and `compare` of the two
versions of the slower-cache run."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest

from monitor.aggregate.profile import stored_profile
from monitor.investigate.compare import compare
from monitor.investigate.logs import drill
from storage.store import Store


def generated(run, kind: str) -> pd.DataFrame:
    frames = [pd.read_json(p, lines=True, dtype=False, convert_dates=False)
              for p in sorted((run["root"] / "generated" / kind).glob("*.jsonl"))]
    return pd.concat(frames, ignore_index=True)


def test_slowest_batch_wait_requests_match_pandas(scenario_run):
    cfg, truth = scenario_run["config"], scenario_run["truth"]
    since = pd.Timestamp(truth.onset).to_pydatetime()
    until = since + timedelta(minutes=45)
    result = drill(cfg.services[0], cfg.limits, since=since, until=until, stage="batch_wait", min_ms=8, top=20)

    preds = generated(scenario_run, "predictions")
    preds["ts"] = pd.to_datetime(preds["ts"], utc=True, format="ISO8601")
    preds = preds[(preds["ts"] >= since) & (preds["ts"] < until)]
    timings = generated(scenario_run, "timings")
    waits = timings[(timings["stage"] == "batch_wait") & (timings["duration_ms"] >= 8)]
    expected = preds.merge(waits, on="request_id").sort_values(["duration_ms", "request_id"],
                                                               ascending=[False, True])
    assert result.scanned == len(preds) and result.matched == len(expected) > 20
    assert result.requests["request_id"].tolist() == expected["request_id"].head(20).tolist()
    assert result.requests["batch_wait_ms"].tolist() == pytest.approx(expected["duration_ms"].head(20).tolist())
    # Ids and aggregates only: no feature value unless asked for.
    assert not {"tenure", "MonthlyCharges", "notes", "InternetService"} & set(result.requests.columns)
    replicas = result.aggregates[result.aggregates["dimension"] == "replica"]
    assert replicas["requests"].sum() == result.matched
    share = expected["replica"].value_counts(normalize=True)
    for _, row in replicas.iterrows():
        assert row["share"] == pytest.approx(share[row["value"]])

    with_features = drill(cfg.services[0], cfg.limits, since=since, until=until, top=5, features=True)
    assert {"tenure", "MonthlyCharges", "notes"} <= set(with_features.requests.columns)
    slowest = preds.sort_values(["latency_ms", "request_id"], ascending=[False, True]).head(5)
    assert with_features.requests["request_id"].tolist() == slowest["request_id"].tolist()


def test_compare_two_versions_marks_constraints(scenario_run):
    cfg, truth = scenario_run["config"], scenario_run["truth"]
    service = cfg.services[0]
    store = Store(cfg.storage.url)
    try:
        profile, _ = stored_profile(store, service)
        start, end = pd.Timestamp(truth.start).to_pydatetime(), pd.Timestamp(truth.end).to_pydatetime()
        result = compare(store, service, "v1", "v2", start, end, profile)
    finally:
        store.dispose()
    table = result.table.set_index("metric")
    preds = generated(scenario_run, "predictions")
    for version, col in (("v1", "baseline"), ("v2", "candidate")):
        rows = preds[preds["model_version"] == version]
        assert table.loc["requests", col] == len(rows)
        assert table.loc["cache_hit_rate", col] == pytest.approx(rows["cache_hit"].astype(bool).mean())
        ok = (rows["status"] == "ok").sum()
        hours = table.loc["serving_hours", col]
        assert hours == pytest.approx(1.0)  # each version served one of the two hours
        price = service.compare.price(version)
        assert table.loc["cost_per_1k", col] == pytest.approx(price * hours / ok * 1000)
    assert table.loc["cache_hit_rate", "difference"] < -0.1
    assert table.loc["requests", "ratio"] == pytest.approx(table.loc["requests", "candidate"]
                                                          / table.loc["requests", "baseline"])
    assert table.loc["total_p99_ms", "unit"] == "ms" and table.loc["failure_rate", "unit"] == "share"
    assert {"total_p99_ms", "batch_wait_p99_ms", "psi:tenure", "psi:Contract", "psi:prediction",
            "batch_size_mean", "throughput_rps", "failure_rate"} <= set(table.index)
    cons = result.constraints.set_index("metric")
    assert cons.loc["cache_hit_rate", "status"] == "fail" and cons.loc["cache_hit_rate", "baseline_status"] == "pass"
    assert cons.loc["cost_per_1k", "status"] == "pass" and cons.loc["total_p99_ms", "status"] == "pass"
    assert result.passed is False
