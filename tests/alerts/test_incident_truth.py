"""An incident's truth over time, with an explicit `now` on SQLite and PostgreSQL: it dates from the
first breaching window of its run (live, after a backlog, after a backfill), resolves after
`alerts.verdict.resolve_after` clear windows or when its version's traffic is gone and says which, and a
ModelRegression pages only on an effect that matters."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from alerts_support import make_config
from sqlalchemy import select

from monitor.aggregate.partial import Partial, merge_bytes
from monitor.aggregate.sketch import Sketch
from monitor.alerts.evaluate import after_tick
from monitor.alerts.lifecycle import Window, lifecycle, onset_of, superseded
from monitor.alerts.samples import effect_severity
from monitor.config import VerdictAlerts, parse
from monitor.verdicts.verdict import HARMFUL, Evidence, decide
from storage.models import AlertState, Outbox
from storage.rows import PartialRow

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
W = timedelta(minutes=15)


def at(k: int) -> datetime:
    """The clock of tick k: 5 minutes (the join lateness) after window k-1 closed."""
    return T0 + k * W + timedelta(minutes=5)


def findings(shape: str) -> list[dict]:
    """One window's findings: healthy, slower (p95 50 -> 200 ms), small (p95 14.2 -> 14.7 ms), cache (hit
    rate 0.8 -> 0.2, latency flat), learnt (hit rate still 0.2, but so is the baseline that learnt it),
    worse (a segment's predictions drift past the floor), shifted (they stay shifted, under the floor) or
    insufficient (nothing decides)."""
    status = "insufficient" if shape == "insufficient" else "ok"

    def f(check, labels, st=status, value=1.0, baseline=1.0, n=300, detail=None):
        return {"check": check, "labels": labels, "status": st, "value": value, "baseline": baseline, "n": n,
                "detail": detail or {}}

    p95 = {"slower": ("breach", 200.0, 50.0), "small": ("breach", 14.7, 14.2)}.get(shape, (status, 50.0, 50.0))
    drift = {"worse": ("breach", 0.12), "shifted": ("ok", 0.08)}.get(shape, (status, 0.01))
    return [f("latency", {"rate": "failure"}, value=0.01, baseline=0.01),
            f("latency", {"stage": "total", "quantile": "p95"}, *p95),
            f("latency", {"stage": "model", "quantile": "p95"}, *p95),
            f("cache_hit_rate", {}, "breach" if shape == "cache" else status, 0.2 if shape in ("cache", "learnt") else 0.8,
              0.2 if shape == "learnt" else 0.8),
            f("prediction_drift", {"output": "score:Yes", "segment": "Contract=Month-to-month"}, *drift, baseline=0.0,
              detail={"shifted": shape in ("worse", "shifted")})]


def write(store, windows: dict[int, str], version: str = "v2", now: datetime | None = None) -> None:
    """Findings and partials of windows {k: shape}, all stamped with one tick at `now` (a backlog or a
    backfill scores many windows in one tick)."""
    with store.transaction() as session:
        tick = store.ticks.start(session, "churn", now or at(max(windows) + 1))
        for k, shape in windows.items():
            start = T0 + k * W
            store.findings.upsert(session, [{**f, "service": "churn", "model_version": version, "tick_id": tick,
                                             "window_start": start, "window_end": start + W} for f in findings(shape)])
            part = Partial(Counter({"rows": 100, "status:ok": 100}),
                           sketches={"latency_ms": Sketch.of(np.full(100, 50.0))})
            store.partials.upsert(session, "churn", [PartialRow(version, start + i * timedelta(minutes=5), 300, "", 100,
                                                                part.to_bytes()) for i in range(3)], merge_bytes)
        store.ticks.finish(session, tick, "ok", {}, {})


def incident(store) -> dict:
    with store.transaction() as session:
        found = [i for i in store.incidents.load(session, "churn") if i["model_version"]]
    assert len(found) == 1, found
    return found[0]


def payloads(store, kind: str) -> list[dict]:
    """The Slack messages the outbox items of `kind` render to when they are sent."""
    from monitor.alerts.render import render
    from monitor.notify.message import action_of, incident_of

    with store.transaction() as session:
        stored = [o.payload for o in session.scalars(select(Outbox).where(Outbox.kind == kind).order_by(Outbox.id))]
    return [render(incident_of(p), kind, action_of(p), None) for p in stored]


def regression(store, version: str = "v2") -> AlertState:
    with store.transaction() as session:
        [row] = [r for r in session.scalars(select(AlertState))
                 if r.alertname == "ModelRegression" and r.labels["model_version"] == version]
        session.expunge(row)
    return row


SLACK = "http://127.0.0.1:9/api/"
RUN = {0: "healthy", 1: "healthy", 2: "slower", 3: "insufficient", 4: "slower", 5: "slower"}


@pytest.mark.parametrize("mode", ["live", "backlog"])
def test_the_incident_dates_from_the_first_breaching_window(open_store, tmp_path, mode):
    """Live or after a backlog (every window scored by one tick): since 12:30, the first slower window; the
    insufficient window inside the run neither ends it nor dates it."""
    config = make_config(tmp_path, slack_url=SLACK, alerts={"group_wait": "0s"})
    if mode == "live":
        for k, shape in RUN.items():
            write(open_store(), {k: shape})
            after_tick(config, open_store(), at(k + 1))  # a new Store every tick: a restart
    else:
        write(open_store(), RUN)
        after_tick(config, open_store(), at(6))
    store = open_store()
    inc = incident(store)
    assert inc["first_window_start"] == T0 + 2 * W
    assert datetime.fromisoformat(regression(store).annotations["onset"]) == T0 + 2 * W
    assert inc["summary"]["since"] == (T0 + 2 * W).isoformat()
    [post] = payloads(store, "post")
    since = next(f["text"] for b in post["blocks"] if b.get("fields") for f in b["fields"] if "Since" in f["text"])
    assert "2026-11-02 12:30 UTC" in since


@pytest.mark.parametrize("shapes,onsets", [
    (["slower", "healthy", "slower"], [0]),  # one clear window: a flap live, one episode
    (["cache", "healthy", "healthy", "slower"], [0, 3]),  # resolve_after clear windows back to baseline: two
    (["cache", "learnt", "learnt", "slower"], [0]),  # clear verdicts, but the hit rate never came back
])
def test_a_backlog_dates_the_onset_as_live_would_have(open_store, tmp_path, shapes, onsets):
    """Every window scored by one tick: the incidents live ticks would have had, each from its onset."""
    config = make_config(tmp_path, alerts={"group_wait": "0s"})
    write(open_store(), dict(enumerate(shapes)))
    after_tick(config, open_store(), at(len(shapes)))
    with open_store().transaction() as session:
        found = sorted(open_store().incidents.load(session, "churn"), key=lambda i: i["opened_at"])
    assert [i["first_window_start"] for i in found] == [T0 + k * W for k in onsets]


def test_a_backfill_moves_the_onset_back(open_store, tmp_path):
    """Windows 2-3 scored only later (a backfill): the open incident's onset moves back to them."""
    config = make_config(tmp_path, alerts={"group_wait": "0s"})
    write(open_store(), {0: "healthy", 1: "healthy", 4: "slower", 5: "slower"})
    after_tick(config, open_store(), at(6))
    assert incident(open_store())["first_window_start"] == T0 + 4 * W  # window 3 was never scored: a hole
    write(open_store(), {2: "slower", 3: "slower"}, now=at(6) + timedelta(minutes=1))
    write(open_store(), {6: "slower"})
    after_tick(config, open_store(), at(7))
    assert incident(open_store())["first_window_start"] == T0 + 2 * W


def test_resolves_after_clear_windows_and_says_fixed(open_store, tmp_path):
    """One clear window inside the episode is a flap, not a fix; two in a row (resolve_after) resolve it,
    and the update, the thread reply and the incident say so."""
    config = make_config(tmp_path, slack_url=SLACK, alerts={"group_wait": "0s", "group_interval": "0s"})
    shapes = ["slower", "slower", "healthy", "slower", "healthy", "healthy", "healthy"]
    got = []
    for k, shape in enumerate(shapes):
        write(open_store(), {k: shape})
        after_tick(config, open_store(), at(k + 1))
        got.append(regression(open_store()).state)
    assert got == ["firing", "firing", "firing", "firing", "firing", "resolved", "resolved"]
    store = open_store()
    inc = incident(store)
    fixed = "fixed: healthy for 2 windows against the pre-incident baseline"
    assert inc["status"] == "resolved" and inc["resolved_at"] == at(6) and inc["summary"]["resolution"] == fixed
    assert regression(store).annotations["resolution"] == fixed
    [reply] = payloads(store, "reply")
    assert fixed in reply["text"]
    assert fixed in str(payloads(store, "update")[-1]["blocks"])


def test_a_baseline_that_learnt_the_regression_does_not_resolve_it(open_store, tmp_path):
    """Healthy verdicts against a baseline that learnt the low hit rate hold the incident: the hit rate is
    not back to its pre-incident 0.8; two windows back there resolve it."""
    config = make_config(tmp_path, alerts={"group_wait": "0s"})
    got = []
    for k, shape in enumerate(["cache", "cache", "learnt", "learnt", "learnt", "healthy", "healthy"]):
        write(open_store(), {k: shape})
        after_tick(config, open_store(), at(k + 1))
        got.append(regression(open_store()).state)
    assert got == ["firing"] * 6 + ["resolved"]
    row = regression(open_store())
    assert row.annotations["resolution"].startswith("fixed: healthy for 2 windows")
    assert row.labels["severity"] == "info"  # the cache alone, latency flat


WORSE = ["healthy", "worse", "shifted", "shifted", "worse", "shifted", "healthy", "healthy", "healthy"]


@pytest.mark.parametrize("mode", ["live", "backlog"])
def test_a_worse_episode_holds_while_its_prediction_drift_stays_shifted(open_store, tmp_path, mode):
    """A segment's prediction drift that wanders under the floor that opened the episode, still shifted
    from its baseline: its windows stay worse and the incident open, live or after a backlog (every window
    up to the one after the second breach scored by one tick); two windows back resolve it."""
    config = make_config(tmp_path, alerts={"group_wait": "0s"})
    first = 0 if mode == "live" else 5
    write(open_store(), dict(enumerate(WORSE[:first + 1])))
    after_tick(config, open_store(), at(first + 1))
    got = [regression(open_store()).state]
    for k in range(first + 1, len(WORSE)):
        write(open_store(), {k: WORSE[k]})
        after_tick(config, open_store(), at(k + 1))
        got.append(regression(open_store()).state)
    with open_store().transaction() as session:
        verdicts = [v["verdict"] for v in open_store().verdicts.load(session, "churn")]
    assert verdicts == ["healthy"] + ["worse"] * 5 + ["healthy"] * 3
    assert got == (["inactive"] + ["firing"] * 6 + ["resolved"] * 2)[first:]
    inc = incident(open_store())
    assert inc["first_window_start"] == T0 + W and inc["resolved_at"] == at(8)
    assert inc["summary"]["resolution"].startswith("fixed: healthy for 2 windows")


@pytest.mark.parametrize("serving,resolution", [
    ("v1", "rolled back: v2 has no traffic since 12:45, v1 serves"),
    (None, "no traffic: no predictions since 12:45, from this or any other version (not confirmed fixed)")])
def test_a_version_whose_traffic_is_gone(open_store, tmp_path, serving, resolution):
    """v2 slower, then no v2 request: with v1 serving it was rolled back; with nothing serving it is no
    traffic, never "fixed". Either after resolve_after windows."""
    config = make_config(tmp_path, alerts={"group_wait": "0s"})
    for k in range(3):
        write(open_store(), {k: "slower"})
        after_tick(config, open_store(), at(k + 1))
    for k in (3, 4):
        if serving:
            write(open_store(), {k: "healthy"}, version=serving)
        after_tick(config, open_store(), at(k + 1))
        assert regression(open_store()).state == ("firing" if k == 3 else "resolved")
    inc = incident(open_store())
    assert inc["status"] == "resolved" and inc["summary"]["resolution"] == resolution


def test_severity_follows_the_effect_and_escalates_within_one_alert(open_store, tmp_path):
    """A 0.5 ms p95 rise is info; when the rise grows the same alert (one identity) becomes a page and
    stays one while the effect shrinks again; the message is updated."""
    config = make_config(tmp_path, slack_url=SLACK, alerts={"group_wait": "0s", "group_interval": "0s"})
    severities = []
    for k, shape in enumerate(["small", "slower", "small"]):
        write(open_store(), {k: shape})
        after_tick(config, open_store(), at(k + 1))
        severities.append(regression(open_store()).labels["severity"])
    assert severities == ["info", "page", "page"]
    store = open_store()
    assert incident(store)["summary"]["severity"] == "page"
    assert [o["text"] for o in payloads(store, "update")]


def verdict(shape: str, rules=()):
    return decide([{**f, "model_version": "v2"} for f in findings(shape)], service="churn", model_version="v2",
                  window_start=T0, window_end=T0 + W, now=T0 + W, rule_breaches=rules)


@pytest.mark.parametrize("shape,rules,settings,expected", [
    ("slower", (), {}, "page"),
    ("small", (), {}, "info"),  # 0.5 ms and 3.5%: under both floors
    ("small", (), {"min_effect_ratio": 0.03}, "page"),  # over the relative floor
    ("small", (), {"min_effect_ms": 0.5}, "page"),  # at the absolute floor
    ("cache", (), {}, "info"),  # serving signal, latency flat
    ("cache", (), {"serving_severity": "warn"}, "warn"),
    ("small", (Evidence("slo:p95", {"slo": "p95 total latency <= 14.5 ms"}, 14.7, None, 300),), {}, "page"),
    ("slower", (), {"regression_severity": "warn"}, "warn"),  # never louder than configured
])
def test_effect_severity(shape, rules, settings, expected):
    v = verdict(shape, rules)
    assert v.verdict == "slower"
    assert effect_severity(v, VerdictAlerts(**settings)) == expected


def test_onset_walk_and_lifecycle_are_pure():
    def win(k, v, length=W, rows=100):
        return Window(T0 + k * W, T0 + k * W + length, v, rows)

    history = [win(0, "slower"), win(1, "healthy"), win(2, "slower"), win(3, "insufficient_data"), win(4, "both"),
               win(5, "slower"), win(0, "slower", 4 * W)]
    assert onset_of(history, HARMFUL, (T0 + 5 * W, T0 + 6 * W)) == T0 + 2 * W
    assert onset_of(history, ("drift",), (T0 + 5 * W, T0 + 6 * W)) == T0 + 5 * W  # no stored drift window
    # Only the longer window breached: it dates the onset.
    assert onset_of([win(0, "healthy"), win(0, "worse", 4 * W)], HARMFUL, (T0, T0 + 4 * W)) == T0
    healthy = verdict("healthy")
    active, resolves, why = lifecycle("v2", healthy, history, HARMFUL, end=T0 + 7 * W, shortest=W, serving=[],
                                      resolve_after=2)
    assert (active, resolves, why) == (False, False, {"clearing": "clear for 1 of 2 windows"})
    active, resolves, why = lifecycle("v2", None, history, HARMFUL, end=T0 + 8 * W, shortest=W, serving=["v1"],
                                      resolve_after=2)
    assert (active, resolves) == (False, True) and why["resolution"].startswith("rolled back: v2 has no traffic")


def test_a_longer_window_whose_breach_the_shortest_saw_end_neither_holds_nor_dates_it():
    """Hourly windows slower from 10:00 to 22:00, clear after: the day breaches too. Once two clear hours
    follow the last slow one, the day's breach is over; before that, and for a day no hour breached in
    (only it had the power), the day's breach stands."""
    hour, day = timedelta(hours=1), timedelta(days=1)
    hours = [Window(T0 + k * hour, T0 + (k + 1) * hour, "slower" if 10 <= k < 22 else "healthy", 500)
             for k in range(27)]
    daily = Window(T0, T0 + day, "slower", 13000)
    history = [*hours, daily]
    kw = {"shortest": hour, "resolve_after": 2}
    assert superseded(history, (T0, T0 + day), HARMFUL, end=T0 + day, **kw)
    assert not superseded(history, (T0, T0 + day), HARMFUL, end=T0 + 23 * hour, **kw)  # one clear hour
    assert not superseded(history, (T0 + 22 * hour, T0 + 23 * hour), HARMFUL, end=T0 + day, **kw)  # shortest
    quiet = [Window(w.start, w.end, "healthy", 500) for w in hours]
    assert not superseded([*quiet, daily], (T0, T0 + day), HARMFUL, end=T0 + day + 3 * hour, **kw)
    unsure = [Window(w.start, w.end, "insufficient_data" if w.start >= T0 + 22 * hour else w.verdict, 50)
              for w in hours]
    assert not superseded([*unsure, daily], (T0, T0 + day), HARMFUL, end=T0 + day + 3 * hour, **kw)
    # The lifecycle counts clear hours from the last slow hour, not from the day's end.
    active, resolves, why = lifecycle("v1", verdict("healthy"), history, HARMFUL, end=T0 + day, **kw, serving=[])
    assert (active, resolves) == (False, True) and why["resolution"].startswith("fixed: healthy for 2 windows")


def test_windows_without_traffic_count_as_clear_from_the_last_breach():
    """v2 slower, healthy for one window, then gone (v1 serves): the healthy window and the one without
    traffic make resolve_after 2; a longer window ending later (its requests are older) does not date
    when the traffic went."""
    def win(k, v, length=W, rows=100):
        return Window(T0 + k * W, T0 + k * W + length, v, rows)

    history = [win(0, "slower"), win(1, "healthy"), win(0, "healthy", 4 * W)]
    active, resolves, why = lifecycle("v2", None, history, HARMFUL, end=T0 + 3 * W, shortest=W, serving=["v1"],
                                      resolve_after=2)
    assert (active, resolves) == (False, True)
    assert why["resolution"].startswith(f"rolled back: v2 has no traffic since {T0 + 2 * W:%H:%M}")
    active, resolves, why = lifecycle("v2", None, history, HARMFUL, end=T0 + 3 * W, shortest=W, serving=["v1"],
                                      resolve_after=3)
    assert (active, resolves, why) == (False, False, {"clearing": f"no traffic since {T0 + 2 * W:%H:%M}, 2 of 3 windows"})


def test_keep_firing_for_of_verdict_alerts_says_what_replaced_it(tmp_path):
    from monitor.config import ConfigError

    raw = {"services": [{"name": "churn", "sources": {"predictions": {"kind": "files", "path": str(tmp_path)}}}],
           "alerts": {"verdict": {"keep_firing_for": "30m"}}}
    with pytest.raises((ConfigError, ValueError), match="resolve_after"):
        parse(raw, base_dir=tmp_path)


def test_tailwatch_alerts_says_why_an_alert_resolved(tmp_path):
    import json

    from test_after_tick import write_window
    from test_alerts_cli import slower_store, tw

    from monitor import config as config_mod
    from storage.store import Store

    slower_store(tmp_path, {"group_wait": "0s"})
    config = config_mod.load(tmp_path / "tailwatch.yaml")
    store = Store(config.storage.url)
    try:
        for k in (1, 2):
            write_window(store, k, "healthy")
            after_tick(config, store, at(k + 1))
    finally:
        store.dispose()
    listed = tw("alerts", "--all", "--format", "json", "--now", at(3).isoformat(), cwd=tmp_path)
    assert listed.exit_code == 0, listed.output
    [alert] = [a for a in json.loads(listed.stdout)["alerts"] if a["labels"]["alertname"] == "ModelRegression"]
    assert alert["state"] == "resolved"
    assert alert["summary"].startswith("resolved (fixed: healthy for 2 windows against the pre-incident baseline)")


def test_explain_and_the_report_start_at_the_onset(open_store, tmp_path):
    """After a backlog, `tailwatch explain` takes "before" from the hours before the onset (12:30), not
    before the window that fired, and the report (the incident page) shades the open incident from the onset
    to the service's last tick and marks the onset there."""
    import json
    import re

    import pandas as pd

    from monitor.investigate.explain import BEFORE, explain
    from monitor.ui.report import build_report

    config = make_config(tmp_path, alerts={"group_wait": "0s"})
    write(open_store(), RUN)
    after_tick(config, open_store(), at(6))
    store = open_store()
    inc = incident(store)
    onset = T0 + 2 * W
    got = explain(store, "churn", inc["id"], now=at(6))
    assert got.window[0] == onset and got.before == (onset - BEFORE, onset)
    page = build_report(config, store, config.services[0], incident_id=inc["id"], evidently=False, now=at(6))
    assert '<dd id="onset">2026-11-02 12:30 UTC</dd>' in page and "<dd>2026-11-02 13:30 UTC</dd>" in page
    found = re.search(r'<script type="application/json" id="timeline-json">(.*?)</script>', page, flags=re.S)
    shapes = json.loads(found.group(1))["layout"]["shapes"]
    shaded = [(pd.Timestamp(s["x0"]), pd.Timestamp(s["x1"])) for s in shapes if s.get("name") == "incident"]
    assert shaded == [(onset, at(6))]
    assert [pd.Timestamp(s["x0"]) for s in shapes if s.get("name") == "onset"] == [onset]


def test_the_resolve_message_escapes_the_version_it_names():
    from monitor.alerts.render import render

    incident = {"id": 3, "service": "churn", "model_version": "v2 <!channel>", "verdict": "slower",
                "status": "resolved", "revision": 4, "opened_at": T0 + W, "first_window_start": T0,
                "resolved_at": T0 + 6 * W, "summary": {"severity": "page", "alerts": [],
                                                      "resolution": "rolled back: v2 <!channel> has no traffic "
                                                                    "since 13:00, v1 serves"}}
    reply = render(incident, "reply", "resolve", None)["text"]
    assert "1:30:00 after its onset — rolled back: v2 &lt;!channel&gt; has no traffic since 13:00, v1 serves" in reply
    update = render(incident, "update", "resolve", None)
    assert "<!channel>" not in str(update) and "rolled back: v2 &lt;!channel&gt;" in update["text"]


def test_the_incident_page_link_in_a_reply_stays_one_link():
    from monitor.alerts.render import render

    incident = {"id": 3, "service": "churn", "model_version": "v2", "verdict": "slower", "status": "resolved",
                "revision": 4, "opened_at": T0 + W, "first_window_start": T0, "resolved_at": T0 + 6 * W,
                "summary": {"severity": "page", "alerts": []}}
    reply = render(incident, "reply", "resolve", None, "https://tw.example/ui?a=1&b=<x>|y/incidents/3")["text"]
    assert reply.endswith(" or <https://tw.example/ui?a=1&amp;b=&lt;x&gt;%7Cy/incidents/3|the incident page>")
