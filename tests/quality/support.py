"""Simulated scenarios for the quality tests: generate once, feed predictions in one go and labels in
waves by their label_ts (a label is only ever read once it exists)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd

from monitor import config as config_mod

RULES = [
    {"name": "churn recall", "metric": "recall", "class": "Yes", "max_drop": 0.1},
    {"name": "macro f1", "metric": "f1", "class": "macro", "max_drop": 0.1},
    {"name": "short tenure recall", "metric": "recall", "class": "Yes", "group": "short_tenure", "max_drop": 0.1},
]


def simulate(scenario: str, root: Path, hours: float = 6.0, rate_per_s: float = 1.0, seed: int = 7):
    """Generate `scenario` under root/generated; returns its ground truth and every label (a frame)."""
    from monitor.simulate import generate

    truth = generate(scenario, root / "generated", seed=seed, hours=hours, rate_per_s=rate_per_s, otlp=False)
    labels = pd.concat([pd.read_json(p, lines=True, dtype={"request_id": str, "label": str, "label_ts": str})
                        for p in sorted((root / "generated" / "labels").glob("*.jsonl"))], ignore_index=True)
    labels["at"] = pd.to_datetime(labels["label_ts"], utc=True)
    return truth, labels.sort_values("at", kind="stable", ignore_index=True)


def release_labels(root: Path, labels: pd.DataFrame, until: datetime, wave: int) -> int:
    """Write the labels known by `until` and not yet written as one new file; returns how many."""
    (root / "labels").mkdir(exist_ok=True)
    done = root / "labels" / ".released"
    start = int(done.read_text()) if done.exists() else 0
    part = labels[(labels["at"] <= pd.Timestamp(until))].iloc[start:]
    with open(root / "labels" / f"wave-{wave:03d}.jsonl", "w") as fh:
        for r in part.itertuples():
            fh.write(json.dumps({"request_id": r.request_id, "label": r.label, "label_ts": r.label_ts}) + "\n")
    done.write_text(str(start + len(part)))
    return len(part)


def quality_config(root: Path, url: str, **quality) -> config_mod.Config:
    """The simulator's churn service with labels from root/labels and a quality section (overridable)."""
    return config_mod.parse(quality_raw(root, url, **quality), base_dir=root)


def quality_raw(root: Path, url: str, **quality) -> dict:
    (root / "labels").mkdir(exist_ok=True)
    q = {"windows": ["1h"], "min_n": 30, "coverage_threshold": 0.6, "maturity_horizon": "3d",
         "label_horizon": "2d", "groups": {"short_tenure": "tenure < 12"}, "length_buckets": {"notes": [512]},
         "rules": RULES, "bootstrap_samples": 100, "seed": 1} | quality
    return {
        "storage": {"url": url},
        "services": [{
            "name": "churn",
            "sources": {"predictions": {"kind": "files", "path": str(root / "generated" / "predictions")},
                        "labels": {"kind": "files", "path": str(root / "labels"), "pattern": "*.jsonl"}},
            "schema": {"features": {"tenure": "numeric", "MonthlyCharges": "numeric", "Contract": "categorical",
                                    "InternetService": "categorical", "notes": "text"},
                       "segments": ["Contract"], "classes": ["No", "Yes"], "positive_class": "Yes"},
            "reference": {"path": str(root / "generated" / "reference.parquet")},
            "buckets": {"size": "5m", "windows": ["1h"]},
            "quality": q,
        }],
    }


def at(truth, hours: float) -> datetime:
    return datetime.fromisoformat(truth.end.replace("Z", "+00:00")) + timedelta(hours=hours)
