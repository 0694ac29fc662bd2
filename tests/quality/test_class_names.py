"""Class names that are numbers or booleans: references in CSV, JSON Lines and Parquet with labels and
predictions in every numeric and boolean spelling, against serving labels and predictions in another
spelling, give the model's reference quality and acceptance findings with a baseline."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from monitor import config as config_mod
from monitor.aggregate.profile import build_profile, read_reference
from monitor.daemon.runner import tick
from monitor.verdicts.quality import reference_quality, score_service
from storage.store import Store

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


# -- the reference against serving rows -------------------------------------------------------------

# How a 0/1 class is written: a number, a fraction, text of either, a boolean, text of a boolean.
SPELLINGS = {
    "int": int,
    "float": float,
    "text_int": lambda v: str(int(v)),
    "text_float": lambda v: str(float(v)),
    "bool": bool,
    "text_bool": lambda v: str(bool(v)),
}
ORDER = list(SPELLINGS)
NUMERIC = ORDER[:4]


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    score = np.clip(0.6 * y + rng.normal(0.2, 0.2, n), 0, 1)
    return y, (score >= 0.5).astype(int), score


def _write_reference(path: Path, label: str, pred: str) -> tuple[float, float]:
    """A 300-row reference; its true accuracy and recall of class 1."""
    y, p, score = _data(300, 1)
    column = {"x": np.arange(300.0), "label": [SPELLINGS[label](v) for v in y],
              "prediction": [SPELLINGS[pred](v) for v in p], "score_1": score}
    if path.suffix == ".csv":
        pd.DataFrame(column).to_csv(path, index=False)
    elif path.suffix == ".parquet":
        pd.DataFrame(column).to_parquet(path, index=False)
    else:
        with open(path, "w") as fh:
            for i in range(300):
                fh.write(json.dumps({k: (v[i].item() if hasattr(v[i], "item") else v[i]) for k, v in column.items()})
                         + "\n")
    return float((y == p).mean()), float(((p == 1) & (y == 1)).sum() / (y == 1).sum())


def _write_serving(root: Path, label: str, pred: str, fmt: str) -> tuple[float, float]:
    """120 predictions over one hour and their labels; the true accuracy and recall of class 1."""
    y, p, score = _data(120, 2)
    preds = pd.DataFrame({"request_id": [f"r{i}" for i in range(120)],
                          "ts": [(T0 + timedelta(seconds=30 * i)).isoformat() for i in range(120)],
                          "model_version": "v1", "status": "ok", "x": 1.0,
                          "prediction": pd.Series([SPELLINGS[pred](v) for v in p], dtype=object), "score_1": score})
    labels = pd.DataFrame({"request_id": preds["request_id"],
                           "label": pd.Series([SPELLINGS[label](v) for v in y], dtype=object),
                           "label_ts": (T0 + timedelta(hours=1, minutes=5)).isoformat()})
    for frame, where in ((preds, root / "predictions"), (labels, root / "labels")):
        where.mkdir(parents=True, exist_ok=True)
        if fmt == "parquet":
            frame.to_parquet(where / "part-0.parquet", index=False)
        else:
            frame.to_json(where / "part-0.jsonl", orient="records", lines=True)
    return float((y == p).mean()), float(((p == 1) & (y == 1)).sum() / (y == 1).sum())


def _rules(one: str) -> list[dict]:
    return [{"name": "recall", "metric": "recall", "class": one, "max_drop": 0.1},
            {"name": "accuracy", "metric": "accuracy", "class": "all", "max_drop": 0.1}]


def _raw(root: Path, classes: list | None, rules: list, reference: Path | None = None) -> dict:
    for d in ("predictions", "labels"):
        (root / d).mkdir(parents=True, exist_ok=True)
    schema: dict = {"features": {"x": "numeric"}}
    if classes is not None:
        schema["classes"] = classes
    service = {"name": "svc", "schema": schema,
               "sources": {"predictions": {"kind": "files", "path": str(root / "predictions")},
                           "labels": {"kind": "files", "path": str(root / "labels")}},
               "buckets": {"size": "15m", "windows": ["1h"]},
               "quality": {"windows": ["1h"], "min_n": 30, "coverage_threshold": 0.5, "bootstrap_samples": 50,
                           "rules": rules}}
    if reference is not None:
        service["reference"] = {"path": str(reference)}
    return {"storage": {"url": f"sqlite:///{root / 'tw.db'}"}, "services": [service]}


def _cases() -> list:
    out = []
    for fmt in ("csv", "jsonl", "parquet"):
        # Declared binary classes: every spelling, booleans included, against every other one.
        classes = {"csv": ["0", "1"], "jsonl": ["0", "1"], "parquet": ["false", "true"]}[fmt]
        for i in range(len(ORDER)):
            spell = [ORDER[(i + k) % len(ORDER)] for k in range(4)]
            out.append(pytest.param(fmt, classes, *spell, id=f"{fmt}-declared-{'-'.join(spell)}"))
        # Undeclared classes: numbers in any spelling name one class.
        for i in range(len(NUMERIC)):
            spell = [NUMERIC[(i + k) % len(NUMERIC)] for k in range(4)]
            out.append(pytest.param(fmt, None, *spell, id=f"{fmt}-inferred-{'-'.join(spell)}"))
    return out


@pytest.mark.parametrize(("fmt", "classes", "ref_label", "ref_pred", "label", "pred"), _cases())
def test_reference_quality_matches_serving_classes_whatever_their_spelling(
        tmp_path: Path, fmt: str, classes, ref_label: str, ref_pred: str, label: str, pred: str) -> None:
    reference = tmp_path / f"reference.{fmt}"
    ref_accuracy, ref_recall = _write_reference(reference, ref_label, ref_pred)
    serving_fmt = "parquet" if fmt == "jsonl" else "jsonl"
    accuracy, recall = _write_serving(tmp_path, label, pred, serving_fmt)
    one = "true" if classes == ["false", "true"] else "1"
    cfg = config_mod.parse(_raw(tmp_path, classes, _rules(one), reference), base_dir=tmp_path)
    service = cfg.services[0]

    ref = reference_quality(service).values
    assert ref[("accuracy", "all", "all")] == pytest.approx(ref_accuracy)
    assert ref[("recall", one, "all")] == pytest.approx(ref_recall)
    assert ref_accuracy > 0.8 and ref_recall > 0.8  # the figures above are the model's, not a mismatch's 0.0

    # reference build: the label and prediction profiles hold the class names, as serving rows are named
    profile = build_profile(read_reference(reference), service.schema_)
    names = {"false", "true"} if one == "true" else {"0", "1"}
    assert set(profile.label.categories) == set(profile.prediction.categories) == names

    store = Store(cfg.storage.url)
    try:
        store.upgrade()
        now = T0 + timedelta(hours=2)
        result = tick(cfg, store, now)[0]
        assert result.status == "ok", result.error
        assert not result.quarantined
        windows = score_service(cfg, service, store, now, windows=[(T0, T0 + timedelta(hours=1))])
        with store.transaction() as session:
            drift = [f for f in store.findings.load(session, "svc", check="prediction_drift")
                     if f["labels"] == {"output": "prediction"} and f["window_end"] - f["window_start"] == timedelta(hours=1)]
    finally:
        store.dispose()
    # Serving predictions fall in the reference's classes: the predicted class balance barely moved
    # (a name that matched no reference class would put every prediction in the `other` bin).
    assert drift and all(f["value"] < 0.1 for f in drift), [(f["value"], f["status"]) for f in drift]
    findings = [f for w in windows for f in w.findings]
    quality = {(f.labels["metric"], f.labels["class"]): f for f in findings
               if f.check == "quality" and f.labels["group"] == "all"}
    assert quality[("accuracy", "all")].value == pytest.approx(accuracy)
    assert quality[("recall", one)].value == pytest.approx(recall)
    acceptance = {f.labels["rule"]: f for f in findings if f.check == "acceptance"}
    assert set(acceptance) == {"recall", "accuracy"}
    for name, base in (("recall", ref_recall), ("accuracy", ref_accuracy)):
        f = acceptance[name]
        assert f.status == "ok", (f.status, f.detail)
        assert f.baseline == pytest.approx(base) and f.detail["floor"] == pytest.approx(base - 0.1)
