"""`tailwatch alerts`, `silence create/list/expire` and `notify drain` through the typer app (in-process:
a subprocess per command costs seconds each on a loaded machine; tests/monitor/test_cli.py covers the
installed script)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from alerts_support import TOKEN
from test_after_tick import at, write_window
from typer.testing import CliRunner

from monitor import config as config_mod
from monitor.alerts.evaluate import after_tick
from storage.store import Store


def tw(*args: str, cwd: Path):
    from monitor.cli import app

    return CliRunner().invoke(app, ["--config", str(cwd / "tailwatch.yaml"), *args],
                              env={"COLUMNS": "250", "TW_SLACK_TOKEN": TOKEN})


def slower_store(tmp_path: Path, alerts: dict) -> str:
    """A one-service config with `alerts` in tmp_path, its database upgraded, one `slower` window stored and
    the alert stage run at at(1); returns that clock as RFC 3339."""
    (tmp_path / "logs").mkdir()
    raw = {"storage": {"url": "sqlite:///tw.db"},
           "services": [{"name": "churn", "sources": {"predictions": {"kind": "files", "path": "./logs"}},
                         "buckets": {"size": "5m", "windows": ["15m"]}, "join": {"lateness": "5m"}}],
           "alerts": alerts}
    (tmp_path / "tailwatch.yaml").write_text(yaml.safe_dump(raw))
    assert tw("db", "upgrade", cwd=tmp_path).exit_code == 0
    config = config_mod.load(tmp_path / "tailwatch.yaml")
    store = Store(config.storage.url)
    try:
        write_window(store, 0, "slower")
        after_tick(config, store, at(1))
    finally:
        store.dispose()
    return at(1).isoformat()


def test_alerts_silences_and_drain_from_the_command_line(tmp_path, fake_slack):
    now = slower_store(tmp_path, {"group_wait": "0s", "slack": {
        "token": {"env": "TW_SLACK_TOKEN"}, "channel": "#alerts", "base_url": fake_slack.base_url, "timeout": "2s"}})

    listed = tw("alerts", "--now", now, cwd=tmp_path)
    assert listed.exit_code == 0, listed.output
    assert "firing" in listed.stdout and "ModelRegression" in listed.stdout and "model_version=v2" in listed.stdout

    created = tw("silence", "create", "--matcher", "service=churn", "--matcher", "alertname=~Model.*",
                 "--duration", "2h", "--comment", "deploy in progress", "--by", "alice", "--now", now, cwd=tmp_path)
    assert created.exit_code == 0, created.output
    assert "silence 1 until" in created.stdout
    assert "silence 1" in tw("alerts", "--now", now, cwd=tmp_path).stdout  # shown as muted
    silences = tw("silence", "list", "--now", now, cwd=tmp_path).stdout
    assert "deploy in progress" in silences and "active" in silences and "alertname=~Model.*" in silences
    bad = tw("silence", "create", "--matcher", "nonsense", cwd=tmp_path)
    assert bad.exit_code != 0 and "not a matcher" in bad.stderr
    assert tw("silence", "expire", "1", "--now", now, cwd=tmp_path).exit_code == 0
    assert tw("silence", "expire", "1", "--now", now, cwd=tmp_path).exit_code != 0  # already ended
    assert "expired" in tw("silence", "list", "--all", "--now", now, cwd=tmp_path).stdout

    drained = tw("notify", "drain", "--now", now, cwd=tmp_path)
    assert drained.exit_code == 0, drained.output
    assert "sent 1" in drained.stdout and len(fake_slack.top_level) == 1
    assert TOKEN not in drained.stdout + drained.stderr + listed.stdout


def test_alerts_and_silences_fit_80_columns_and_show_what_was_typed_as_written(tmp_path, fake_slack):
    from monitor.cli import app

    now = slower_store(tmp_path, {"group_wait": "0s", "slack": {
        "token": {"env": "TW_SLACK_TOKEN"}, "channel": "#alerts", "base_url": fake_slack.base_url, "timeout": "2s"}})
    comment = "[bold]deploy[/bold] until [red]noon"
    assert tw("silence", "create", "--matcher", "service=churn", "--duration", "2h", "--comment", comment,
              "--by", "alice", "--now", now, cwd=tmp_path).exit_code == 0

    def narrow(*args):
        return CliRunner().invoke(app, ["--config", str(tmp_path / "tailwatch.yaml"), *args, "--now", now],
                                  env={"COLUMNS": "80", "TW_SLACK_TOKEN": TOKEN})

    for shown in (narrow("alerts"), narrow("silence", "list")):
        assert shown.exit_code == 0, shown.output
        lines = shown.stdout.splitlines()
        assert all(len(line) <= 80 for line in lines), shown.stdout
        assert "left out at this width" in shown.stdout  # named, not cut at the terminal's edge
    alerts = narrow("alerts").stdout
    assert "firing" in alerts and "ModelRegression" in alerts and "model_version=v2" in alerts
    # Wide enough, each column whole: the summary is never cut short.
    wide = tw("alerts", "--now", now, cwd=tmp_path).stdout
    summary = json.loads(tw("alerts", "--now", now, "--format", "json", cwd=tmp_path).stdout)["alerts"][0]["summary"]
    assert summary and " ".join(summary.split()) in " ".join(c.strip() for line in wide.splitlines()
                                                            for c in line.split("│")[6:7])
    silences = tw("silence", "list", "--now", now, cwd=tmp_path).stdout
    assert comment in silences and "alice" in silences
