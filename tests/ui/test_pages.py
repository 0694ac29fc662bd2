"""The pages over a store the pipeline filled: each renders, logs' text is escaped, nothing is fetched from
another host, filters filter, unknown things are 404s, and the one write (silences) needs the token."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy.engine import make_url
from ui_support import HOSTILE, serving

from monitor import config as config_mod
from monitor.config import ConfigError, incident_url, parse
from monitor.investigate.query import why
from monitor.ui.views import slack_link
from storage.store import Store


def get(url: str, data: dict | None = None) -> tuple[int, dict, str]:
    body = None if data is None else urllib.parse.urlencode(data).encode()
    request = urllib.request.Request(url, data=body)
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None



def pages(incident_id: int) -> list[str]:
    return ["/", f"/incidents/{incident_id}", f"/incidents/{incident_id}/requests",
            f"/incidents/{incident_id}/requests?stage=batch_wait", "/services/churn", "/services/churn?span=7d",
            "/services/churn/quarantine", "/silences"]


def test_every_page_renders_self_contained(served, incident_id):
    for path in pages(incident_id):
        status, headers, html = get(served.url + path)
        assert status == 200, (path, html[-500:])
        assert "script-src 'self'" in headers["content-security-policy"]
        # Every script, stylesheet, image and frame comes from this server: no other host, no CDN.
        for tag in re.findall(r"<(?:script|img|link|iframe)\b[^>]*>", html, flags=re.I):
            assert not re.search(r"\b(?:src|href)\s*=\s*[\"']?(?:[a-z]+:)?//", tag, flags=re.I), (path, tag)
    status, headers, js = get(served.url + "/static/plotly.min.js")
    assert status == 200 and "javascript" in headers["content-type"] and len(js) > 1_000_000


class Tags(HTMLParser):
    """The start tags of a page, with their attributes."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_text_from_the_logs_is_escaped(served):
    status, _, html = get(served.url + "/services/churn/quarantine")
    assert status == 200
    assert HOSTILE not in html and "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in html
    tags = Tags(html).tags
    # The page's own tags only: no <img>, no handler attribute, scripts from this server or JSON data.
    assert not [t for t, _ in tags if t == "img"]
    assert not [(t, a) for t, a in tags if any(k.startswith("on") for k in a)]
    assert all(a.get("src", "").startswith("/static/") or a.get("type") == "application/json"
               for t, a in tags if t == "script")
    assert "unknown_status" in html and "unparseable" in html  # the demo's malformed lines, by reason


def test_the_incident_page_answers_what_since_when_and_where(served, incident_id, ui_run):
    _, _, html = get(f"{served.url}/incidents/{incident_id}")
    assert 'id="why"' in html and "slower" in html
    for figure in ("timeline", "stages", "failures"):
        assert f'id="{figure}-json"' in html, figure
    assert "model_version" in html and "v2" in html  # what changed
    assert f'href="/incidents/{incident_id}/requests?stage=' in html  # explain's next step, as a link
    assert "mean ms per request" in html and "(ms)" in html  # units


def test_filters_and_unknowns(served, incident_id):
    listed = lambda query: f'href="/incidents/{incident_id}"' in get(f"{served.url}/?{query}")[2]  # noqa: E731
    assert listed("") and listed("verdict=slower&service=churn&version=v2&status=open")
    assert not listed("verdict=drift") and not listed("version=v1")
    # The severity filter offers the severities incidents carry: exactly one of them lists this one.
    assert sum(listed(f"severity={severity}") for severity in ("page", "warn", "info")) == 1
    status, _, html = get(f"{served.url}/?severity=critical")
    assert status == 400 and "is not one of page, warn, info" in html
    page = get(f"{served.url}/")[2]
    assert all(f"<option>{v}</option>" in page or f"<option selected>{v}</option>" in page
               for v in ("page", "warn", "info", "slower", "no_data", "open", "resolved"))
    assert get(f"{served.url}/?service=nope")[0] == 404
    assert get(f"{served.url}/incidents/999999")[0] == 404
    assert get(f"{served.url}/services/nope")[0] == 404
    assert get(f"{served.url}/services/churn?span=1y")[0] == 404
    assert get(f"{served.url}/services/churn?since=yesterday&until=now")[0] == 400


def test_incident_url_is_built_on_external_url_and_opens_the_incident(ui_run, incident_id, served):
    url = incident_url(ui_run["config"], {"id": incident_id})
    assert url == f"https://tailwatch.example.org/ui/incidents/{incident_id}"
    # Behind the proxy that serves external_url, the rest of the address is this server's page.
    status, _, html = get(served.url + "/" + url.removeprefix(ui_run["config"].ui.external_url))
    assert status == 200 and f"Incident #{incident_id} · churn" in html
    bare = ui_run["config"].model_copy(update={"ui": ui_run["config"].ui.model_copy(update={"external_url": None})})
    assert incident_url(bare, {"id": incident_id}) is None


def test_ui_config_section():
    services = [{"name": "s", "sources": {"predictions": {"kind": "files", "path": "."}}}]
    cfg = parse({"services": services})
    assert (cfg.ui.enabled, cfg.ui.host, cfg.ui.port, cfg.ui.silence_token) == (False, "127.0.0.1", 8765, None)
    with pytest.raises(ConfigError, match="ui.external_url"):
        parse({"services": services, "ui": {"external_url": "tailwatch.example.org"}})
    with pytest.raises(ConfigError, match="ui.silence_token"):
        parse({"services": services, "ui": {"silence_token": "inline-secret"}})


def test_silences_are_read_only_without_the_token(served):
    status, _, html = get(served.url + "/silences", {"matchers": "service=churn", "duration": "1h", "token": "x"})
    assert status == 403 and "read-only" in html
    assert 'action="/silences"' not in get(served.url + "/silences")[2]


def test_silences_created_and_expired_with_the_token(ui_run, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    token.chmod(0o600)
    with serving(ui_run["config"], token) as (server, store):
        form = {"matchers": "service=churn, model_version=~v.*", "duration": "2h", "comment": "<b>deploy</b>",
                "created_by": "oncall"}
        assert get(server.url + "/silences", form | {"token": "wrong"})[0] == 403
        assert get(server.url + "/silences", form | {"token": "s3cret-token", "duration": "90d"})[0] == 400
        status, headers, _ = get(server.url + "/silences", form | {"token": "s3cret-token"})
        assert status == 303 and headers["location"] == "/silences"
        with store.transaction() as session:
            made = store.silences.load(session)[-1]
        assert made["matchers"] == [{"name": "service", "op": "=", "value": "churn"},
                                    {"name": "model_version", "op": "=~", "value": "v.*"}]
        assert made["ends_at"] - made["starts_at"] == pd.Timedelta(hours=2)
        html = get(server.url + "/silences")[2]
        assert "&lt;b&gt;deploy&lt;/b&gt;" in html and "s3cret-token" not in html
        assert get(f"{server.url}/silences/{made['id']}/expire", {"token": "s3cret-token"})[0] == 303
        with store.transaction() as session:
            assert not [s for s in store.silences.load(session, pd.Timestamp.now(tz="UTC").to_pydatetime())
                        if s["id"] == made["id"]]


def test_slack_thread_link_and_the_one_line_why():
    assert slack_link({"channel": "C0123", "slack_ts": "1700000000.123456"}) == \
        "https://slack.com/archives/C0123/p1700000000123456"
    assert slack_link({"channel": "a/b?x", "slack_ts": "1.2"}) == "https://slack.com/archives/a%2Fb%3Fx/p12"
    assert slack_link({"channel": "", "slack_ts": None}) is None  # never posted (no Slack configured)
    summary = {"alerts": [{"annotations": {"summary": "slower: p95 15 ms vs 13.9 ms",
                                           "resolution": "clear for 2 windows"}}]}
    assert why({"status": "open", "verdict": "slower", "summary": summary}) == "slower: p95 15 ms vs 13.9 ms"
    assert why({"status": "resolved", "verdict": "slower", "summary": summary}) == "clear for 2 windows"
    assert why({"status": "open", "verdict": "no_data", "summary": None}) == "no_data"


def test_the_command_says_where_then_serves(ui_run):
    """`tailwatch ui --port 0 -f json` prints where it listens (the free port it was given) once it listens,
    then serves the pages until it is stopped: the first request after the record is answered."""
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}
    proc = subprocess.Popen([sys.executable, "-c", "from monitor.cli import main; main()", "--config",
                             str(ui_run["root"] / "tailwatch.yaml"), "ui", "--port", "0", "-f", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        head = "".join(iter(proc.stdout.readline, "}\n")) + "}\n"  # the record, indented JSON
        record = json.loads(head)
        port = int(record["url"].rsplit(":", 1)[1].rstrip("/"))
        assert port > 0 and record["url"] == f"http://127.0.0.1:{port}/" and record["silences_writable"] is False
        with urllib.request.urlopen(record["url"], timeout=60) as page:
            assert page.status == 200 and "<html" in page.read().decode()
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=60)
    assert "Traceback" not in stderr, stderr


def test_the_slack_button_opens_the_incident_page(ui_run, incident_id, served, tmp_path, monkeypatch):
    """The outbox drained to a fake Slack Web API with ui.external_url set to this server: the posted
    message's "View incident" button opens that incident's page."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "alerts"))
    from alerts_support import TOKEN, FakeSlack

    from monitor.alerts.group import incident_view
    from monitor.notify import drain

    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("TW_SLACK_TOKEN", TOKEN)
    database = tmp_path / "copy.db"  # the scenario's store is shared with the other tests: drain a copy
    shutil.copy(make_url(ui_run["config"].storage.url).database, database)
    fake = FakeSlack()
    fake.thread.start()
    try:
        cfg = ui_run["config"].model_copy(update={
            "storage": ui_run["config"].storage.model_copy(update={"url": f"sqlite:///{database}"}),
            "ui": ui_run["config"].ui.model_copy(update={"external_url": served.url + "/"}),
            "alerts": ui_run["config"].alerts.model_copy(update={"slack": config_mod.Slack.model_validate(
                {"token": {"env": "TW_SLACK_TOKEN"}, "channel": "#alerts", "base_url": fake.base_url})})})
        store = Store(cfg.storage.url)
        now = pd.Timestamp(ui_run["truth"].end).to_pydatetime() + pd.Timedelta(hours=1)
        try:
            # The run had no notifier, so nothing was queued: queue the incident's first message as the
            # alert stage does (the message, rendered by the drain), then drain it to the fake Slack.
            with store.transaction() as session:
                incident = store.incidents.get(session, incident_id)
                store.outbox.add(session, dedup_key=f"incident:{incident_id}:rev:{incident.revision}:post",
                                 created_at=now, channel="#alerts", status="pending", attempts=0,
                                 next_attempt_at=now, incident_id=incident_id, kind="post",
                                 payload={"incident": incident_view(incident), "action": "post"})
            report = drain(cfg, store, now)
        finally:
            store.dispose()
        assert report.sent >= 1, report
        buttons = {e["url"] for m in fake.top_level for b in m["blocks"] if b["type"] == "actions"
                   for e in b["elements"] if e.get("action_id") == "view_incident"}
    finally:
        fake.server.shutdown()
        fake.server.server_close()
    assert f"{served.url}/incidents/{incident_id}" in buttons
    for url in buttons:
        status, _, html = get(url)
        assert status == 200 and f"Incident #{url.rsplit('/', 1)[1]} · churn" in html
