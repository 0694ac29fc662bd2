"""`tailwatch alerts` reports delivery as the daemon stored it (sent, failed, retrying, waiting, to which
channel), whatever the environment of the shell running it: a caller without the Slack token still sees
what the daemon sent, and a daemon that could not send says so even to a caller that could."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from alerts_support import TOKEN
from test_alerts_cli import slower_store

from monitor import config as config_mod
from monitor.notify import drain
from storage.store import Store


def _slack(fake) -> dict:
    return {"group_wait": "0s", "slack": {"token": {"env": "TW_SLACK_TOKEN"}, "channel": "#alerts",
                                          "base_url": fake.base_url, "timeout": "2s", "max_attempts": 3}}


def _daemon_drains(tmp_path, now: str, token: str | None, monkeypatch) -> None:
    """The daemon's drain, in the daemon's environment (its token set, or not)."""
    with monkeypatch.context() as env:
        if token is None:
            env.delenv("TW_SLACK_TOKEN", raising=False)
        else:
            env.setenv("TW_SLACK_TOKEN", token)
        config = config_mod.load(tmp_path / "tailwatch.yaml")
        store = Store(config.storage.url)
        try:
            drain(config, store, datetime.fromisoformat(now))
        finally:
            store.dispose()


def _alerts(tmp_path, now: str, token: str | None):
    """`tailwatch alerts` in a shell with the token (or without it), as text and as JSON."""
    from typer.testing import CliRunner

    from monitor.cli import app

    env = {"COLUMNS": "250", "TW_SLACK_TOKEN": token}
    base = ["--config", str(tmp_path / "tailwatch.yaml"), "alerts", "--now", now]
    text = CliRunner().invoke(app, base, env=env)
    doc = CliRunner().invoke(app, [*base, "--format", "json"], env=env)
    assert text.exit_code == 0 and doc.exit_code == 0, text.output + doc.output
    return text, json.loads(doc.stdout)


# (case, Slack's next answers to chat.postMessage, the daemon's token, drains, delivery shown)
CASES = [
    ("sent", [], TOKEN, 1, "sent to #alerts"),
    ("not drained yet", [], TOKEN, 0, "pending (1) to #alerts"),
    ("failed for good", ["channel_not_found"], TOKEN, 1, "failed to #alerts: HTTP 200 channel_not_found"),
    ("retrying", ["team_added_to_org"], TOKEN, 1, "retrying (1 waiting, 1 attempts) to #alerts: HTTP 200 "
     "team_added_to_org"),
    ("the daemon lacks the token", [], None, 1,
     "UNDELIVERABLE (1 waiting): alerts.slack.token: environment variable TW_SLACK_TOKEN is not set"),
]


@pytest.mark.parametrize(("case", "faults", "daemon_token", "drains", "shown"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("caller_token", [None, TOKEN], ids=["caller without the token", "caller with it"])
def test_alerts_shows_the_delivery_the_daemon_stored(tmp_path, fake_slack, monkeypatch, case, faults, daemon_token,
                                                     drains, shown, caller_token):
    now = slower_store(tmp_path, _slack(fake_slack))
    fake_slack.fail_next("chat.postMessage", *faults)
    for _ in range(drains):
        _daemon_drains(tmp_path, now, daemon_token, monkeypatch)
    text, doc = _alerts(tmp_path, now, caller_token)
    [alert] = doc["alerts"]
    assert alert["delivery"].startswith(shown), (case, alert["delivery"])
    assert shown.split(":")[0] in " ".join(text.stdout.split())
    assert "not configured" not in text.stdout
    [item] = alert["notifications"]
    assert item["to"] == "#alerts" and item["kind"] == "post"
    assert item["status"] == {"sent": "sent", "failed for good": "failed"}.get(case, "pending")
    assert item["sent_at"] is not None if case == "sent" else item["sent_at"] is None
    # What the daemon found is an error of its own; what this shell lacks is only a note.
    stored = "alerts.slack.token: environment variable TW_SLACK_TOKEN is not set"
    assert doc["notifications_undeliverable"] == (stored if daemon_token is None else None)
    assert doc["undeliverable_from_here"] == (None if caller_token else stored)
    said = " ".join(text.stderr.split())
    assert ("error: notifications undeliverable" in said) == (daemon_token is None), said
    assert ("this shell could not send notifications itself" in said) == (
        caller_token is None and daemon_token is not None), said
    assert TOKEN not in text.stdout + text.stderr + json.dumps(doc)


def test_a_delivery_goes_on_once_the_daemon_has_its_token(tmp_path, fake_slack, monkeypatch):
    now = slower_store(tmp_path, _slack(fake_slack))
    _daemon_drains(tmp_path, now, None, monkeypatch)
    assert _alerts(tmp_path, now, TOKEN)[1]["alerts"][0]["delivery"].startswith("UNDELIVERABLE (1 waiting)")
    _daemon_drains(tmp_path, now, TOKEN, monkeypatch)
    _, doc = _alerts(tmp_path, now, None)
    assert doc["alerts"][0]["delivery"] == "sent to #alerts" and doc["notifications_undeliverable"] is None
    assert len(fake_slack.top_level) == 1
