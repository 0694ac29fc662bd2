"""A store filled by the real pipeline: the `slower-cache` scenario (v1, then v2 from the onset) simulated for
two hours, replayed into growing log files and ticked every 15 minutes on SQLite; the same rows copied into
a fresh PostgreSQL schema for the postgres variants."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from sqlalchemy import insert, select

from monitor import config as config_mod
from storage.models import Base
from storage.store import Store

HOURS, ONSET_HOURS, SEED = 2.0, 1.0, 3


@pytest.fixture(scope="session")
def scenario_run(tmp_path_factory) -> dict:
    """Generate, replay and tick `slower-cache`; the work dir, its config, ground truth and the db path."""
    from monitor.demo import demo_config, replay
    from monitor.simulate import generate

    root = tmp_path_factory.mktemp("slower-cache")
    truth = generate("slower-cache", root / "generated", seed=SEED, hours=HOURS, onset_hours=ONSET_HOURS,
                     otlp=False)
    for kind in ("predictions", "timings"):
        (root / "logs" / kind).mkdir(parents=True, exist_ok=True)
    raw = demo_config(root)
    raw["services"][0]["compare"] = {"hourly_price": 2.5, "version_prices": {"v2": 2.0}, "constraints": [
        {"metric": "total_p99_ms", "max_ratio": 1.5}, {"metric": "cache_hit_rate", "min": 0.2},
        {"metric": "cost_per_1k", "max": 1.0}]}
    (root / "tailwatch.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = config_mod.load(root / "tailwatch.yaml")
    store = Store(cfg.storage.url)
    store.upgrade()
    try:
        reports = replay(root, cfg, store, truth, None)
    finally:
        store.dispose()
    assert all(r.status == "ok" for r in reports), [r.error for r in reports]
    return {"root": root, "config": cfg, "truth": truth, "db": Path(make_path(cfg.storage.url))}


def make_path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def copy_rows(source: Store, target: Store) -> None:
    """Every row of every tailwatch table, from one store into another at the same schema revision."""
    with source.transaction() as src, target.transaction() as dst:
        for table in Base.metadata.sorted_tables:
            rows = [dict(r) for r in src.execute(select(table)).mappings()]
            if rows:
                dst.execute(insert(table), rows)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def filled(request, scenario_run, tmp_path) -> Store:
    """A Store holding the scenario's ticks, partials, findings and quarantine, on each backend."""
    if request.param == "sqlite":
        db = tmp_path / "copy.db"
        shutil.copy(scenario_run["db"], db)
        store = Store(f"sqlite:///{db}")
    else:
        url, connect_args = request.getfixturevalue("pg_schema")
        store = Store(url, connect_args=connect_args)
        store.upgrade()
        source = Store(f"sqlite:///{scenario_run['db']}")
        try:
            copy_rows(source, store)
        finally:
            source.dispose()
    try:
        yield store
    finally:
        store.dispose()
