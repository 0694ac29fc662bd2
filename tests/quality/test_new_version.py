"""A new version is judged against the accepted one: scikit-learn's Digits served by a small MLP (v1, the
accepted version) and then by its int8 quantization (v2: weights and hidden activations in int8, about two
points less accurate on the same inputs). v2 replaces v1 and shares no window with it; the 300-row
reference is too small to show a two-point drop, v1's own last windows (thousands of labels) are not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from monitor import config as config_mod
from monitor.verdicts.quality import score_service
from monitor.verdicts.verdict import decide

T0 = datetime(2026, 11, 2, tzinfo=UTC)
DAY = timedelta(days=1)
CLASSES = [str(c) for c in range(10)]
PER_DAY = 4000  # predictions a day, every one labelled (a day late)


@pytest.fixture(scope="module")
def models():
    """(pool features, pool labels, v1 probabilities, v2 probabilities, reference frame)."""
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(x))
    train, ref, pool = order[:1000], order[1000:1300], order[1000:]
    mlp = MLPClassifier((32,), max_iter=800, random_state=0).fit(x[train], y[train])

    def int8(w):
        scale = np.abs(w).max() / 127
        return np.clip(np.round(w / scale), -127, 127) * scale

    w1, w2, (b1, b2) = int8(mlp.coefs_[0]), int8(mlp.coefs_[1]), mlp.intercepts_
    step = np.percentile(np.maximum(x[train][:64] @ w1 + b1, 0), 90) / 127  # the activations' int8 range

    def v2(features):
        z = np.clip(np.round(np.maximum(features @ w1 + b1, 0) / step), 0, 127) * step @ w2 + b2
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    p1, p2 = mlp.predict_proba(x[pool]), v2(x[pool])
    reference = pd.DataFrame({"label": y[ref].astype(str), "prediction": mlp.predict(x[ref]).astype(str), "x": 1.0})
    for c, col in zip(CLASSES, mlp.predict_proba(x[ref]).T, strict=True):
        reference[f"score_{c}"] = col.round(4)
    return y[pool].astype(str), p1, p2, reference


def _service(root: Path, reference: pd.DataFrame):
    reference.to_csv(root / "reference.csv", index=False)
    for d in ("p", "l"):
        (root / d).mkdir(exist_ok=True)
    raw = {"storage": {"url": "sqlite://"}, "services": [{
        "name": "svc",
        "sources": {"predictions": {"kind": "files", "path": str(root / "p")},
                    "labels": {"kind": "files", "path": str(root / "l")}},
        "schema": {"features": {"x": "numeric"}, "classes": CLASSES},
        "reference": {"path": str(root / "reference.csv")},
        "accepted_versions": ["v1"],
        "quality": {"windows": ["1d"], "min_n": 30, "bootstrap_samples": 100, "accepted_version": "v1",
                    "rules": [{"name": "accuracy", "metric": "accuracy", "class": "all", "max_drop": 0.005}]},
    }]}
    return config_mod.parse(raw, base_dir=root).services[0]


def _store_day(store, day: int, version: str, models, rng, labels: bool) -> None:
    y, p1, p2 = models[:3]
    proba = p1 if version == "v1" else p2
    pick = rng.integers(0, len(y), PER_DAY)
    start = T0 + day * DAY
    ids = [f"{version}-{day}-{i}" for i in range(PER_DAY)]
    with store.transaction() as session:
        store.labels.add_predictions(session, "svc", [
            {"request_id": rid, "model_version": version, "ts": start + DAY * (i + 0.5) / PER_DAY, "status": "ok",
             "prediction": CLASSES[int(proba[j].argmax())],
             "scores": {c: round(float(v), 4) for c, v in zip(CLASSES, proba[j], strict=True)}, "attrs": {"x": 1.0}}
            for i, (rid, j) in enumerate(zip(ids, pick, strict=True))])
        if labels:
            store.labels.upsert(session, "svc", [{"request_id": rid, "label": y[j], "label_ts": None}
                                                 for rid, j in zip(ids, pick, strict=True)], start + 2 * DAY)


def _verdict(store, day: int, version: str):
    start = T0 + day * DAY
    with store.transaction() as session:
        found = [f for f in store.findings.load(session, "svc", since=start, until=start + DAY)
                 if f["model_version"] == version]
    sightings = [{"kind": "model_version", "value": "v1", "first_seen": T0},
                 {"kind": "model_version", "value": "v2", "first_seen": T0 + 8 * DAY}]
    return decide(found, service="svc", model_version=version, window_start=start, window_end=start + DAY,
                  now=start + 2 * DAY, versions=sightings, accepted_versions=["v1"]), found


def test_a_quantized_version_is_worse_against_the_accepted_one(store, tmp_path: Path, models) -> None:
    y, p1, p2, reference = models
    a1, a2 = (p1.argmax(axis=1).astype(str) == y).mean(), (p2.argmax(axis=1).astype(str) == y).mean()
    assert 0.94 < a1 < 0.98 and 0.012 < a1 - a2 < 0.04  # measured on the same inputs: a little worse
    svc = _service(tmp_path, reference)
    cfg = config_mod.Config.model_construct(services=[svc])
    rng = np.random.default_rng(1)
    for day in range(8):  # v1, accepted, serves alone
        _store_day(store, day, "v1", models, rng, labels=True)
    for day in range(8, 10):  # then v2 alone, its labels in
        _store_day(store, day, "v2", models, rng, labels=True)
    _store_day(store, 10, "v2", models, rng, labels=False)  # its labels still to come
    days = [(T0 + d * DAY, T0 + (d + 1) * DAY) for d in range(11)]
    score_service(cfg, svc, store, T0 + 11 * DAY, days)

    for day in (8, 9):  # on labels: against v1's last seven days, not the reference
        verdict, found = _verdict(store, day, "v2")
        [rule] = [f for f in found if f["check"] == "acceptance"]
        assert rule["status"] == "breach", (rule["value"], rule["baseline"], rule["p_value"], rule["detail"])
        assert rule["detail"]["baseline_from"] == "version v1, its last 7 windows"
        assert rule["detail"]["baseline_n"] == 7 * PER_DAY and not rule["detail"].get("estimated")
        assert verdict.verdict == "worse" and not verdict.estimated and verdict.rollback_to == "v1"
    for day in range(8):
        verdict, found = _verdict(store, day, "v1")
        assert verdict.verdict == "healthy" and not [f for f in found if f["status"] == "breach"]

    # Before its labels: its estimate against v1's estimates over its last days.
    verdict, found = _verdict(store, 10, "v2")
    [rule] = [f for f in found if f["check"] == "acceptance"]
    assert rule["detail"]["estimated"] is True and rule["detail"]["baseline_from"].startswith("version v1")
    assert rule["status"] == "breach", rule
    assert verdict.verdict == "worse" and verdict.estimated and verdict.rollback_to == "v1"

    # The reference alone (300 rows) could not tell: the same labelled day against it is undecided.
    from monitor.verdicts.quality import reference_quality, score_window

    with store.transaction() as session:
        rows = store.labels.load(session, "svc", *days[8])
    [alone] = score_window(svc, rows, *days[8], T0 + 11 * DAY, reference_quality(svc))
    [rule] = [f for f in alone.findings if f.check == "acceptance"]
    assert rule.detail["baseline_from"] == "reference" and rule.status != "breach"
