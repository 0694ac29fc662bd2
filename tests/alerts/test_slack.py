"""The outbox drained into a fake Slack Web API on 127.0.0.1: post, update in place, thread reply; 429 with
Retry-After, 500, connection resets, timeouts and ok:false errors; nothing lost, nothing duplicated, and
the token never in logs or errors."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import timedelta

import numpy as np
import pytest
from alerts_support import TOKEN, make_config
from sqlalchemy import select
from test_after_tick import SLOWER_EPISODE, at, write_window

from monitor.aggregate.partial import Partial, merge_bytes
from monitor.aggregate.sketch import Sketch
from monitor.alerts.evaluate import after_tick
from monitor.notify import drain
from storage.models import Outbox
from storage.rows import PartialRow


def one_incident(open_store, tmp_path, fake, **slack):
    """A firing slower incident with its post queued; returns (config, store)."""
    alerts = {"verdict": {"for": "0s", "resolve_after": 1}, "group_wait": "0s"}
    if slack:
        alerts["slack"] = {"token": {"env": "TW_SLACK_TOKEN"}, "channel": "#alerts", "base_url": fake.base_url,
                           "timeout": "1s", **slack}
    config = make_config(tmp_path, slack_url=fake.base_url, alerts=alerts, accepted=["v1"])
    store = open_store()
    write_window(store, 0, "slower")
    report = after_tick(config, store, at(1))
    assert report.enqueued == 1
    return config, store


def items(store) -> list[Outbox]:
    with store.transaction() as session:
        return list(session.scalars(select(Outbox).order_by(Outbox.id)))


def test_episode_posts_updates_and_replies_in_one_thread(open_store, tmp_path, fake_slack):
    config = make_config(tmp_path, slack_url=fake_slack.base_url, alerts={"verdict": {"for": "15m"}})
    for k, shape in enumerate(SLOWER_EPISODE):
        write_window(open_store(), k, shape)
    sent = 0
    for k in range(1, 11):
        after_tick(config, open_store(), at(k))
        sent += drain(config, open_store(), at(k) + timedelta(minutes=1)).sent
    assert sent == 3
    assert len(fake_slack.top_level) == 1
    msg = fake_slack.top_level[0]
    header = msg["blocks"][0]["text"]["text"]
    assert "SLOWER" in header and "RESOLVED" in header and "v2" in header and msg["edits"] == 1
    assert len(msg["blocks"]) <= 50
    assert all(len(b["text"]["text"]) <= 3000 for b in msg["blocks"] if b["type"] == "section" and "text" in b)
    body = str(msg["blocks"])
    assert "stage `model`: 100%" in body and "cache_hit_rate" in body and "tailwatch explain 1 --service churn" in body
    assert "n=300" in body
    replies = fake_slack.replies(msg["ts"])
    assert len(replies) == 1 and "Resolved" in replies[0]["text"]
    assert fake_slack.calls.count("chat.postMessage") == 2 and fake_slack.calls.count("chat.update") == 1


@pytest.mark.parametrize("faults,drains", [
    (("429", "429"), 2),  # in-process retry after Retry-After, then the outbox's
    (("ratelimited", "ratelimited"), 2),
    (("500", "500"), 2),
    (("reset",), 2),  # dropped before Slack acted
    (("reset_after",), 2),  # Slack posted, the response was lost
    (("slow",), 2),  # timed out after Slack posted
])
@pytest.mark.reliability
def test_faults_are_retried_and_nothing_is_duplicated(open_store, tmp_path, fake_slack, faults, drains, caplog,
                                                      record_property):
    caplog.set_level(logging.DEBUG)
    config, store = one_incident(open_store, tmp_path, fake_slack)
    fake_slack.fail_next("chat.postMessage", *faults)
    now = at(1)
    reports = []
    for _ in range(drains + 1):
        reports.append(drain(config, open_store(), now))
        now += timedelta(minutes=31)
    record_property("rel_inputs", 1)
    record_property("rel_faults", len(faults))
    record_property("rel_rows_lost", int(not fake_slack.top_level))
    record_property("rel_duplicates", max(len(fake_slack.top_level) - 1, 0))
    assert sum(r.sent for r in reports) == 1, [r.errors for r in reports]
    assert reports[0].sent == 0 and reports[0].retried == 1
    assert len(fake_slack.top_level) == 1
    [item] = items(open_store())
    assert item.status == "sent" and item.external_id == fake_slack.top_level[0]["ts"]
    if faults[0] in ("reset_after", "slow"):
        assert "conversations.history" in fake_slack.calls  # looked up instead of reposting
    assert TOKEN not in caplog.text
    assert all(TOKEN not in e for r in reports for e in r.errors)


def test_429_honours_retry_after(open_store, tmp_path, fake_slack):
    config, store = one_incident(open_store, tmp_path, fake_slack)
    fake_slack.fail_next("chat.postMessage", "ratelimited", "ratelimited")
    report = drain(config, store, at(1))
    [item] = items(store)
    assert report.retried == 1 and item.next_attempt_at == at(1) + timedelta(seconds=2)  # the Retry-After
    assert drain(config, store, at(1) + timedelta(seconds=1)).sent == 0  # not due yet
    assert drain(config, store, at(1) + timedelta(seconds=2)).sent == 1


def test_channel_not_found_is_reported_and_not_retried(open_store, tmp_path, fake_slack, caplog):
    config, store = one_incident(open_store, tmp_path, fake_slack, channel="#nope")
    report = drain(config, store, at(1))
    assert report.failed == 1 and "channel_not_found" in report.errors[0] and "not retried" in report.errors[0]
    assert "channel_not_found" in caplog.text
    [item] = items(store)
    assert item.status == "failed" and "channel_not_found" in item.last_error
    calls = len(fake_slack.calls)
    assert drain(config, store, at(1) + timedelta(hours=5)).sent == 0 and len(fake_slack.calls) == calls


@pytest.mark.reliability
def test_an_outage_of_hours_delays_and_loses_nothing(open_store, tmp_path, fake_slack, record_property):
    config, store = one_incident(open_store, tmp_path, fake_slack)
    fake_slack.fail_next("chat.postMessage", *["500"] * 12)
    now, sent, attempts = at(1), 0, 0
    while now < at(1) + timedelta(hours=3) and not sent:
        report = drain(config, open_store(), now)
        sent += report.sent
        attempts += report.retried
        now += timedelta(minutes=5)
    record_property("rel_inputs", 1)
    record_property("rel_faults", 12 - len(fake_slack.faults["chat.postMessage"]))
    record_property("rel_rows_lost", int(not fake_slack.top_level))
    record_property("rel_duplicates", max(len(fake_slack.top_level) - 1, 0))
    assert sent == 1 and len(fake_slack.top_level) == 1
    assert 3 <= attempts <= 7  # backoff doubles: 30 s, 1 m, 2 m, ... not one attempt per drain
    [item] = items(open_store())
    assert item.status == "sent" and item.attempts == attempts + 1


def test_a_later_message_waits_for_the_first(open_store, tmp_path, fake_slack):
    config, store = one_incident(open_store, tmp_path, fake_slack)
    fake_slack.fail_next("chat.postMessage", "reset")
    drain(config, store, at(1))
    # The incident resolves while its first message is still unsent (the next window has no v2 request).
    report = after_tick(config, open_store(), at(2))
    assert report.enqueued == 2
    drained = drain(config, open_store(), at(2))
    assert drained.sent == 3 and [m["ts"] for m in fake_slack.top_level] == [fake_slack.messages[0]["ts"]]
    assert fake_slack.calls[-2:] == ["chat.update", "chat.postMessage"]


def test_token_is_never_logged_even_on_auth_errors(open_store, tmp_path, fake_slack, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)
    config, store = one_incident(open_store, tmp_path, fake_slack)
    monkeypatch.setenv("TW_SLACK_TOKEN", TOKEN + "-wrong")
    report = drain(config, store, at(1))
    assert report.failed == 1 and "invalid_auth" in report.errors[0]
    assert TOKEN not in caplog.text and TOKEN not in str(report) and TOKEN not in (items(store)[0].last_error or "")
    assert any(h.startswith("Bearer ") for h in fake_slack.headers_seen)


def test_webhook_fallback_posts_every_notification(open_store, tmp_path, fake_slack, monkeypatch):
    monkeypatch.setenv("TW_HOOK", fake_slack.base_url + "hook")
    config = make_config(tmp_path, alerts={"verdict": {"for": "0s", "resolve_after": 1}, "group_wait": "0s",
                                           "slack": {"webhook_url": {"env": "TW_HOOK"}}})
    write_window(open_store(), 0, "slower")
    after_tick(config, open_store(), at(1))
    assert drain(config, open_store(), at(1)).sent == 1
    after_tick(config, open_store(), at(3))  # no window since: resolved -> update + reply, both posted
    assert drain(config, open_store(), at(3)).sent == 2
    assert [m["channel"] for m in fake_slack.messages] == ["webhook"] * 3
    assert "RESOLVED" in fake_slack.messages[1]["text"] and "Resolved" in fake_slack.messages[2]["text"]


def test_routes_by_severity_and_labels_and_stays_within_slack_limits():
    from monitor.alerts.render import render, route
    from monitor.config import Slack

    slack = Slack(token={"env": "X"}, channel="#alerts",
                  routes=[{"match": {"severity": "warn"}, "channel": "#warn"},
                          {"match": {"service": "fraud"}, "channel": "#fraud"}])
    assert route(slack, {"service": "churn", "severity": "page"}) == "#alerts"
    assert route(slack, {"service": "churn", "severity": "warn"}) == "#warn"
    assert route(slack, {"service": "fraud", "severity": "page"}) == "#fraud"
    evidence = [{"check": "latency", "labels": {"stage": f"s{i}" * 200}, "value": 1.0, "baseline": 0.5, "n": 10}
                for i in range(100)]
    alerts = [{"labels": {"alertname": f"a{i}"}, "state": "firing", "muted": None,
               "annotations": {"summary": "x" * 5000, "evidence": evidence, "next_steps": ["y" * 4000] * 10,
                               "what_changed": [{"text": "z" * 4000}] * 10}} for i in range(60)]
    incident = {"id": 1, "service": "churn", "model_version": "v2", "verdict": "slower" * 40, "status": "open",
                "opened_at": None, "summary": {"severity": "page", "alerts": alerts}, "revision": 3}
    msg = render(incident, "post", "post", slack)
    assert len(msg["blocks"]) <= 50 and len(msg["blocks"][0]["text"]["text"]) <= 150
    for block in msg["blocks"]:
        texts = [block["text"]["text"]] if "text" in block else [f["text"] for f in block.get("fields", [])] + [
            e["text"] for e in block.get("elements", [])]
        assert all(len(t) <= 3000 for t in texts)


# A value an attacker can put in the logs (or a config a reviewer skims): a channel ping, a disguised link, a
# user mention, a channel link and a bare &.
HOSTILE = "v2 <!channel> <https://evil.example|open the runbook> <@U024BE7LH> <#C0SECRET> & co"
ESCAPED = "v2 &lt;!channel&gt; &lt;https://evil.example|open the runbook&gt; &lt;@U024BE7LH&gt; &lt;#C0SECRET&gt; &amp; co"


def hostile_window(store, k: int, breach: bool) -> None:
    """Window k of model_version HOSTILE: slower in stage HOSTILE and worse for class, group and segment
    HOSTILE, with a correlated out-of-vocabulary rate in field HOSTILE (or, `breach` False, all ok)."""
    from test_after_tick import T0, W

    start = T0 + k * W
    status = "breach" if breach else "ok"

    def f(check, labels, value, baseline):
        return {"check": check, "labels": labels, "status": status, "value": value if breach else baseline,
                "baseline": baseline, "n": 300, "service": "churn", "model_version": HOSTILE,
                "window_start": start, "window_end": start + W}

    rows = [f("latency", {"stage": "total", "quantile": "p95"}, 200.0, 50.0),
            f("latency", {"stage": HOSTILE, "quantile": "p95"}, 170.0, 30.0),
            f("quality", {"metric": "recall", "class": HOSTILE, "segment": HOSTILE}, 0.4, 0.8),
            f("quality", {"metric": "recall", "group": HOSTILE, "segment": HOSTILE}, 0.5, 0.8),
            f("oov_rate", {"field": HOSTILE}, 0.2, 0.01)]
    part = Partial(Counter({"rows": 100, "status:ok": 100}), sketches={"latency_ms": Sketch.of(np.full(100, 50.0))})
    with store.transaction() as session:
        store.findings.upsert(session, rows)
        store.partials.upsert(session, "churn", [PartialRow(HOSTILE, start + i * timedelta(minutes=5), 300, "", 100,
                                                            part.to_bytes()) for i in range(3)], merge_bytes)


def texts(message: dict) -> list[str]:
    """Every text Slack would show of one message: the fallback, the header, sections, fields, context."""
    out = [message["text"]]
    for block in message.get("blocks") or []:
        objects = ([block["text"]] if "text" in block else []) + block.get("fields", []) + block.get("elements", [])
        out += [o["text"] for o in objects]
    return out


@pytest.mark.reliability
def test_hostile_values_reach_slack_escaped(open_store, tmp_path, fake_slack, record_property):
    """model_version, service, stage, field, class, group, segment and summary (and a config's explain
    command) hold a mention, a link and a user mention: Slack receives them escaped in the post's text,
    header, sections and fields, in the update and in the thread reply; tailwatch's own bold and code stay."""
    from storage.models import Incident

    config = make_config(tmp_path, slack_url=fake_slack.base_url, accepted=["v1"], alerts={
        "verdict": {"for": "0s", "resolve_after": 1}, "group_wait": "0s",
        "slack": {"token": {"env": "TW_SLACK_TOKEN"}, "channel": "#alerts", "base_url": fake_slack.base_url,
                  "timeout": "1s", "explain_command": "tailwatch explain {incident} --service {service} <!here>"}})
    hostile_window(open_store(), 0, breach=True)
    assert after_tick(config, open_store(), at(1)).enqueued == 1
    assert drain(config, open_store(), at(1)).sent == 1
    # The service name comes from the config, where its pattern keeps it plain; the renderer does not rely on it.
    with open_store().transaction() as session:
        session.scalars(select(Incident)).one().service = HOSTILE
    hostile_window(open_store(), 1, breach=False)
    assert after_tick(config, open_store(), at(3)).enqueued == 2  # resolved: the post updated, a thread reply
    assert drain(config, open_store(), at(3)).sent == 2
    [post] = fake_slack.top_level
    [reply] = fake_slack.replies(post["ts"])
    shown = texts(post) + [reply["text"]]
    print("\n".join(shown))  # the escaped payload, for the record
    for text in shown:
        assert "<" not in text and ">" not in text, text  # no mention, link or channel can be parsed
    header = post["blocks"][0]["text"]
    assert header["type"] == "plain_text" and ESCAPED in header["text"] and "RESOLVED" in header["text"]
    sections = [b["text"]["text"] for b in post["blocks"] if b["type"] == "section" and "text" in b]
    fields = [f["text"] for b in post["blocks"] for f in b.get("fields", [])]
    body = "\n".join(sections)
    assert f"stage `{ESCAPED}`" in body  # stage, in tailwatch's own code markup
    assert f"class={ESCAPED}" in body and f"group={ESCAPED}" in body and f"segment={ESCAPED}" in body
    assert f"*Where the p95 latency increase sits*\n• stage `{ESCAPED}`: 100%" in body
    assert f"• `oov_rate` field={ESCAPED}: *20%* vs 1%" in body  # a correlated signal, ranked in the evidence
    assert f"both: p95 total latency 200 ms vs 50 ms; 100% of the increase in stage {ESCAPED}; oov_rate {ESCAPED}" \
        in post["text"]  # the summary: the notification's text
    affects = next(f for f in fields if f.startswith("*Affects*"))
    assert affects.startswith(f"*Affects*\n{ESCAPED} model {ESCAPED} — ")  # service, model_version
    assert f"segment={ESCAPED}" in affects
    assert ESCAPED in post["text"] and "&lt;!here&gt;" in post["blocks"][-1]["elements"][0]["text"]
    assert f"--service {ESCAPED} &lt;!here&gt;`" in reply["text"]
    mrkdwn = [o for b in post["blocks"] for o in ([b["text"]] if "text" in b else []) + b.get("fields", [])
              + b.get("elements", []) if o["type"] == "mrkdwn"]
    assert mrkdwn and all(o.get("verbatim") is True for o in mrkdwn)  # no auto-linking of plain text
    # model_version, service, stage, field, class, group, segment, summary and the explain command.
    record_property("rel_inputs", 9)
    record_property("rel_faults", len(shown))
