"""The command line as a user runs it: a real subprocess of the installed `tailwatch` script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests_support import valid_lines

EXE = shutil.which("tailwatch", path=str(Path(sys.executable).parent))


def tw(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


def test_help_lists_every_command(tmp_path):
    result = tw("--help", cwd=tmp_path)
    assert result.returncode == 0
    for command in ("init", "demo", "tick", "run", "backfill", "nightly", "query", "explain", "report", "db"):
        assert command in result.stdout


@pytest.mark.parametrize("command", [["run", "--once"], ["nightly"], ["query", "findings"], ["alerts"]])
def test_commands_without_a_config_fail_cleanly(tmp_path, command):
    result = tw(*command, cwd=tmp_path)
    assert result.returncode == 2
    assert "tailwatch.yaml" in result.stderr and "Traceback" not in result.stderr + result.stdout


def test_config_error_exits_nonzero_without_traceback(tmp_path):
    (tmp_path / "tailwatch.yaml").write_text(
        "services:\n  - name: churn\n    sources: {predictions: {kind: files, path: ./logs}}\n")
    result = tw("tick", cwd=tmp_path)
    assert result.returncode == 2
    assert "services[0].sources.predictions.path: directory does not exist: ./logs" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_init_upgrade_tick_end_to_end(tmp_path):
    assert tw("init", cwd=tmp_path).returncode == 0
    assert tw("init", cwd=tmp_path).returncode == 2  # refuses to overwrite
    for name in ("predictions", "timings", "labels"):
        (tmp_path / "logs" / name).mkdir(parents=True)
    result = tw("tick", cwd=tmp_path)
    assert result.returncode == 2 and "tailwatch db upgrade" in result.stderr
    assert tw("db", "upgrade", cwd=tmp_path).returncode == 0
    (tmp_path / "logs" / "predictions" / "a.jsonl").write_text(valid_lines(20) + "{broken\n")
    result = tw("tick", "--now", "2026-11-02T12:00:00Z", "--format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [report] = json.loads(result.stdout)
    assert report["read"] == {"predictions": 21} and report["accepted"] == {"predictions": 20}
    assert report["quarantined"] == {"unparseable": 1}
    table = tw("tick", "--now", "2026-11-02T12:05:00Z", cwd=tmp_path)
    assert table.returncode == 0 and "quarantined" in table.stdout
    assert tw("tick", "--now", "yesterday-ish", cwd=tmp_path).returncode == 2


def test_config_option_and_environment_variable(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    tw("init", "elsewhere/tw.yaml", cwd=tmp_path)
    by_option = tw("--config", "elsewhere/tw.yaml", "db", "current", cwd=tmp_path)
    by_env = tw("db", "current", cwd=tmp_path, env={"TAILWATCH_CONFIG": "elsewhere/tw.yaml"})
    # The example config points at ./logs/..., which does not exist next to it: both routes read that file.
    assert "directory does not exist: ./logs/predictions" in by_option.stderr
    assert by_option.stderr == by_env.stderr
