"""The command line as a user runs it. The installed `tailwatch` script runs as a real subprocess for
`--help` and for an error exit (exit code and stderr as a shell sees them, no traceback); the other
commands go through the same typer app in-process, from the same working directory and environment,
which proves the same exit codes and output without a Python start-up (over a second) per command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests_support import valid_lines
from typer.testing import CliRunner

from monitor.cli import app

EXE = shutil.which("tailwatch", path=str(Path(sys.executable).parent))


def tw(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """The installed script in a subprocess."""
    return subprocess.run([EXE, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


@pytest.fixture
def cli(monkeypatch):
    """`cli(*args, cwd=..., env=...)`: the app in-process, run from `cwd`; an exception that would end in a
    traceback fails the test instead of becoming an exit code."""

    def invoke(*args: str, cwd: Path, env: dict | None = None):
        monkeypatch.chdir(cwd)
        return CliRunner().invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "200", **(env or {})})

    return invoke


def test_help_lists_every_command(tmp_path):
    result = tw("--help", cwd=tmp_path)
    assert result.returncode == 0
    for command in ("init", "demo", "tick", "run", "backfill", "nightly", "query", "explain", "report", "db"):
        assert command in result.stdout


@pytest.mark.parametrize("command", [["run", "--once"], ["nightly"], ["query", "findings"], ["alerts"]])
def test_commands_without_a_config_fail_cleanly(tmp_path, cli, command):
    result = cli(*command, cwd=tmp_path)
    assert result.exit_code == 2
    assert "tailwatch.yaml" in result.stderr and "Traceback" not in result.stderr + result.stdout


def test_config_error_exits_nonzero_without_traceback(tmp_path):
    (tmp_path / "tailwatch.yaml").write_text(
        "services:\n  - name: churn\n    sources: {predictions: {kind: files, path: ./logs}}\n")
    result = tw("tick", cwd=tmp_path)
    assert result.returncode == 2
    assert "services[0].sources.predictions.path: directory does not exist: ./logs" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_init_upgrade_tick_end_to_end(tmp_path, cli):
    assert cli("init", cwd=tmp_path).exit_code == 0
    assert cli("init", cwd=tmp_path).exit_code == 2  # refuses to overwrite
    for name in ("predictions", "timings", "labels"):
        (tmp_path / "logs" / name).mkdir(parents=True)
    result = cli("tick", cwd=tmp_path)
    assert result.exit_code == 2 and "tailwatch db upgrade" in result.stderr
    assert cli("db", "upgrade", cwd=tmp_path).exit_code == 0
    (tmp_path / "logs" / "predictions" / "a.jsonl").write_text(valid_lines(20) + "{broken\n")
    result = cli("tick", "--now", "2026-11-02T12:00:00Z", "--format", "json", cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    [report] = json.loads(result.stdout)
    assert report["read"] == {"predictions": 21} and report["accepted"] == {"predictions": 20}
    assert report["quarantined"] == {"unparseable": 1}
    table = cli("tick", "--now", "2026-11-02T12:05:00Z", cwd=tmp_path)
    assert table.exit_code == 0 and "quarantined" in table.stdout
    assert cli("tick", "--now", "yesterday-ish", cwd=tmp_path).exit_code == 2


def test_config_option_and_environment_variable(tmp_path, cli):
    (tmp_path / "elsewhere").mkdir()
    cli("init", "elsewhere/tw.yaml", cwd=tmp_path)
    by_option = cli("--config", "elsewhere/tw.yaml", "tick", cwd=tmp_path)
    by_env = cli("tick", cwd=tmp_path, env={"TAILWATCH_CONFIG": "elsewhere/tw.yaml"})
    # The example config points at ./logs/..., which does not exist next to it: both routes read that file.
    assert "directory does not exist: ./logs/predictions" in by_option.stderr
    assert by_option.stderr == by_env.stderr
