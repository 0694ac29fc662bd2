"""The files' contract: every scenario generates with its ground truth; formats, stage sums, OTLP
spans, the reference split; same seed same bytes."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import f1_score

from monitor.contract import STAGES, STATUSES
from monitor.simulate import SCENARIOS, GroundTruth, generate
from monitor.simulate.model import best_threshold, train

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
PRED_FIELDS = ["request_id", "ts", "model_version", "status", "tenure", "MonthlyCharges", "Contract",
               "InternetService", "notes", "prediction", "score_Yes", "threshold", "latency_ms", "cache_hit",
               "cache_version", "preprocess_version", "config_hash", "replica", "batch_size", "queue_depth"]
GT_FIELDS = {"scenario", "seed", "start", "end", "onset", "verdict", "what_changed", "model_versions",
             "affected", "expected_findings", "counts"}
FINDINGS = {"missing_rate", "out_of_range", "unseen_categories", "length_distribution", "drift",
            "prediction_drift", "latency", "cache_hit_rate", "stale_cache", "quality"}


def _read(d: Path, kind: str) -> pd.DataFrame:
    frames = [pd.read_json(f, lines=True, dtype=False, convert_dates=False)
              for f in sorted((d / kind).glob("*.jsonl"))]
    return pd.concat(frames, ignore_index=True)


def _after(p: pd.DataFrame, gt: dict) -> pd.Series:
    return pd.to_datetime(p["ts"]) >= pd.Timestamp(gt["onset"])


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Every scenario, 3 h at 4 rps, several parts."""
    out = {}
    for s in SCENARIOS:
        d = tmp_path_factory.mktemp(s)
        gt = generate(s, d, seed=5, hours=3, rate_per_s=4.0, chunk_rows=15_000, otlp=(s == "healthy"))
        out[s] = (d, gt, json.loads((d / "ground_truth.json").read_text()))
    return out


@pytest.fixture(scope="module")
def read():
    """`_read` reading each folder once for the module: the tests look at the frames and never change them."""
    return functools.cache(_read)


def test_every_scenario_generates_with_ground_truth(small, read):
    assert len(SCENARIOS) == 8
    for s, (d, gt, js) in small.items():
        assert isinstance(gt, GroundTruth) and gt.scenario == s == js["scenario"]
        assert GT_FIELDS <= set(js), s
        assert js["verdict"] in {"slower", "worse", "both", "drift", "healthy"}
        assert set(js["expected_findings"]) <= FINDINGS
        assert set(js["model_versions"]) == {"before", "after"}
        assert all(TS.match(js[k]) for k in ("start", "end", "onset"))
        assert js["start"] < js["onset"] < js["end"]
        p = read(d, "predictions")
        assert list(p.columns) == PRED_FIELDS
        assert js["counts"]["predictions"] == len(p) and js["counts"]["parts"] > 1
        assert p["request_id"].is_unique
        assert p["ts"].map(lambda x: bool(TS.match(x))).all()
        assert p["ts"].is_monotonic_increasing  # across parts too
        assert set(p["status"]) <= set(STATUSES)
        ok = p["status"] == "ok"
        assert p.loc[ok, "prediction"].isin(["Yes", "No"]).all() and p.loc[~ok, "prediction"].isna().all()
        assert p.loc[ok, "score_Yes"].between(0, 1).all() and p.loc[~ok, "score_Yes"].isna().all()
        assert set(p["replica"]) == {"r0", "r1", "r2", "r3"}
        labels = read(d, "labels")
        assert labels["request_id"].isin(p.loc[ok, "request_id"]).all()
        assert js["counts"]["labels"] == len(labels)


def test_scenario_specific_signals(small, read):
    def frame(s):
        d, _, js = small[s]
        p = read(d, "predictions")
        return p, _after(p, js), js

    p, a, js = frame("missing-fields")
    assert p.loc[~a, "InternetService"].notna().all()
    assert 0.15 < p.loc[a, "InternetService"].isna().mean() < 0.25

    p, a, js = frame("drift-new-category")
    assert "Three year" in set(p.loc[a, "Contract"]) and "Three year" not in set(p.loc[~a, "Contract"])
    assert (p.loc[a, "MonthlyCharges"] > train().model.train_max["MonthlyCharges"]).mean() > 0.05
    labels = read(small["drift-new-category"][0], "labels")
    lab = p.merge(labels, on="request_id")
    assert len(lab) > 0 and not _after(lab, js).any()
    assert js["labels_after_onset"] is False

    p, a, js = frame("worse-threshold")
    assert p.loc[a, "threshold"].min() > p.loc[~a, "threshold"].max()
    assert set(p.loc[a, "model_version"]) == {"v2"}

    p, a, js = frame("slower-cache")
    assert p.loc[a, "cache_hit"].mean() < p.loc[~a, "cache_hit"].mean() - 0.1
    stale = p["cache_hit"] & (p["cache_version"] != p["model_version"])
    assert stale.sum() > 0 and (p.loc[stale, "cache_version"] == "v1").all()
    assert p.loc[a & ~p["cache_hit"], "latency_ms"].median() > p.loc[a & p["cache_hit"], "latency_ms"].median()

    p, a, js = frame("both-long-inputs")
    ln = p["notes"].str.len()
    assert (ln[a] > 512).mean() > 3 * (ln[~a] > 512).mean()
    assert p.loc[a, "latency_ms"].quantile(0.95) > 1.3 * p.loc[~a, "latency_ms"].quantile(0.95)

    p, a, js = frame("slower-batching")
    assert p.loc[~a, "batch_size"].max() <= 4 and p["config_hash"].nunique() == 2


def test_stage_timings_sum_to_latency(small, read):
    d, _, _ = small["healthy"]
    p = read(d, "predictions").set_index("request_id")
    t = read(d, "timings")
    assert set(t["stage"]) == set(STAGES)
    assert t["start_ts"].map(lambda x: bool(TS.match(x))).all()
    total = t.groupby("request_id")["duration_ms"].sum()
    stages = t.groupby("request_id")["stage"].agg(list)
    assert set(total.index) == set(p.index)  # every request has timings, rejected ones too
    assert np.allclose(total.reindex(p.index), p["latency_ms"], atol=0.01)
    served = p["status"] == "ok"
    assert (stages[served[served].index].map(len) == 5).all()
    rej = p.index[p["status"] == "rejected"]
    assert len(rej) and (stages[rej].map(lambda s: s == ["parse"])).all()
    to = p[p["status"] == "timeout"]
    assert len(to) and (to["latency_ms"] == json.loads((d / "ground_truth.json").read_text())["params"]
                        ["deadline_ms"]).all()


def test_otlp_spans_match_timing_rows(small, read):
    d, _, js = small["healthy"]
    t = read(d, "timings")
    spans = []
    for f in sorted((d / "spans").glob("*.json")):
        doc = json.loads(f.read_text())
        rs = doc["resourceSpans"][0]
        assert rs["resource"]["attributes"][0] == {"key": "service.name", "value": {"stringValue": "churn-api"}}
        ss = rs["scopeSpans"][0]
        assert ss["scope"]["name"] == "tailwatch-sim"
        spans.extend(ss["spans"])
    assert len(spans) == len(t) == js["counts"]["spans"]
    s = pd.DataFrame({
        "request_id": [x["attributes"][0]["value"]["stringValue"] for x in spans],
        "stage": [x["name"] for x in spans],
        "dur": [(int(x["endTimeUnixNano"]) - int(x["startTimeUnixNano"])) / 1e6 for x in spans],
        "trace": [x["traceId"] for x in spans], "span": [x["spanId"] for x in spans],
    })
    assert s["trace"].str.fullmatch(r"[0-9a-f]{32}").all() and s["span"].str.fullmatch(r"[0-9a-f]{16}").all()
    assert s["span"].is_unique
    assert (s.groupby("request_id")["trace"].nunique() == 1).all()
    assert (s["request_id"].to_numpy() == t["request_id"].to_numpy()).all()
    assert (s["stage"].to_numpy() == t["stage"].to_numpy()).all()
    assert np.allclose(s["dur"], t["duration_ms"], atol=0.001)


def test_reference_is_validation_split_with_threshold_chosen_on_it(small, read):
    d, _, js = small["healthy"]
    ref = pd.read_parquet(d / "reference.parquet")
    assert list(ref.columns) == ["tenure", "MonthlyCharges", "Contract", "InternetService", "notes", "label",
                                 "prediction", "score_Yes"]
    tr = train()
    assert len(ref) == len(tr.valid) == round(0.2 * (len(tr.train) + len(tr.valid) + len(tr.test)))
    assert abs((ref["label"] == "Yes").mean() - tr.model.base_rate) < 0.01  # stratified
    assert tr.defects.blank_total_charges == 11
    y = (ref["label"] == "Yes").astype(int)
    thr = read(d, "predictions")["threshold"].iloc[0]
    assert thr == pytest.approx(best_threshold(y.to_numpy(), ref["score_Yes"].to_numpy()), abs=0.011)
    assert ((ref["score_Yes"] >= thr) == (ref["prediction"] == "Yes")).mean() > 0.99
    f1 = f1_score(y, ref["prediction"] == "Yes")
    assert f1 > 0.55


def _digest(d: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in d.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(d)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    kw = dict(hours=1.0, rate_per_s=3.0, chunk_rows=4000, otlp=True)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    generate("slower-cache", a, seed=3, **kw)
    generate("slower-cache", b, seed=3, **kw)
    generate("slower-cache", c, seed=4, **kw)
    assert len(list((a / "predictions").glob("*.jsonl"))) > 1
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)
    assert (a / "predictions/part-00000.jsonl").read_bytes() != (c / "predictions/part-00000.jsonl").read_bytes()
