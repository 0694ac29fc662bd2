"""A quality section on logs that hold labels but no prediction and no score column: a tick stores its
prediction-based quality figures as `insufficient` with no value (saying why), never accuracy 0.0 as
`ok`, and `/metrics` exports none of them. The same logs with their predictions score them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from checks.quality import MISS, Labelled, compare_versions, estimate, measure, window_rows
from monitor import config as config_mod
from monitor.daemon.health import Metrics
from monitor.daemon.model_metrics import ModelMetrics
from monitor.daemon.runner import tick
from storage.store import Store

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
N = 120
PREDICTED = ("precision", "recall", "f1", "accuracy")


def write_logs(root: Path, predictions: bool) -> None:
    """N requests over one hour (a prediction right 3 times in 4 when written) and a label for each."""
    rng = np.random.default_rng(3)
    y = rng.choice(["No", "Yes"], N)
    rows = pd.DataFrame({"request_id": [f"r{i}" for i in range(N)],
                         "ts": [(T0 + timedelta(seconds=30 * i)).isoformat() for i in range(N)],
                         "model_version": "v1", "status": "ok", "x": rng.normal(size=N)})
    if predictions:
        rows["prediction"] = np.where(np.arange(N) % 4 == 0, np.where(y == "Yes", "No", "Yes"), y)
    labels = pd.DataFrame({"request_id": rows["request_id"], "label": y,
                           "label_ts": (T0 + timedelta(hours=1, minutes=5)).isoformat()})
    for frame, where in ((rows, root / "predictions"), (labels, root / "labels")):
        where.mkdir(parents=True, exist_ok=True)
        frame.to_json(where / "part-0.jsonl", orient="records", lines=True)


def config(root: Path) -> config_mod.Config:
    service = {"name": "svc", "schema": {"features": {"x": "numeric"}, "classes": ["No", "Yes"]},
               "sources": {"predictions": {"kind": "files", "path": str(root / "predictions")},
                           "labels": {"kind": "files", "path": str(root / "labels")}},
               "buckets": {"size": "15m", "windows": ["1h"]},
               "quality": {"windows": ["1h"], "min_n": 30, "coverage_threshold": 0.5, "bootstrap_samples": 20,
                           "rules": [{"metric": "accuracy", "class": "all", "min": 0.5}]}}
    return config_mod.parse({"storage": {"url": "sqlite://"}, "services": [service]}, base_dir=root)


def tick_and_export(root: Path, store: Store) -> tuple[list[dict], dict[tuple, float]]:
    """The stored `quality` findings of the hour after one tick, and the quality series /metrics exports."""
    cfg, now = config(root), T0 + timedelta(hours=2)
    [report] = tick(cfg, store, now)
    assert report.status == "ok", report.error
    with store.transaction() as session:
        found = [r for r in store.findings.load(session, "svc", check="quality")
                 if r["window_end"] - r["window_start"] == timedelta(hours=1)]
    text = Metrics(ModelMetrics(cfg, store, clock=lambda: now)).render().decode()
    series = {(s.labels["metric"], s.labels["class"], s.labels["group"]): s.value
              for family in text_string_to_metric_families(text) for s in family.samples
              if s.name == "tailwatch_quality_score"}
    return found, series


def test_a_tick_on_logs_without_predictions_scores_nothing_as_ok(tmp_path, store):
    write_logs(tmp_path, predictions=False)
    found, series = tick_and_export(tmp_path, store)
    by_metric = {(r["labels"]["metric"], r["labels"]["class"]): r for r in found if r["labels"]["group"] == "all"}
    assert ("accuracy", "all") in by_metric and ("recall", "Yes") in by_metric
    for (metric, cls), r in by_metric.items():
        assert r["status"] == "insufficient" and r["value"] is None, (metric, cls, r["status"], r["value"])
        if metric in PREDICTED:
            assert r["detail"]["why"].startswith("no prediction column"), (metric, cls, r["detail"])
    assert by_metric[("accuracy", "all")]["n"] == N  # the labels were read: the figure is what is missing
    assert series == {}
    with store.transaction() as session:
        [rule] = store.findings.load(session, "svc", check="acceptance")
    assert rule["status"] == "insufficient"


def test_the_same_logs_with_predictions_score_them(tmp_path, store):
    write_logs(tmp_path, predictions=True)
    found, series = tick_and_export(tmp_path, store)
    accuracy = next(r for r in found if r["labels"] == {"metric": "accuracy", "class": "all", "group": "all"})
    assert accuracy["status"] == "ok" and accuracy["value"] == pytest.approx(0.75)
    assert "why" not in accuracy["detail"]
    assert series[("accuracy", "all", "all")] == pytest.approx(0.75)


def test_window_rows_tell_no_prediction_column_from_missing_or_failed_ones():
    proba = np.full((3, 2), np.nan)
    classes = ("No", "Yes")
    some = window_rows(pd.Series(["No", None, "Yes"]), pd.Series(["No", None, "No"]), np.zeros(3, bool), proba,
                       classes)
    assert some.predicted and list(some.y_pred) == ["No", MISS, "No"] and list(some.y_true) == ["No", "", "Yes"]
    none = window_rows(pd.Series(["No", "Yes", "Yes"]), pd.Series([None, np.nan, None]), np.zeros(3, bool),
                       proba, classes)
    assert not none.predicted and list(none.y_pred) == [MISS] * 3
    # Every request failed: each is a MISS by failed_as_miss, a figure of the service, not of missing logs.
    failed = window_rows(pd.Series(["No", "Yes", "Yes"]), pd.Series([None] * 3), np.ones(3, bool), proba, classes)
    assert failed.predicted
    ms = {(m.metric, m.cls): m for m in measure(failed, "Yes", samples=0)}
    assert ms[("accuracy", "all")].value == 0.0


def test_without_predictions_no_estimate_or_comparison_reads_a_miss_as_a_class():
    classes = ("No", "Yes")
    proba = np.tile([0.3, 0.7], (40, 1))
    data = Labelled(np.array(["Yes"] * 40, dtype=object), np.array([MISS] * 40, dtype=object), proba, classes,
                    predicted=False)
    assert all(m.value is None for m in estimate(data.y_pred, proba, classes))
    deltas = compare_versions(data, data, data.y_pred, data.y_pred, "Yes", 20, 1)
    assert deltas and all(m.value is None and m.n == 40 for m in deltas)
    ms = {(m.metric, m.cls): m for m in measure(data, "Yes", samples=0)}
    assert ms[("accuracy", "all")].value is None and ms[("roc_auc", "Yes")].value is None  # one class labelled
    assert ms[("log_loss", "all")].value == pytest.approx(-np.log(0.7))  # the scores are still measured
