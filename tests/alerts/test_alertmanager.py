"""The outbox drained into Alertmanager's API as served by HTTP receivers on 127.0.0.1: the alerts' labels,
annotations, start and end; an HA pair gets every alert; an outage delays and loses nothing; firing
alerts are re-sent every resend interval; Slack's and Alertmanager's deliveries retry independently."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from alerts_support import make_config
from sqlalchemy import select
from test_after_tick import T0, W, at, write_window

from monitor.alerts.evaluate import after_tick
from monitor.notify import drain
from storage.models import Outbox

SECRET = "am-bearer-SECRETVALUE-42"


def am_config(tmp_path, receivers, slack_url=None, **am):
    settings = {"urls": [r.url for r in receivers],
                "runbook_url": "https://runbooks.example/{alertname}", "timeout": "2s", "resend_interval": "1m",
                **am}
    return make_config(tmp_path, slack_url=slack_url, accepted=["v1"], ui={"external_url": "https://tailwatch.example/"},
                       alerts={"verdict": {"for": "0s", "resolve_after": 1}, "group_wait": "0s",
                               "alertmanager": settings})


def resolved_at(store) -> str:
    with store.transaction() as session:
        [incident] = store.incidents.load(session)
    assert incident["status"] == "resolved"
    return incident["resolved_at"].isoformat().replace("+00:00", "Z")


def rows(store) -> list[tuple[str, str]]:
    with store.transaction() as session:
        return [(o.kind, o.status) for o in session.scalars(select(Outbox).order_by(Outbox.id))]


def test_an_incident_fires_and_resolves_in_alertmanager(open_store, tmp_path, receivers):
    config = am_config(tmp_path, receivers[:1])
    write_window(open_store(), 0, "slower")
    assert after_tick(config, open_store(), at(1)).enqueued == 1
    assert drain(config, open_store(), at(1)).sent == 1
    [alert] = receivers[0].alerts()
    assert alert["labels"] == {"alertname": "ModelRegression", "service": "churn", "model_version": "v2",
                               "severity": "page", "verdict": "slower", "stage": "model"}
    assert alert["startsAt"] == "2026-11-02T12:00:00Z"  # the onset: window 0's start, not the tick
    assert alert["endsAt"] == (at(1) + 4 * timedelta(minutes=1)).isoformat().replace("+00:00", "Z")
    assert alert["generatorURL"] == "https://tailwatch.example/incidents/1"
    notes = alert["annotations"]
    assert notes["summary"].startswith("slower") and notes["runbook_url"] == "https://runbooks.example/ModelRegression"
    assert "latency" in notes["evidence"] and "n=300" in notes["evidence"] and "<" not in notes["evidence"]
    assert receivers[0].posts[0]["headers"]["Content-Type"] == "application/json"
    after_tick(config, open_store(), at(3))  # no window since: resolved
    assert drain(config, open_store(), at(3)).sent == 1
    resolved = receivers[0].alerts()[-1]
    assert resolved["labels"] == alert["labels"] and resolved["startsAt"] == alert["startsAt"]
    assert resolved["endsAt"] == resolved_at(open_store())  # the resolution, not the send
    assert [k for k, _ in rows(open_store())] == ["alert", "alert"]


def test_firing_alerts_are_re_sent_every_resend_interval(open_store, tmp_path, receivers):
    config = am_config(tmp_path, receivers[:1], resend_interval="10m")
    write_window(open_store(), 0, "slower")
    after_tick(config, open_store(), at(1))
    drain(config, open_store(), at(1))
    assert drain(config, open_store(), at(1) + timedelta(minutes=9)).sent == 0  # within the interval
    assert drain(config, open_store(), at(1) + timedelta(minutes=10)).sent == 1
    ends = [a["endsAt"] for a in receivers[0].alerts()]
    assert ends == [(at(1) + k * timedelta(minutes=10) + 4 * timedelta(minutes=10)).isoformat().replace(
        "+00:00", "Z") for k in (0, 1)]
    assert drain(config, open_store(), at(1) + timedelta(minutes=15)).sent == 0  # last sent 5 min ago


@pytest.mark.reliability
def test_an_ha_pair_gets_every_alert_and_an_outage_loses_nothing(open_store, tmp_path, receivers, caplog,
                                                                  record_property, monkeypatch):
    caplog.set_level(logging.INFO)
    config = am_config(tmp_path, receivers, bearer_token={"env": "TW_AM_TOKEN"})
    monkeypatch.setenv("TW_AM_TOKEN", SECRET)
    write_window(open_store(), 0, "slower")
    after_tick(config, open_store(), at(1))
    receivers[1].down = True  # one of the pair is out for hours
    now, reports = at(1), []
    for _ in range(12):
        reports.append(drain(config, open_store(), now))
        now += timedelta(minutes=30)
    assert all(r.sent == 0 and r.failed == 0 for r in reports)  # retried, never given up
    assert receivers[1].alerts() == [] and len(receivers[0].alerts()) >= 2  # each attempt reached both
    receivers[1].down = False
    assert drain(config, open_store(), now).sent == 1
    assert [a["labels"]["alertname"] for a in receivers[1].alerts()] == ["ModelRegression"]
    assert all(p["headers"]["Authorization"] == f"Bearer {SECRET}" for r in receivers for p in r.posts)
    text = "\n".join(r.getMessage() for r in caplog.records) + "\n".join(e for r in reports for e in r.errors)
    assert "503" in text and SECRET not in text  # the receiver echoes the header; it is scrubbed
    record_property("rel_inputs", 1)
    record_property("rel_faults", 12)
    record_property("rel_rows_lost", int(len(receivers[1].alerts()) != 1))


def test_a_newer_message_supersedes_an_older_unsent_one(open_store, tmp_path, receivers):
    """Alertmanager is down while the incident fires and resolves: once back, it gets the resolve alone,
    never the stale firing state after it."""
    config = am_config(tmp_path, receivers[:1])
    write_window(open_store(), 0, "slower")
    after_tick(config, open_store(), at(1))
    receivers[0].down = True
    drain(config, open_store(), at(1))
    after_tick(config, open_store(), at(3))  # resolved while Alertmanager is down
    receivers[0].down = False
    assert drain(config, open_store(), at(3) + timedelta(hours=1)).sent == 1
    [alert] = receivers[0].alerts()
    assert alert["endsAt"] == resolved_at(open_store())
    assert rows(open_store()) == [("alert", "sent"), ("alert", "sent")]
    assert drain(config, open_store(), at(3) + timedelta(hours=2)).sent == 0  # resolved: no re-send


def test_a_bad_request_is_not_retried(open_store, tmp_path, receivers):
    config = am_config(tmp_path, receivers[:1])
    write_window(open_store(), 0, "slower")
    after_tick(config, open_store(), at(1))
    receivers[0].fail.append(400)
    report = drain(config, open_store(), at(1))
    assert report.failed == 1 and "HTTP 400" in report.errors[0] and "not retried" in report.errors[0]


def test_slack_and_alertmanager_retry_independently(open_store, tmp_path, receivers, fake_slack):
    config = am_config(tmp_path, receivers[:1], slack_url=fake_slack.base_url)
    write_window(open_store(), 0, "slower")
    assert after_tick(config, open_store(), at(1)).enqueued == 2  # one item per notifier
    fake_slack.fail_next("chat.postMessage", "500", "500")
    first = drain(config, open_store(), at(1))
    assert first.sent == 1 and first.retried == 1 and len(receivers[0].alerts()) == 1
    receivers[0].down = True
    second = drain(config, open_store(), at(1) + timedelta(minutes=1))  # Slack's retry; AM's re-send fails
    assert second.sent == 1 and second.retried == 1 and len(fake_slack.top_level) == 1
    assert rows(open_store()) == [("post", "sent"), ("alert", "sent"), ("alert", "pending")]


def test_an_unreadable_credential_is_named_and_the_alerts_wait(open_store, tmp_path, receivers, monkeypatch):
    from monitor.notify import undeliverable

    monkeypatch.delenv("TW_AM_TOKEN", raising=False)
    config = am_config(tmp_path, receivers[:1], bearer_token={"env": "TW_AM_TOKEN"})
    assert undeliverable(config) == "alerts.alertmanager.bearer_token: environment variable TW_AM_TOKEN is not set"
    write_window(open_store(), 0, "slower")
    after_tick(config, open_store(), at(1))
    assert drain(config, open_store(), at(1)).undeliverable.endswith("TW_AM_TOKEN is not set")
    monkeypatch.setenv("TW_AM_TOKEN", SECRET)
    assert drain(config, open_store(), at(2)).sent == 1 and len(receivers[0].alerts()) == 1


def test_a_slack_payload_written_by_an_older_version_is_sent_as_it_is(open_store, tmp_path, fake_slack):
    config = make_config(tmp_path, slack_url=fake_slack.base_url)
    store = open_store()
    with store.transaction() as session:
        store.outbox.add(session, dedup_key="old:1", created_at=T0, channel="#alerts", status="pending", attempts=0,
                         payload={"text": "rendered before", "blocks": [{"type": "section", "text": {
                             "type": "mrkdwn", "text": "*rendered before*"}}]}, next_attempt_at=T0 + W, kind="post")
    assert drain(config, open_store(), T0 + W).sent == 1
    [msg] = fake_slack.top_level
    assert msg["text"] == "rendered before" and msg["blocks"][0]["text"]["text"] == "*rendered before*"


def test_the_config_refuses_credentials_in_urls(tmp_path, receivers):
    with pytest.raises(Exception, match="without credentials"):
        am_config(tmp_path, receivers[:1], urls=["http://user:pw@127.0.0.1:9093"])


def test_labels_are_strings_with_valid_names_and_values_as_plain_text():
    # Markup stays in a label (Alertmanager's templates escape it); a line break becomes a space.
    from monitor.notify.alertmanager import label_name, labels_of

    assert [label_name(n) for n in ("severity", "bad-name", "1st", "ünï")] == ["severity", "bad_name", "_1st", "_n_"]
    hostile = "v2 <!channel> & \"quoted\"\n"
    alert = {"labels": {"alertname": "ModelRegression", "severity": "page", "threshold": 0.5, "empty": ""},
             "annotations": {"verdict": "worse", "evidence": [{"check": "quality", "labels": {"class": hostile,
                                                                                              "group": 7}}]}}
    labels = labels_of(alert, {"service": "churn", "model_version": hostile, "verdict": "worse"})
    shown = hostile.replace("\n", " ")
    assert labels == {"service": "churn", "model_version": shown, "alertname": "ModelRegression",
                      "severity": "page", "threshold": "0.5", "verdict": "worse", "class": shown, "group": "7"}


def test_an_incident_opened_before_alertmanager_was_configured_is_sent(open_store, tmp_path, receivers):
    without = make_config(tmp_path, accepted=["v1"], alerts={"verdict": {"for": "0s"}, "group_wait": "0s"})
    write_window(open_store(), 0, "slower")
    assert after_tick(without, open_store(), at(1)).enqueued == 0  # tracked, nothing queued
    config = am_config(tmp_path, receivers[:1])
    assert drain(config, open_store(), at(1) + timedelta(minutes=2)).sent == 1
    assert [a["labels"]["alertname"] for a in receivers[0].alerts()] == ["ModelRegression"]
