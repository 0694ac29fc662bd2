"""A fault's end (the before regime returns at a known time) and the healthy-week scenario, read back from
the generated files: the traffic's daily and weekly shape and each event where its ground truth says."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest

from monitor.simulate import DEFAULT_START, generate


def _read(d: Path) -> pd.DataFrame:
    p = pd.concat([pd.read_json(f, lines=True, dtype=False, convert_dates=False)
                   for f in sorted((d / "predictions").glob("*.jsonl"))], ignore_index=True)
    p["t"] = pd.to_datetime(p["ts"], utc=True)
    p["h"] = (p["t"] - pd.Timestamp(DEFAULT_START)).dt.total_seconds() / 3600
    return p


@pytest.fixture(scope="module")
def week(tmp_path_factory):
    d = tmp_path_factory.mktemp("healthy-week")
    generate("healthy-week", d, seed=7, hours=168, rate_per_s=0.3, otlp=False)
    return json.loads((d / "ground_truth.json").read_text()), _read(d)


def test_healthy_week_truth_lists_its_events_and_no_fault(week):
    gt, _ = week
    assert gt["verdict"] == "healthy" and gt["onset"] is None and gt["fault_end"] is None
    assert gt["expected_findings"] == [] and gt["params"]["weekly"] is True
    assert gt["model_versions"] == {"before": "v1", "after": "v2"}
    kinds = {e["kind"]: e for e in gt["events"]}
    assert list(kinds) == ["deploy", "cache_restart", "traffic_spike"]
    assert kinds["deploy"]["at"] == "2026-11-03T10:00:00.000Z"
    assert kinds["cache_restart"]["at"] == "2026-11-04T14:00:00.000Z"
    assert (kinds["traffic_spike"]["at"], kinds["traffic_spike"]["until"]) == (
        "2026-11-05T11:00:00.000Z", "2026-11-05T11:30:00.000Z")


def test_healthy_week_traffic_is_daily_and_weekly(week):
    _, p = week
    assert p["h"].min() >= 0 and p["h"].max() < 168
    day = (p["h"] // 24).astype(int)  # the run starts on a Monday
    per_day = day.value_counts().sort_index()
    assert len(per_day) == 7
    weekday, weekend = per_day.loc[0:4].median(), per_day.loc[5:6]
    assert (weekend < 0.7 * weekday).all() and (weekend > 0.4 * weekday).all()
    hour = p["h"] % 24
    weekdays = day <= 4
    busy = (weekdays & hour.between(14, 16)).sum()  # the curve peaks at 15:00 and bottoms at 03:00
    quiet = (weekdays & hour.between(2, 4)).sum()
    assert busy > 1.6 * quiet


def test_healthy_week_deploy_is_equivalent(week):
    _, p = week
    before, after = p[p["h"] < 34], p[p["h"] >= 34]
    assert set(before["model_version"]) == {"v1"} and set(after["model_version"]) == {"v2"}
    assert p["threshold"].nunique() == 1 and p["config_hash"].nunique() == 1
    assert p["preprocess_version"].nunique() == 1
    ok_b, ok_a = before[before["status"] == "ok"], after[after["status"] == "ok"]
    assert abs((ok_b["prediction"] == "Yes").mean() - (ok_a["prediction"] == "Yes").mean()) < 0.02
    for q in (0.5, 0.95):
        assert abs(ok_a["latency_ms"].quantile(q) / ok_b["latency_ms"].quantile(q) - 1) < 0.1


def test_healthy_week_cache_restart_dips_then_recovers(week):
    _, p = week
    at = 62.0

    def hit_rate(a, b):
        return p.loc[(p["h"] >= a) & (p["h"] < b), "cache_hit"].mean()

    before, dip, after = hit_rate(at - 2, at), hit_rate(at, at + 0.1), hit_rate(at + 0.5, at + 2.5)
    assert dip < 0.5 * before
    assert abs(after - before) < 0.05
    assert hit_rate(at - 0.1, at) > 0.5 * before  # the dip starts at the restart, not before


def test_healthy_week_traffic_spike_at_its_time(week):
    _, p = week
    spike = ((p["h"] >= 83) & (p["h"] < 83.5)).sum()
    day_before = ((p["h"] >= 59) & (p["h"] < 59.5)).sum()  # Wednesday, same half hour
    around = ((p["h"] >= 81) & (p["h"] < 82.5)).sum() / 3
    assert 2.2 * day_before < spike < 4 * day_before
    assert spike > 2.2 * around


def test_fault_end_brings_the_before_regime_back(tmp_path):
    gt = generate("slower-cache", tmp_path / "cache", seed=3, hours=3, onset_hours=1, fault_end_hours=2,
                  rate_per_s=3.0, otlp=False, chunk_rows=4000)
    assert (gt.onset, gt.fault_end) == ("2026-11-02T01:00:00.000Z", "2026-11-02T02:00:00.000Z")
    p = _read(tmp_path / "cache")
    on = (p["h"] >= 1) & (p["h"] < 2)
    assert set(p.loc[on, "model_version"]) == {"v2"} and set(p.loc[~on, "model_version"]) == {"v1"}
    hits = p.groupby(on)["cache_hit"].mean()
    assert hits[True] < hits[False] - 0.1
    rolled_back = p.loc[p["h"] >= 2.25, "cache_hit"].mean()  # v1's cache key is back
    assert abs(rolled_back - p.loc[p["h"] < 1, "cache_hit"].mean()) < 0.05

    gt = generate("slower-batching", tmp_path / "batch", seed=3, hours=2, onset_hours=0.5,
                  fault_end_hours=1.5, rate_per_s=3.0, otlp=False)
    p = _read(tmp_path / "batch")
    on = (p["h"] >= 0.5) & (p["h"] < 1.5)
    assert p.loc[on, "config_hash"].nunique() == 1 and p.loc[~on, "config_hash"].nunique() == 1
    assert set(p.loc[on, "config_hash"]) == {gt.params["config_after"]["config_hash"]}
    assert set(p.loc[~on, "config_hash"]) == {gt.params["config_before"]["config_hash"]}
    assert p.loc[~on & (p["batch_size"] > 0), "batch_size"].max() <= 4
    lab = json.loads((tmp_path / "batch" / "ground_truth.json").read_text())
    assert lab["fault_end"] == "2026-11-02T01:30:00.000Z" and lab["params"]["fault_end_hours"] == 1.5


def test_fault_end_is_null_without_an_end_and_checked(tmp_path):
    gt = generate("missing-fields", tmp_path / "a", seed=3, hours=1, rate_per_s=1.0, otlp=False)
    assert gt.fault_end is None and gt.onset == "2026-11-02T00:30:00.000Z"
    with pytest.raises(ValueError, match="fault_end_hours must be after the onset"):
        generate("missing-fields", tmp_path / "b", hours=2, onset_hours=1, fault_end_hours=0.5)
    with pytest.raises(ValueError, match="do not apply"):
        generate("healthy-week", tmp_path / "c", hours=48, onset_hours=1)
    assert DEFAULT_START.weekday() == 0 and DEFAULT_START + timedelta(hours=34) == pd.Timestamp(
        "2026-11-03T10:00Z").to_pydatetime()
