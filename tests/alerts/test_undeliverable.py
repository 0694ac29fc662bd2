"""Undeliverable notifications are loud: with alerts.slack configured and its secret missing, unreadable or
empty, every drain logs an error saying which variable or file, nothing is sent or lost (the messages wait
in the outbox, marked with why, and go out once the secret is back), `tailwatch alerts` shows what the
drain stored in a column of its own,
`notify drain` exits non-zero, and no secret value is printed anywhere."""

from __future__ import annotations

import json
import logging

import pytest
from alerts_support import TOKEN, make_config
from sqlalchemy import select
from test_after_tick import at, write_window
from test_alerts_cli import slower_store, tw

from monitor.alerts.evaluate import after_tick
from monitor.notify import drain
from storage.models import Outbox


def slack_with(fake, secret: dict) -> dict:
    return {"verdict": {"for": "0s", "resolve_after": 1}, "group_wait": "0s",
            "slack": {"token": secret, "channel": "#alerts", "base_url": fake.base_url, "timeout": "1s"}}


@pytest.mark.parametrize("case", ["env unset", "env empty", "file missing", "file unreadable", "file empty"])
def test_a_missing_or_unreadable_secret_is_named_never_shown(tmp_path, fake_slack, monkeypatch, case):
    from monitor.notify import undeliverable

    secret_file = tmp_path / "secrets" / "slack-token"
    secret_file.parent.mkdir()
    if case == "file unreadable":
        secret_file.mkdir()  # a directory where the file should be: unreadable even for root
    elif case == "file empty":
        secret_file.write_text("\n")
    if case == "env unset":
        monkeypatch.delenv("TW_SLACK_TOKEN")
    elif case == "env empty":
        monkeypatch.setenv("TW_SLACK_TOKEN", "")
    secret = {"env": "TW_SLACK_TOKEN"} if case.startswith("env") else {"file": str(secret_file)}
    why = undeliverable(make_config(tmp_path, alerts=slack_with(fake_slack, secret)))
    expected = {"env unset": "alerts.slack.token: environment variable TW_SLACK_TOKEN is not set",
                "env empty": "alerts.slack.token: environment variable TW_SLACK_TOKEN is empty",
                "file missing": f"alerts.slack.token: cannot read secret file {secret_file}: No such file or directory",
                "file unreadable": f"alerts.slack.token: cannot read secret file {secret_file}: Is a directory",
                "file empty": f"alerts.slack.token: secret file {secret_file} is empty"}[case]
    assert why == expected
    monkeypatch.setenv("TW_SLACK_TOKEN", TOKEN)
    secret_file.unlink() if secret_file.is_file() else None
    if secret_file.is_dir():
        secret_file.rmdir()
    secret_file.write_text(TOKEN + "\n")
    assert undeliverable(make_config(tmp_path, alerts=slack_with(fake_slack, secret))) == ""
    assert undeliverable(make_config(tmp_path, alerts={})) == ""  # no Slack configured: nothing to deliver


@pytest.mark.reliability
def test_every_drain_says_so_and_nothing_is_lost(open_store, tmp_path, fake_slack, monkeypatch, caplog,
                                                 record_property):
    caplog.set_level(logging.INFO)
    monkeypatch.delenv("TW_SLACK_TOKEN")
    config = make_config(tmp_path, alerts=slack_with(fake_slack, {"env": "TW_SLACK_TOKEN"}), accepted=["v1"])
    write_window(open_store(), 0, "slower")
    assert after_tick(config, open_store(), at(1)).enqueued == 1
    reports = [drain(config, open_store(), at(1)), drain(config, open_store(), at(2))]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "undeliverable" in r.getMessage()]
    assert len(errors) == 2  # one per drain, not once
    assert all("environment variable TW_SLACK_TOKEN is not set; 1 waiting in the outbox" in r.getMessage()
               for r in errors)
    assert all(r.undeliverable.endswith("TW_SLACK_TOKEN is not set") and r.sent == 0 for r in reports)
    assert fake_slack.calls == []
    with open_store().transaction() as session:
        [item] = session.scalars(select(Outbox)).all()
        assert item.status == "pending" and item.attempts == 0  # waits: no attempt spent, never failed
    monkeypatch.setenv("TW_SLACK_TOKEN", TOKEN)  # the operator fixes the deployment
    assert drain(config, open_store(), at(3)).sent == 1 and len(fake_slack.top_level) == 1
    record_property("rel_inputs", 1)
    record_property("rel_faults", 2)
    record_property("rel_rows_lost", int(len(fake_slack.top_level) != 1))
    record_property("rel_duplicates", max(len(fake_slack.top_level) - 1, 0))


def test_alerts_shows_it_and_notify_drain_fails(tmp_path, fake_slack):
    secret_file = tmp_path / "no-such-token"
    now = slower_store(tmp_path, slack_with(fake_slack, {"file": str(secret_file)}))
    why = f"alerts.slack.token: cannot read secret file {secret_file}: No such file or directory"
    drained = tw("notify", "drain", "--now", now, cwd=tmp_path)
    assert drained.exit_code != 0 and f"notifications undeliverable: {why}" in " ".join(drained.stderr.split())
    # What the drain found is stored with the waiting message: `alerts` reports it (not its own environment).
    listed = tw("alerts", "--now", now, cwd=tmp_path)
    assert listed.exit_code == 0, listed.output
    assert "notified" in listed.stdout and "UNDELIVERABLE (1 waiting)" in listed.stdout
    assert f"error: notifications undeliverable: {why}" in " ".join(listed.stderr.split())
    as_json = json.loads(tw("alerts", "--now", now, "--format", "json", cwd=tmp_path).stdout)
    assert as_json["notifications_undeliverable"] == why
    assert [a["delivery"] for a in as_json["alerts"]] == [f"UNDELIVERABLE (1 waiting): {why}"]
    # Once the secret is there, the column says what became of the message.
    secret_file.write_text(TOKEN)
    secret_file.chmod(0o600)
    assert tw("notify", "drain", "--now", now, cwd=tmp_path).exit_code == 0 and len(fake_slack.top_level) == 1
    fixed = json.loads(tw("alerts", "--now", now, "--format", "json", cwd=tmp_path).stdout)
    assert fixed["notifications_undeliverable"] is None
    assert [a["delivery"] for a in fixed["alerts"]] == ["sent to #alerts"]
    assert TOKEN not in listed.stdout + listed.stderr + drained.stdout + drained.stderr
