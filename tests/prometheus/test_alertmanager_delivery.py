"""tailwatch's Alertmanager notifier against the real binary (Debian's `prometheus-alertmanager`): the
daemon's tick job replays a simulated `slower-cache` incident (onset, then the fix) ending a few minutes
ago; Alertmanager is stopped for the first ticks of the incident and started later; it still receives
the alert (nothing lost in the outage), routes it by severity to a local webhook receiver, and sends the
resolve."""

from __future__ import annotations

import subprocess
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
import yaml
from sqlalchemy import select
from test_real_stack import binary, free_port, poll
from tests_support import Receiver

from monitor import config as config_mod
from monitor.daemon.jobs import tick_job
from storage.models import Outbox
from storage.store import Store

HOURS, ONSET_HOURS, FIXED_HOURS, SEED = 3.0, 1.0, 2.0, 3
OUTAGE_TICKS = 3  # ticks after the incident opened with Alertmanager stopped


class RealAlertmanager:
    """A real Alertmanager on 127.0.0.1 (no cluster), routing severity=page and severity=warn alerts to
    their own webhook paths of `webhook`, everything else to /other; started and stopped on demand."""

    def __init__(self, work: Path, webhook: str) -> None:
        self.exe = binary("prometheus-alertmanager", "prometheus-alertmanager")
        self.work, self.port, self.proc = work, free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"

        def receiver(name: str) -> dict:
            return {"name": name, "webhook_configs": [{"url": f"{webhook}/{name}", "send_resolved": True}]}

        config = {"route": {"receiver": "other", "group_by": ["alertname", "service", "model_version"],
                            "group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h",
                            "routes": [{"matchers": ['severity="page"'], "receiver": "page"},
                                       {"matchers": ['severity="warn"'], "receiver": "warn"}]},
                  "receivers": [receiver("page"), receiver("warn"), receiver("other")]}
        (work / "alertmanager.yml").write_text(yaml.safe_dump(config))

    def start(self) -> None:
        self.log = open(self.work / "alertmanager.log", "ab")
        self.proc = subprocess.Popen(
            [self.exe, f"--config.file={self.work / 'alertmanager.yml'}", f"--storage.path={self.work / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
            stdout=self.log, stderr=subprocess.STDOUT)
        poll("Alertmanager ready", lambda: self.proc.poll() is None and urllib.request.urlopen(
            f"{self.url}/-/ready", timeout=2).status == 200)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.log.close()
            self.proc = None


@pytest.fixture
def stack(tmp_path, monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    webhook = Receiver()
    am = RealAlertmanager(tmp_path, webhook.url)
    try:
        yield am, webhook
    finally:
        am.stop()
        webhook.close()
        if (tmp_path / "alertmanager.log").exists():
            print((tmp_path / "alertmanager.log").read_text()[-3000:])


def notifications(webhook: Receiver) -> list[tuple[str, str, dict]]:
    """(webhook path, status, labels) of each alert in each notification Alertmanager sent."""
    return [(p["path"], a["status"], a["labels"]) for p in webhook.posts for a in p["body"]["alerts"]]


def test_alertmanager_gets_routes_and_resolves_an_incident_after_an_outage(stack, tmp_path):
    from monitor.demo import demo_config, replay
    from monitor.simulate import generate

    am, webhook = stack
    # The run ends 45 to 105 min ago: its times are real times to Alertmanager, so the firing alert is
    # current and the resolve is in the past when it arrives. It starts at a quarter past an hour whatever
    # the time of day: the hourly windows cut the scenario at the same points, so its alerts are the same.
    start = (pd.Timestamp(datetime.now(UTC)).floor("1h").to_pydatetime()
             - timedelta(hours=HOURS + 1) + timedelta(minutes=15))
    truth = generate("slower-cache", tmp_path / "generated", seed=SEED, start=start, hours=HOURS,
                     onset_hours=ONSET_HOURS, fault_end_hours=FIXED_HOURS, otlp=False)
    for kind in ("predictions", "timings"):
        (tmp_path / "logs" / kind).mkdir(parents=True, exist_ok=True)
    raw = demo_config(tmp_path)
    # A resend interval of hours: the replay's firing alert (sent at its tick's time) ends after now.
    raw["alerts"] = {"alertmanager": {"urls": [am.url], "resend_interval": "4h", "timeout": "2s"}}
    raw["ui"] = {"external_url": "http://tailwatch.example"}
    (tmp_path / "tailwatch.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = config_mod.load(tmp_path / "tailwatch.yaml")
    store = Store(cfg.storage.url)
    store.upgrade()
    outage: list[datetime] = []
    back: list[datetime] = []  # the tick that started Alertmanager

    def job(config, st, now):
        if len(outage) == OUTAGE_TICKS and am.proc is None:
            am.start()
            back.append(now)
        reports = tick_job(config, st, now)
        with st.transaction() as session:
            opened = bool(st.incidents.load(session))
        if opened and am.proc is None:
            outage.append(now)  # a tick of the open incident whose alert waits in the outbox
        if am.proc is not None and not webhook.posts and _active(am):
            # Let Alertmanager flush the firing alert before the replay goes on to the resolve.
            poll("the firing notification", lambda: webhook.posts)
        return reports

    try:
        reports = replay(tmp_path, cfg, store, truth, None, job=job)
        assert all(r.status == "ok" for r in reports), [r.error for r in reports]
        assert len(outage) == OUTAGE_TICKS and am.proc is not None
        poll("the resolved notification", lambda: any(s == "resolved" for _, s, _ in notifications(webhook)))
        with store.transaction() as session:
            [incident] = store.incidents.load(session)
            pending = store.outbox.depth(session)
            items = [(o.status, o.attempts, o.created_at) for o in session.scalars(
                select(Outbox).where(Outbox.kind == "alert").order_by(Outbox.id))]
    finally:
        store.dispose()
    got = notifications(webhook)
    labels = got[0][2]
    assert labels["alertname"] == "ModelRegression" and labels["service"] == "churn"
    assert labels["model_version"] == "v2" and labels["verdict"] == incident["verdict"]
    severity = labels["severity"]
    routed = f"/{severity}" if severity in ("page", "warn") else "/other"
    assert [(path, status) for path, status, _ in got] == [(routed, "firing"), (routed, "resolved")]
    assert incident["status"] == "resolved" and pending == 0
    # Each tick of the outage tried the incident's alert once (connection refused), then the first tick with
    # Alertmanager up delivered it. An update of the alert a tick decided (new evidence, in the outage or on
    # that first tick, by the traffic of the hour of day the run falls on) replaces the pending one, which
    # counts as sent with the attempts it had, and is tried from then on.
    during = [attempts for _, attempts, created in items if created <= back[0]]
    assert sum(during) == OUTAGE_TICKS + 1 and all(status == "sent" for status, _, _ in items)
    [firing, resolved] = [p["body"]["alerts"][0] for p in webhook.posts]
    assert firing["generatorURL"] == f"http://tailwatch.example/incidents/{incident['id']}"
    onset = incident["first_window_start"]
    assert datetime.fromisoformat(firing["startsAt"].replace("Z", "+00:00")) == onset
    assert datetime.fromisoformat(resolved["endsAt"].replace("Z", "+00:00")) == incident["resolved_at"]


def _active(am: RealAlertmanager) -> bool:
    import json

    with urllib.request.urlopen(f"{am.url}/api/v2/alerts?active=true", timeout=2) as resp:
        return bool(json.loads(resp.read()))
