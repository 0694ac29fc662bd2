"""Every quality finding that has a value carries its n and a 95% interval: on a realistic window of three
classes with scores, segments, a rare class, a shadow version and labels still arriving."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from monitor import config as config_mod
from monitor.verdicts.quality import reference_quality, score_window

T0 = datetime(2026, 11, 2, tzinfo=UTC)
CLASSES = ("a", "b", "c")


def draw(n: int, rng: np.random.Generator, rare: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels (class c is `rare`), softmax scores that mostly favour the label, and the argmax."""
    y = rng.choice(CLASSES, n, p=[(1 - rare) * 0.6, (1 - rare) * 0.4, rare])
    logits = rng.normal(0, 1, (n, 3)) + 2.0 * (y[:, None] == np.array(CLASSES)[None, :])
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return y, p, np.array(CLASSES)[p.argmax(axis=1)]


def test_every_quality_finding_with_a_value_has_n_and_an_interval(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    y, p, pred = draw(800, rng, rare=0.05)
    reference = pd.DataFrame({"label": y, "prediction": pred, "x": rng.normal(0, 1, 800),
                              "region": rng.choice(["eu", "us"], 800), **{f"score_{c}": p[:, i]
                                                                          for i, c in enumerate(CLASSES)}})
    reference.to_csv(tmp_path / "reference.csv", index=False)
    raw = {"storage": {"url": "sqlite://"}, "services": [{
        "name": "svc",
        "sources": {"predictions": {"kind": "files", "path": str(tmp_path)},
                    "labels": {"kind": "files", "path": str(tmp_path)}},
        "schema": {"features": {"x": "numeric", "region": "categorical"}, "segments": ["region"],
                   "classes": list(CLASSES)},
        "reference": {"path": str(tmp_path / "reference.csv")},
        "quality": {"windows": ["1h"], "min_n": 30, "bootstrap_samples": 100, "accepted_version": "v1",
                    "groups": {"low_x": "x < -0.5"},
                    "rules": [{"metric": "recall", "class": "a", "max_drop": 0.05},
                              {"metric": "f1", "class": "macro", "group": "*", "max_drop": 0.05},
                              {"metric": "roc_auc", "class": "c", "min": 0.6},
                              {"metric": "accuracy", "class": "all", "max_drop": 0.02}]},
    }]}
    svc = config_mod.parse(raw, base_dir=tmp_path).services[0]

    rows = []
    y, p, pred = draw(600, rng, rare=0.008)  # a handful of class c: its AUC is undefined on many resamples
    x, region = rng.normal(0, 1, 600), rng.choice(["eu", "us"], 600)
    known = rng.random(600) < 0.9  # labels still arriving
    status = rng.choice(["ok", "timeout"], 600, p=[0.98, 0.02])
    for version, shift in (("v1", 0.0), ("v2", 0.3)):
        for i in range(600):
            scores = {c: float(np.clip(p[i, j] + (shift if c == "b" else 0), 0, 1)) for j, c in enumerate(CLASSES)}
            rows.append((f"r{i}", version, T0 + timedelta(seconds=5 * i), status[i],
                         max(scores, key=scores.get), scores, {"x": float(x[i]), "region": region[i]},
                         y[i] if known[i] else None, 0))
    scored = score_window(svc, rows, T0, T0 + timedelta(hours=1), T0 + timedelta(days=1), reference_quality(svc))
    findings = [f for w in scored for f in w.findings]
    checks = {f.check for f in findings}
    assert checks == {"quality", "quality_estimate", "label_coverage", "label_bias", "acceptance", "version_compare"}
    valued = [f for f in findings if f.value is not None]
    assert len(valued) > 300
    missing = [f for f in valued if f.n <= 0 or f.interval is None]
    assert not missing, missing[:3]
    for f in valued:
        lo, hi = f.interval
        assert lo <= hi and np.isfinite([lo, hi]).all(), f
    for f in findings:
        if f.check == "acceptance" and f.status != "insufficient":
            assert f.detail["difference_interval"] is not None and f.n >= 30
            assert f.detail["baseline_n"] is None or f.detail["baseline_n"] > 0
