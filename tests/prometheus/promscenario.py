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
    raw["metrics"] = {"lookback": "5d"}
    (root / "tailwatch.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = config_mod.load(root / "tailwatch.yaml")
    store = Store(cfg.storage.url)
    store.upgrade()
    try:
        reports = replay(root, cfg, store, truth, None, job=tick_job)
        assert all(r.status == "ok" for r in reports), [r.error for r in reports]
        for path in sorted((root / "generated" / "labels").glob("*.jsonl")):
            shutil.copy(path, root / "logs" / "labels" / path.name)
        now = pd.Timestamp(truth.end).to_pydatetime() + LABELS_AFTER
        assert all(r.status == "ok" for r in tick_job(cfg, store, now))
    finally:
        store.dispose()
    return cfg, now
