"""Markup from the logs stays text all the way into Slack: a model_version and a field name that hold a channel
mention, a disguised link, a user mention, bidi overrides, a terminal escape and 100 KB of padding go through
the alert path (stored findings, after_tick, the outbox) into Alertmanager's API, through the shipped
Alertmanager route and templates (deploy/alertmanager, the real binary) into a Slack webhook, and straight
into Slack's Web API (the fake server). Nowhere does a value arrive as live markup, in another order than it
is read, with control characters, or whole.

Each test records what it tried as pytest user properties (`rel_inputs`), which `make reliability` sums.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
import yaml

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / d) for d in ("alerts", "prometheus")]
import test_after_tick as after_tick_support  # noqa: E402
from alerts_support import TOKEN, FakeSlack, make_config  # noqa: E402
from test_alertmanager_delivery import RealAlertmanager  # noqa: E402
from test_real_stack import binary, free_port, poll  # noqa: E402
from tests_support import Receiver  # noqa: E402

from monitor.alerts.evaluate import after_tick  # noqa: E402
from monitor.notify import alertmanager, drain  # noqa: E402
from storage.store import Store  # noqa: E402

pytestmark = pytest.mark.reliability

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# What a hostile producer writes into a logged value: a channel mention, a link that shows one text and goes
# elsewhere, a user mention, a right-to-left override (shows "exe.png" as "gnp.exe"), direction marks, a
# terminal escape.
MARKUP = ["<!channel>", "<!here>", "<https://evil.example/steal|click here>", "<@U123ABC>", "<#C0123|general>"]
HOSTILE = (" ".join(MARKUP) + " \u202egnp.exe\u202c \u2066iso\u2069 \u200fmark\u200e \u061c \x1b[31mred\x1b[0m \x07"
           " & done")
VERSION = "v2 " + HOSTILE + " " + "x" * 100_000
FIELD = "Contract " + HOSTILE
BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # line breaks aside: the evidence is a line per item
LIVE = re.compile(r"<[!@#]|<(https?|mailto):")
MAX_LABEL, MAX_ANNOTATION = 200, 4000  # characters, as docs/alerts.md says


def hostile_findings(shape: str) -> list[dict]:
    """The alert tests' findings of `shape`, the unseen-categories finding on the hostile field (a breach
    in a slower window, so the field's name is in the evidence)."""
    out = SHAPES(shape)
    for f in out:
        if f["check"] == "unseen_categories":
            f["labels"] = {"field": FIELD}
            if shape == "slower":
                f.update(status="breach", value=0.2)
    return out


SHAPES = after_tick_support.shape_findings


@pytest.fixture
def hostile_store(tmp_path, monkeypatch):
    """A store whose two slower windows (the last hour's) are of the hostile version, with the hostile
    field in the evidence."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setattr(after_tick_support, "shape_findings", hostile_findings)
    # Windows of the last hour: Alertmanager notifies of an alert only while it is current.
    now = pd.Timestamp(datetime.now(UTC)).floor("15min").to_pydatetime()
    monkeypatch.setattr(after_tick_support, "T0", now - timedelta(minutes=30))
    store = Store(f"sqlite:///{tmp_path / 'tw.db'}")
    store.upgrade()
    for k, shape in enumerate(["slower", "slower"]):
        after_tick_support.write_window(store, k, shape, VERSION)
    yield store
    store.dispose()


def alert_config(tmp_path, alertmanager_url: str, **alerts):
    return make_config(tmp_path, accepted=["v1"], alerts={
        "verdict": {"for": "0s", "resolve_after": 1, "regression_severity": "warn"}, "group_wait": "0s",
        "alertmanager": {"urls": [alertmanager_url], "timeout": "5s", "resend_interval": "1h"}, **alerts})


def test_alertmanager_labels_and_annotations_are_plain_text_and_capped(tmp_path, hostile_store, record_property):
    receiver = Receiver()
    try:
        config = alert_config(tmp_path, receiver.url)
        assert after_tick(config, hostile_store, after_tick_support.at(1)).enqueued == 1
        assert drain(config, hostile_store, after_tick_support.at(1)).sent == 1
        alerts = receiver.alerts()
    finally:
        receiver.close()
    assert alerts
    for alert in alerts:
        values = [("label " + k, v) for k, v in alert["labels"].items()]
        values += [("annotation " + k, v) for k, v in alert["annotations"].items()]
        for where, value in values:
            assert not BIDI.search(value) and not CONTROL.search(value), (where, value[:300])
            limit = MAX_LABEL if where.startswith("label") else MAX_ANNOTATION
            assert len(value) <= limit, (where, len(value))
            if where.startswith("label") or where != "annotation evidence":
                assert "\n" not in value, where
        version = alert["labels"]["model_version"]
        assert version.startswith("v2 <!channel>") and "gnp.exe" in version  # the value, as text
        assert "field=Contract <!channel>" in alert["annotations"]["evidence"]
    # Two versions alike in their first MAX_LABEL characters stay two label values.
    label_value = alertmanager.label_value
    assert label_value(VERSION) != label_value(VERSION + "y")
    assert len(label_value(VERSION + "y")) == MAX_LABEL
    record_property("rel_inputs", len(values) * len(alerts))


class ShippedAlertmanager(RealAlertmanager):
    """The real Alertmanager on 127.0.0.1 with deploy/alertmanager's config and templates as shipped, its
    secret files written here (the Slack webhook URL: `slack`), PagerDuty's events sent to `pagerduty`,
    and no waits between a group's alerts; started at once."""

    def __init__(self, work: Path, slack: str, pagerduty: str) -> None:
        self.exe = binary("prometheus-alertmanager", "prometheus-alertmanager")
        self.work, self.port, self.proc = work, free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"
        for shipped in (DEPLOY / "alertmanager").iterdir():  # the config and the templates it names
            shutil.copy(shipped, work / shipped.name)
        config = yaml.safe_load((work / "alertmanager.yml").read_text())
        config["route"].update(group_wait="0s", group_interval="1s")
        for receiver in config["receivers"]:
            for kind in receiver.values():
                for c in kind if isinstance(kind, list) else []:
                    for key, value in [("routing_key_file", "pagerduty-routing-key"), ("api_url_file", slack)]:
                        if key in c:
                            path = work / Path(c[key]).name
                            path.write_text(value)
                            c[key] = str(path)
                    if "routing_key_file" in c:
                        c["url"] = pagerduty
        (work / "alertmanager.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.start()

    def push(self, alerts: list[dict]) -> None:
        request = urllib.request.Request(f"{self.url}/api/v2/alerts", data=json.dumps(alerts).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=5) as resp:
            assert resp.status == 200


def test_markup_from_the_logs_stays_text_through_the_shipped_alertmanager_route_into_slack(
        tmp_path, hostile_store, record_property):
    slack = Receiver()  # Slack's incoming webhook and PagerDuty's events API: record the JSON Alertmanager posts
    am = ShippedAlertmanager(tmp_path, slack.url + "/services/hook", slack.url + "/v2/enqueue")
    try:
        config = alert_config(tmp_path, am.url)
        assert after_tick(config, hostile_store, after_tick_support.at(1)).enqueued == 1
        assert drain(config, hostile_store, after_tick_support.at(1)).sent == 1
        # And an alert as the shipped Prometheus rules write one: the label values in its summary, raw.
        am.push([{"labels": {"alertname": "TailwatchModelSlower", "service": "churn", "model_version": FIELD,
                             "severity": "warning"},
                  "annotations": {"summary": f"churn {VERSION} got slower (15m window)"}},
                 # (another version: a page inhibits the warnings of its own version)
                 {"labels": {"alertname": "TailwatchModelWorse", "service": "churn",
                             "model_version": "v3 " + HOSTILE, "severity": "critical"},
                  "annotations": {"summary": f"churn {VERSION} got worse"}}])
        posts = poll("both Slack notifications and the page", lambda: len(slack.posts) >= 3 and slack.posts)
    finally:
        am.stop()
        slack.close()
        print((tmp_path / "alertmanager.log").read_text()[-3000:])
    shown = []
    pages = [p["body"] for p in posts if p["path"] == "/v2/enqueue"]
    assert len(pages) == 1, posts
    # PagerDuty shows text as it is: no control characters or bidi overrides, each value capped.
    paged = [pages[0]["payload"]["summary"], *map(str, pages[0]["payload"]["custom_details"].values())]
    for value in paged:
        assert not BIDI.search(value) and not CONTROL.search(value.replace("\n", "")), value[:400]
        assert len(value) < 4000, len(value)
    assert "TailwatchModelWorse churn v3 <!channel>" in paged[0] and "churn v2 <!channel>" in "".join(paged)
    for post in (p for p in posts if p["path"] != "/v2/enqueue"):
        for attachment in post["body"]["attachments"]:
            for key in ("title", "text", "fallback", "pretext", "footer"):
                value = attachment.get(key) or ""
                shown.append(value)
                assert not LIVE.search(value) and "<" not in value and ">" not in value, (key, value[:400])
                assert not BIDI.search(value) and not CONTROL.search(value), (key, value[:400])
                assert len(value) < 4000, (key, len(value))
    text = "\n".join(shown)
    # The values arrived, as text Slack shows literally.
    assert "&lt;!channel&gt;" in text and "&lt;@U123ABC&gt;" in text and "&lt;https://evil.example/steal|click" in text
    assert "ModelRegression" in text and "TailwatchModelSlower" in text and "&amp; done" in text
    record_property("rel_inputs", len(shown))


def test_markup_from_the_logs_stays_text_in_slack_web_api_messages(tmp_path, hostile_store, record_property):
    fake = FakeSlack()
    fake.thread.start()
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    try:
        config = make_config(tmp_path, accepted=["v1"], alerts={
            "verdict": {"for": "0s", "resolve_after": 1}, "group_wait": "0s",
            "slack": {"token": {"file": str(token)}, "channel": "#alerts", "base_url": fake.base_url, "timeout": "5s"}})
        assert after_tick(config, hostile_store, after_tick_support.at(1)).enqueued == 1
        assert drain(config, hostile_store, after_tick_support.at(1)).sent == 1
        messages = list(fake.messages)
    finally:
        fake.server.shutdown()
        fake.server.server_close()
    texts = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "text" and isinstance(value, str):
                    texts.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk([{"text": m["text"], "blocks": m["blocks"]} for m in messages])
    assert texts
    for value in texts:
        assert not LIVE.search(value) and not BIDI.search(value) and not CONTROL.search(value), value[:400]
        assert len(value) <= 3000
    assert any("&lt;!channel&gt;" in t for t in texts)
    record_property("rel_inputs", len(texts))
