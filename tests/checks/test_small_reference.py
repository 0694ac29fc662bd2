"""A small, clean reference: 300 rows of 64 numeric features, a few of them exactly 0, against serving traffic
where those few are jittered. `reference build` says what is wrong with it; a week of healthy hourly
ticks gives no drift verdict; a feature moved by several standard deviations still does."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from checks.contract import REGISTRY
from checks.evaluate import evaluate
from monitor import config as config_mod
from monitor.cli import app
from monitor.daemon.runner import tick
from monitor.verdicts.verdict import decide
from storage.store import Store

FEATURES = [f"px{i:02d}" for i in range(64)]
DATA_CHECKS = ("missing_rate", "out_of_range", "unseen_categories", "drift", "prediction_drift", "length_distribution")
CONSTANT = ["px00", "px07", "px56", "px63"]  # exactly 0 in the reference (an image's corners)
REFERENCE_ROWS = 300
PER_HOUR = 580
DAYS = 7
T0 = datetime(2026, 6, 1, tzinfo=UTC)
MEANS = np.linspace(2.0, 12.0, 64)
SDS = np.linspace(1.0, 4.0, 64)


def pixels(n: int, rng: np.random.Generator, serving: bool) -> pd.DataFrame:
    """n rows of the 64 features; the CONSTANT ones are 0, and in serving jittered (about half the rows
    off 0 by a measurement error of ~0.01)."""
    frame = pd.DataFrame(rng.normal(MEANS, SDS, (n, 64)).round(2), columns=FEATURES)
    for name in CONSTANT:
        frame[name] = (rng.normal(0, 0.01, n) * (rng.random(n) < 0.53)).round(4) if serving else 0.0
    return frame


def service_dir(root: Path, band: str = "learned", **reference) -> Path:
    (root / "predictions").mkdir(parents=True, exist_ok=True)
    pixels(REFERENCE_ROWS, np.random.default_rng(300), serving=False).to_parquet(root / "reference.parquet")
    checks = {} if band == "learned" else {c: {"band": "none", "degenerate": "reference"}
                                           for c in ("drift", "out_of_range")}
    raw = {"storage": {"url": f"sqlite:///{root / 'tailwatch.db'}"},
           "services": [{"name": "digits", "sources": {"predictions": {"kind": "files", "path": str(root / "predictions"),
                                                                       "pattern": "*.parquet"}},
                         "schema": {"features": dict.fromkeys(FEATURES, "numeric")},
                         "reference": {"path": str(root / "reference.parquet"), **reference},
                         "buckets": {"size": "1h", "windows": ["1h", "1d"]},
                         "checks": checks}]}
    (root / "tailwatch.yaml").write_text(yaml.safe_dump(raw))
    return root / "tailwatch.yaml"


def hour(root: Path, k: int, rng: np.random.Generator, shift: dict[str, float] | None = None) -> None:
    """Write the requests of hour k (Poisson around PER_HOUR) as one Parquet file."""
    n = int(rng.poisson(PER_HOUR))
    frame = pixels(n, rng, serving=True)
    for name, by in (shift or {}).items():
        frame[name] += by
    start = T0 + timedelta(hours=k)
    frame.insert(0, "ts", pd.to_datetime(start) + pd.to_timedelta(np.sort(rng.uniform(0, 3600, n)), unit="s"))
    frame.insert(0, "request_id", [f"h{k}-{i}" for i in range(n)])
    frame["model_version"], frame["status"] = "v1", "ok"
    frame.to_parquet(root / "predictions" / f"hour-{k:04d}.parquet")


def replay(root: Path, hours: int, shift: dict[str, float] | None = None, shift_from: int = 0, step: int = 1) -> dict:
    """Release a file per hour over `hours` hours and tick every `step` hours (5 minutes after the
    hour); the verdict of every (window, version) scored: {(start, end): verdict}."""
    cfg = config_mod.load(str(root / "tailwatch.yaml"))
    store = Store(cfg.storage.url)
    store.upgrade()
    rng = np.random.default_rng(7)
    for k in range(hours):
        hour(root, k, rng, shift if k >= shift_from else None)
        if (k + 1) % step == 0 or k + 1 == hours:
            report = tick(cfg, store, T0 + timedelta(hours=k + 1, minutes=5))[0]
            assert report.status == "ok", report.error
    with store.transaction() as session:
        findings = store.findings.load(session, "digits")
    by_window = defaultdict(list)
    for f in findings:
        by_window[(f["window_start"], f["window_end"], f["model_version"])].append(f)
    end = T0 + timedelta(hours=hours + 1)
    verdicts = {(s, e): decide(fs, service="digits", model_version=v, window_start=s, window_end=e, now=end)
                for (s, e, v), fs in by_window.items()}
    store.dispose()
    return verdicts


def test_reference_build_warns_about_constant_fields_and_the_small_reference(tmp_path, monkeypatch):
    service_dir(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(app, ["db", "upgrade"], catch_exceptions=False).exit_code == 0
    result = CliRunner().invoke(app, ["reference", "build", "--format", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (built,) = json.loads(result.stdout)
    concerns = built["concerns"]
    assert sorted(c["field"] for c in concerns if c["kind"] == "constant") == sorted(CONSTANT)
    (small,) = [c for c in concerns if c["kind"] == "small_reference"]
    assert small["needs"] > REFERENCE_ROWS and "out_of_range" in small["detail"] and small["fix"]
    assert all(c["fix"] for c in concerns)
    table = CliRunner().invoke(app, ["reference", "build"], catch_exceptions=False, env={"COLUMNS": "250"})
    assert "reference concerns" in table.stdout and "constant" in table.stdout and "px00" in table.stdout


def test_a_healthy_week_against_a_small_reference_gives_no_drift_with_the_learned_band(tmp_path):
    service_dir(tmp_path)
    verdicts = replay(tmp_path, DAYS * 24, step=3)
    days = [v for (s, e), v in verdicts.items() if e - s == timedelta(days=1)]
    assert len(days) == DAYS and len(verdicts) == DAYS * 24 + DAYS
    drift = sorted(f"{s:%d %H}h+{(e - s) // timedelta(hours=1)}h {v.attribution.get('inputs')}"
                   for (s, e), v in verdicts.items() if v.verdict == "drift")
    assert drift == []
    assert {v.verdict for v in verdicts.values()} == {"healthy"}


@pytest.mark.parametrize("moved", ["px30", "px00"])
def test_a_feature_moved_by_several_sd_still_drifts(tmp_path, moved):
    service_dir(tmp_path)
    by = 4 * SDS[FEATURES.index(moved)] if moved not in CONSTANT else 5.0
    verdicts = replay(tmp_path, 36, shift={moved: by}, shift_from=30)
    hours = {s: v for (s, e), v in verdicts.items() if e - s == timedelta(hours=1)}
    before = [v.verdict for s, v in hours.items() if s < T0 + timedelta(hours=30)]
    after = [v for s, v in hours.items() if s >= T0 + timedelta(hours=30)]
    assert set(before) == {"healthy"}
    assert [v.verdict for v in after] == ["drift"] * 6
    assert all(moved in json.dumps(v.attribution["inputs"], default=str) for v in after)


def test_without_the_band_the_same_week_drifts(tmp_path):
    service_dir(tmp_path, band="none")
    verdicts = replay(tmp_path, 24)
    assert sum(v.verdict == "drift" for v in verdicts.values()) >= 20


def test_compared_with_an_accepted_day_of_serving_history(tmp_path):
    service_dir(tmp_path, compare_with="serving_history",
                accepted=[T0.isoformat(), (T0 + timedelta(days=1)).isoformat()])
    verdicts = replay(tmp_path, 36, shift={"px30": 4 * SDS[30]}, shift_from=30)
    hours = {s: v for (s, e), v in verdicts.items() if e - s == timedelta(hours=1)}
    assert {v.verdict for s, v in hours.items() if s < T0 + timedelta(hours=30)} == {"healthy"}
    after = [v for s, v in hours.items() if s >= T0 + timedelta(hours=30)]
    assert [v.verdict for v in after] == ["drift"] * 6
    assert all("px30" in json.dumps(v.attribution["inputs"], default=str) for v in after)
    store = Store(config_mod.load(str(tmp_path / "tailwatch.yaml")).storage.url)
    with store.transaction() as session:
        drift = store.findings.load(session, "digits", since=T0 + timedelta(hours=30), check="drift")
    store.dispose()
    assert {f["detail"]["against"] for f in drift} == {"serving_history"}


def test_every_data_check_finding_with_a_value_has_an_interval(sample, window, schema, reference_profile, trailing):
    from dataclasses import replace

    rng = np.random.default_rng(5)
    w = window(sample(600, rng), schema, reference_profile)
    served = window(sample(5000, rng), schema, reference_profile)  # serving history on the reference's bins

    def against_history() -> dict:
        return {name: replace(reg.params(), baseline="serving_history") for name, reg in REGISTRY.items()
                if name in DATA_CHECKS}

    for params, base in ((lambda: {}, trailing), (against_history, served)):
        findings = evaluate(w, reference_profile, base, params(), only=(*DATA_CHECKS, "oov_rate"))
        valued = [f for f in findings if f.value is not None]
        assert {f.check for f in valued} == {*DATA_CHECKS, "oov_rate"}
        assert [(f.check, f.labels) for f in valued if f.interval is None] == []
        assert all(f.interval[0] <= f.value <= f.interval[1] and f.n > 0 for f in valued)
