"""The text-generation service's generated files, read back and measured: the `lang=de` fault shows in de
and nowhere else, the healthy run follows the day, feedback comes after its answer, and the ground truth
says what a monitor should find."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from monitor.contract import STATUSES
from monitor.simulate import GENERATION_SCENARIOS, generate_generation
from monitor.simulate.generation import LANGS, SLOW_ACCEPT


def _read(d: Path, kind: str) -> pd.DataFrame:
    return pd.concat([pd.read_json(f, lines=True, dtype=False) for f in sorted((d / kind).glob("*.jsonl"))],
                     ignore_index=True)


@pytest.fixture(scope="module")
def slower(tmp_path_factory):
    d = tmp_path_factory.mktemp("gen-slower")
    gt = generate_generation("generation-slower-de", d, seed=3, hours=4, rate_per_s=3.0, onset_hours=1.5)
    p, t, lab = _read(d, "predictions"), _read(d, "timings"), _read(d, "labels")
    p["after"] = pd.to_datetime(p["ts"]) >= pd.Timestamp(gt.onset)
    return {"dir": d, "gt": gt, "p": p, "t": t, "labels": lab}


def _by_lang(s: dict) -> pd.DataFrame:
    p, t = s["p"], s["t"]
    decode = t[t["stage"] == "decode"].merge(p, on="request_id")
    decode["ms_per_token"] = decode["duration_ms"] / decode["output_tokens"]
    ok = p[p["status"] == "ok"]
    return pd.DataFrame({
        "accept": ok.groupby(["lang", "after"])["spec_accept"].mean(),
        "ttft": ok.groupby(["lang", "after"])["ttft_ms"].mean(),
        "decode": decode[decode["status"] == "ok"].groupby(["lang", "after"])["ms_per_token"].median(),
    }).unstack("after")


def test_the_fault_is_in_de_only(slower):
    m = _by_lang(slower)
    de = m.loc["de"]
    assert de[("accept", False)] == pytest.approx(0.71, abs=0.02)
    assert de[("accept", True)] == pytest.approx(SLOW_ACCEPT, abs=0.02)
    assert de[("decode", True)] / de[("decode", False)] == pytest.approx(2.0, abs=0.2)
    assert de[("ttft", True)] / de[("ttft", False)] == pytest.approx(1.4, abs=0.12)
    others = m.drop(index="de")
    for what, tol in (("accept", 0.02), ("decode", 0.05), ("ttft", 0.1)):
        ratio = others[(what, True)] / others[(what, False)]
        assert (ratio - 1).abs().max() < tol, (what, ratio.to_dict())


def test_rows_follow_the_contract(slower):
    p, t = slower["p"], slower["t"]
    assert set(p["status"]) <= set(STATUSES) and (p["status"] == "ok").mean() > 0.99
    assert p["request_id"].is_unique and {"queue", "prefill", "decode", "postprocess"} == set(t["stage"])
    ok = p[p["status"] == "ok"]
    assert (ok["ttft_ms"] < ok["latency_ms"]).all() and ok["cache_hit"].dtype == bool
    assert 0.35 < ok["cache_hit"].mean() < 0.55 and (ok["input_tokens"] > 0).all() and (ok["output_tokens"] > 0).all()
    total = t.groupby("request_id")["duration_ms"].sum()
    joined = ok.set_index("request_id")["latency_ms"]
    assert np.allclose(total.reindex(joined.index), joined, atol=0.01)
    shares = p["lang"].value_counts(normalize=True)
    for lang, share, *_ in LANGS:
        assert shares[lang] == pytest.approx(share, abs=0.02)
    rejected = p[p["status"] == "rejected"]
    assert set(t[t["request_id"].isin(rejected["request_id"])]["stage"]) == {"queue"}


def test_feedback_arrives_after_its_answer_at_its_rate(slower):
    p, lab = slower["p"], slower["labels"]
    j = lab.merge(p, on="request_id")
    assert len(j) == len(lab) and set(j["status"]) == {"ok"} and set(lab["label"]) == {"up", "down"}
    delay = (pd.to_datetime(j["label_ts"]) - pd.to_datetime(j["ts"])).dt.total_seconds()
    assert (delay * 1000 > j["latency_ms"]).all() and 600 < delay.median() < 1500 and delay.max() > 3 * 3600
    assert len(lab) / (p["status"] == "ok").sum() == pytest.approx(0.12, abs=0.01)
    up = (j["label"] == "up").groupby(j["lang"]).mean()
    assert up["en"] == pytest.approx(0.84, abs=0.03) and up["zh"] < up["en"]
    for part in sorted((slower["dir"] / "labels").glob("*.jsonl")):  # each hour's feedback as it arrives
        at = pd.to_datetime(pd.read_json(part, lines=True, dtype=False)["label_ts"])
        assert at.is_monotonic_increasing


def test_ground_truth_names_the_segment(slower):
    gt = json.loads((slower["dir"] / "ground_truth.json").read_text())
    assert gt["verdict"] == "slower" and gt["segment"] == "lang=de" and gt["onset"] == "2026-11-02T01:30:00.000Z"
    assert gt["affected"]["signal"] == {"spec_accept": [0.71, SLOW_ACCEPT]} and gt["fault_end"] is None
    assert gt["params"]["config_before"]["config_hash"] != gt["params"]["config_after"]["config_hash"]
    assert set(slower["p"]["config_hash"][slower["p"]["after"]]) == {gt["params"]["config_after"]["config_hash"]}
    ref = pd.read_parquet(slower["dir"] / "reference.parquet")
    assert {"lang", "input_tokens", "label"} <= set(ref.columns) and set(ref["label"]) == {"up", "down"}


def test_healthy_two_days_follow_the_day(tmp_path):
    gt = generate_generation("generation-healthy-2d", tmp_path, seed=5, rate_per_s=0.5)
    p = _read(tmp_path, "predictions")
    hour = pd.to_datetime(p["ts"]).dt.hour
    per_hour = hour.value_counts().sort_index() / 2  # two days
    assert gt.verdict == "healthy" and gt.onset is None and gt.segment is None and gt.end == "2026-11-04T00:00:00.000Z"
    assert per_hour.loc[13:17].mean() / per_hour.loc[1:5].mean() > 1.7  # the peak at 15:00, the low at 03:00
    ok = p[p["status"] == "ok"]
    assert ok.groupby("lang")["spec_accept"].mean()["de"] == pytest.approx(0.71, abs=0.02)


def test_the_same_seed_writes_the_same_bytes(tmp_path):
    for run in ("a", "b"):
        generate_generation("generation-worse-ja", tmp_path / run, seed=9, hours=1, rate_per_s=0.5)
    for kind in ("predictions", "timings", "labels"):
        assert (tmp_path / "a" / kind / "part-00000.jsonl").read_bytes() == \
            (tmp_path / "b" / kind / "part-00000.jsonl").read_bytes()


def test_unknown_scenario_and_fault_end_are_refused(tmp_path):
    assert "generation-slower-de" in GENERATION_SCENARIOS
    with pytest.raises(ValueError, match="unknown generation scenario"):
        generate_generation("slower-cache", tmp_path)
    with pytest.raises(ValueError, match="fault_end_hours"):
        generate_generation("generation-slower-de", tmp_path, hours=2, onset_hours=1.5, fault_end_hours=1.0)
