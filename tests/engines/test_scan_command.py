"""`tailwatch scan` as a user runs it, and the `engine:` config section."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from monitor import config as config_mod
from monitor.config import ConfigError
from storage.store import Store

EXE = shutil.which("tailwatch", path=str(Path(sys.executable).parent))


def tw(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})


def test_scan_command_folds_stores_and_scores(world, tmp_path):
    raw = yaml.safe_load((world["root"] / "tailwatch.yaml").read_text())
    raw["storage"]["url"] = f"sqlite:///{tmp_path / 'scan.db'}"
    raw["engine"] = {"kind": "local", "partition_rows": 4000}
    cfg = world["root"] / "scan.yaml"  # beside the logs and reference its relative paths name
    cfg.write_text(yaml.safe_dump(raw))
    assert tw("-c", str(cfg), "db", "upgrade", cwd=tmp_path).returncode == 0
    now = world["now"].isoformat()
    result = tw("-c", str(cfg), "scan", world["dataset"], "--now", now, "--until", "2026-11-02T01:00:00Z", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "engine local" in result.stdout and "breach" in result.stdout
    store = Store(raw["storage"]["url"])
    try:
        with store.transaction() as session:
            findings = store.findings.load(session, "churn")
            partials = store.partials.load(session, "churn", world["now"].replace(year=2000), world["now"])
    finally:
        store.dispose()
    assert partials and max(p.bucket_start for p in partials).isoformat() < "2026-11-02T01:00"
    assert any(f["status"] == "breach" for f in findings)
    assert all(f["window_end"] <= world["now"] for f in findings)


def test_scan_command_rejects_a_bad_engine(world, tmp_path):
    cfg = world["root"] / "tailwatch.yaml"
    result = tw("-c", str(cfg), "scan", world["dataset"], "--engine", "spark", cwd=tmp_path)
    assert result.returncode == 2 and "--engine" in result.stderr and "Traceback" not in result.stderr


def test_engine_section(tmp_path):
    raw = {"services": [{"name": "s", "sources": {"predictions": {"kind": "files", "path": "."}}}]}
    assert config_mod.parse(raw, tmp_path).engine.kind == "local"
    cfg = config_mod.parse(raw | {"engine": {"kind": "dask", "scheduler": "tcp://10.0.0.5:8786", "n_workers": 8,
                                             "partition_rows": 200_000}}, tmp_path)
    assert (cfg.engine.kind, cfg.engine.scheduler, cfg.engine.n_workers) == ("dask", "tcp://10.0.0.5:8786", 8)
    with pytest.raises(ConfigError, match="engine.scheduler"):
        config_mod.parse(raw | {"engine": {"kind": "dask", "scheduler": "10.0.0.5:8786"}}, tmp_path)
    with pytest.raises(ConfigError, match="engine.partition_rows"):
        config_mod.parse(raw | {"engine": {"partition_rows": 0}}, tmp_path)
