"""A store filled by the real pipeline for the Prometheus tests: `slower-cache` (v1, then v2 from the onset)
replayed for two hours with the daemon's tick job, then every label released and ticked once more days
later, so latency, drift, verdicts and matured quality are all stored."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import yaml

from monitor import config as config_mod
from monitor.daemon.jobs import tick_job
from monitor.durations import duration_text
from storage.store import Store

HOURS, ONSET_HOURS, SEED = 2.0, 1.0, 3
LABELS_AFTER = timedelta(days=4)  # when the last tick runs, every label known by then


def fill(root: Path) -> tuple[config_mod.Config, datetime]:
    """Generate, replay and tick under `root`; returns the config and the clock its metrics are read at."""
    from monitor.demo import demo_config, replay
    from monitor.simulate import generate

    truth = generate("slower-cache", root / "generated", seed=SEED, hours=HOURS, onset_hours=ONSET_HOURS,
                     otlp=False)
    for kind in ("predictions", "timings", "labels"):
        (root / "logs" / kind).mkdir(parents=True, exist_ok=True)
    raw = demo_config(root)
    service = raw["services"][0]
    service["sources"]["labels"] = {"kind": "files", "path": "./logs/labels", "pattern": "*.jsonl"}
    service["quality"] = {"windows": ["1h"], "min_n": 30, "coverage_threshold": 0.3,
                          "groups": {"short_tenure": "tenure < 12"}}
    raw["metrics"] = {"lookback": "90m"}  # v1 served until the onset, an hour before the end
    (root / "tailwatch.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = config_mod.load(root / "tailwatch.yaml")
    store = Store(cfg.storage.url)
    store.upgrade()
    try:
        reports = replay(root, cfg, store, truth, None, job=tick_job)
        assert all(r.status == "ok" for r in reports), [r.error for r in reports]
        for path in sorted((root / "generated" / "labels").glob("*.jsonl")):
            shutil.copy(path, root / "logs" / "labels" / path.name)
        end = pd.Timestamp(truth.end).to_pydatetime()
        assert all(r.status == "ok" for r in tick_job(cfg, store, end + LABELS_AFTER))

    finally:
        store.dispose()
    # Read at the end of the run: its last windows are the last closed ones, and the quality scored days
    # later for windows of the run is within lookback plus the maturity horizon.
    return cfg, end


def stored(cfg: config_mod.Config) -> dict[tuple[str, tuple], float]:
    """What the store holds for the newest window of each version and length, as the series the exporter names
    them: stage latency (seconds), drift per field, quality and its n. Read straight from the stored rows."""
    store = Store(cfg.storage.url)
    try:
        with store.transaction() as session:
            rows = store.findings.load(session, cfg.services[0].name)
    finally:
        store.dispose()
    newest: dict[tuple, datetime] = {}
    for r in rows:
        k = (r["check"], r["model_version"], r["window_end"] - r["window_start"])
        newest[k] = max(newest.get(k, r["window_end"]), r["window_end"])
    out = {}
    for r in rows:
        length = r["window_end"] - r["window_start"]
        if r["window_end"] != newest[(r["check"], r["model_version"], length)]:
            continue
        base = {"service": r["service"], "model_version": r["model_version"], "window": duration_text(length)}
        labels = r["labels"] or {}
        if r["value"] is None:  # a figure without a value is not exported; quality's n still is
            if r["check"] == "quality":
                out[_key("tailwatch_quality_samples", base | labels)] = r["n"]
        elif r["check"] == "latency" and labels.keys() == {"stage", "quantile"}:
            out[_key("tailwatch_stage_latency_seconds", base | labels)] = r["value"] / 1000
        elif r["check"] == "drift" and labels.keys() == {"field"}:
            out[_key("tailwatch_field_drift_psi", base | labels)] = r["value"]
        elif r["check"] == "quality":
            out[_key("tailwatch_quality_score", base | labels)] = r["value"]
            out[_key("tailwatch_quality_samples", base | labels)] = r["n"]
    return out


def _key(name: str, labels: dict) -> tuple[str, tuple]:
    return name, tuple(sorted(labels.items()))
