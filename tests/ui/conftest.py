"""Stores filled by the real pipeline for the web pages: simulator scenarios (three hours, the fault from
half-way) replayed into growing log files and ticked every 15 minutes by the daemon's tick job (verdicts,
incidents), with the demo's malformed lines in the quarantine; and the app served by uvicorn on a free
loopback port in a thread."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

import pandas as pd
import pytest
import yaml
from ui_support import HOSTILE, Served, serving

from monitor import config as config_mod
from storage.store import Store

HOURS, ONSET_HOURS, SEED = 3.0, 1.5, 7


def scenario_run(root, scenario: str, hostile: bool = False) -> dict:
    """Generate, replay and tick `scenario` in `root` (the daemon's tick job: verdicts and incidents);
    `hostile`: then one more tick over a line holding HTML markup."""
    from monitor.daemon.jobs import tick_job
    from monitor.demo import demo_config, replay
    from monitor.simulate import generate

    truth = generate(scenario, root / "generated", seed=SEED, hours=HOURS, onset_hours=ONSET_HOURS, otlp=False)
    for kind in ("predictions", "timings"):
        (root / "logs" / kind).mkdir(parents=True, exist_ok=True)
    raw = demo_config(root)
    raw["ui"] = {"external_url": "https://tailwatch.example.org/ui/"}
    (root / "tailwatch.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = config_mod.load(root / "tailwatch.yaml")
    store = Store(cfg.storage.url)
    store.upgrade()
    try:
        reports = replay(root, cfg, store, truth, None, job=tick_job)
        if hostile:
            last = pd.Timestamp(truth.end) + timedelta(minutes=30)
            ts = f"{last - timedelta(minutes=5):%Y-%m-%dT%H:%M:%SZ}"
            line = {"request_id": HOSTILE, "ts": ts, "model_version": "v2", "status": HOSTILE}
            (root / "logs" / "predictions" / "hostile.jsonl").write_text(json.dumps(line) + "\n")
            reports += tick_job(cfg, store, last.to_pydatetime())
    finally:
        store.dispose()
    assert all(r.status == "ok" for r in reports), [r.error for r in reports]
    return {"root": root, "config": cfg, "truth": truth}


@pytest.fixture(scope="session")
def ui_run(tmp_path_factory) -> dict:
    """`slower-cache` (v2's new cache key: fewer hits, slower requests), with a hostile quarantined line."""
    return scenario_run(tmp_path_factory.mktemp("ui-slower-cache"), "slower-cache", hostile=True)


@pytest.fixture(scope="session")
def drift_run(tmp_path_factory) -> dict:
    """`drift-new-category`: inputs drift from the reference under the same version."""
    return scenario_run(tmp_path_factory.mktemp("ui-drift"), "drift-new-category")


@pytest.fixture(scope="session")
def incident(ui_run) -> dict:
    """The incident `slower-cache` opened for v2, as `query.incidents` gives it."""
    from monitor.investigate import query

    store = Store(ui_run["config"].storage.url)
    try:
        found = query.incidents(store, "churn", model_version="v2")
    finally:
        store.dispose()
    assert len(found), "the scenario opened no incident for v2"
    return found.iloc[0].to_dict()


@pytest.fixture(scope="session")
def incident_id(incident) -> int:
    return int(incident["id"])


@pytest.fixture(scope="module")
def served(ui_run) -> Iterator[Served]:
    """The app over the scenario's store, read-only (no silence token)."""
    with serving(ui_run["config"]) as (server, _):
        yield server
