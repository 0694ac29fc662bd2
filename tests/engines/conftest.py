"""Fixtures of the engine tests: one simulated scenario ticked by the runner, the same rows as a joined
Parquet dataset, and a LocalCluster of two worker processes."""

from __future__ import annotations

import shutil
from datetime import timedelta

import pandas as pd
import pytest
import yaml

from monitor import config as config_mod
from monitor.daemon.engines import dataset as layout
from monitor.daemon.runner import tick
from monitor.demo import demo_config
from monitor.simulate import generate
from storage.store import Store

SCENARIO, HOURS, ONSET_HOURS, RATE, SEED = "both-long-inputs", 1.5, 0.75, 3.0, 7


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> dict:
    """The scenario's logs, config, the runner's store after two ticks, and the joined dataset."""
    root = tmp_path_factory.mktemp("engines")
    truth = generate(SCENARIO, root / "generated", seed=SEED, hours=HOURS, onset_hours=ONSET_HOURS,
                     rate_per_s=RATE, otlp=False)
    for kind in ("predictions", "timings"):
        shutil.copytree(root / "generated" / kind, root / "logs" / kind)
    (root / "tailwatch.yaml").write_text(yaml.safe_dump(demo_config(root), sort_keys=False))
    config = config_mod.load(root / "tailwatch.yaml")
    now = pd.Timestamp(truth.end).to_pydatetime() + timedelta(hours=1)
    runner_store = Store(f"sqlite:///{root / 'runner.db'}")
    runner_store.upgrade()
    # The second tick, past the join's lateness, folds any prediction still waiting for its timings.
    reports = tick(config, runner_store, now) + tick(config, runner_store, now + timedelta(minutes=10))
    assert [r.status for r in reports] == ["ok", "ok"], [r.error for r in reports]
    rows = layout.joined_rows(layout.read_jsonl(root / "generated" / "predictions"),
                              layout.read_jsonl(root / "generated" / "timings"))
    layout.write_dataset(rows, root / "dataset", rows_per_file=5_000)
    yield {"root": root, "config": config, "now": now, "runner": runner_store, "dataset": str(root / "dataset"),
           "rows": len(rows), "folded": sum(r.folded for r in reports)}
    runner_store.dispose()


@pytest.fixture(scope="session")
def cluster_client():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        yield client
    assert cluster.status.name == "closed"


