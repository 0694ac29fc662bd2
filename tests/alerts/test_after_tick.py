"""after_tick on stored findings and partials, tick by tick with an explicit `now`, on SQLite and
PostgreSQL; every tick opens a new Store on the same database (a restart between every tick)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from alerts_support import make_config
from sqlalchemy import select, update

from monitor.aggregate.partial import Partial, merge_bytes
from monitor.aggregate.sketch import Sketch
from monitor.alerts.evaluate import after_tick
from storage.models import AlertState, FindingRow, Incident, Outbox
from storage.rows import PartialRow

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
W = timedelta(minutes=15)
HOUR = timedelta(hours=1)


def at(k: int) -> datetime:
    """The clock of tick k: 5 minutes (the join lateness) after window k-1 closed."""
    return T0 + k * W + timedelta(minutes=5)


def shape_findings(shape: str) -> list[dict]:
    def f(check, labels, status="ok", value=1.0, baseline=1.0, n=300):
        return {"check": check, "labels": labels, "status": status, "value": value, "baseline": baseline, "n": n}

    out = [f("latency", {"rate": r}, value=0.01, baseline=0.01) for r in ("failure", "timeout", "reject")]
    slow = shape == "slower"
    out += [f("latency", {"stage": "total", "quantile": "p95"}, "breach" if slow else "ok", 200.0 if slow else 50.0, 50.0),
            f("latency", {"stage": "model", "quantile": "p95"}, "breach" if slow else "ok", 170.0 if slow else 30.0, 30.0),
            f("latency", {"stage": "parse", "quantile": "p95"}, "ok", 10.0, 10.0),
            f("cache_hit_rate", {}, "breach" if slow else "ok", 0.2 if slow else 0.8, 0.8),
            f("unseen_categories", {"field": "Contract"}, "breach" if shape == "drift" else "ok",
              0.15 if shape == "drift" else 0.0, 0.0)]
    return out


def write_window(store, k: int, shape: str, version: str = "v2", partials: bool = True) -> None:
    """Findings (and, unless `partials` is False, 3 buckets of 100 rows) of window k."""
    start = T0 + k * W
    rows = [{**f, "service": "churn", "model_version": version, "window_start": start, "window_end": start + W}
            for f in shape_findings(shape)]
    latency = np.full(100, 200.0 if shape == "slower" else 50.0)
    part = Partial(Counter({"rows": 100, "status:ok": 100}), sketches={"latency_ms": Sketch.of(latency)})
    with store.transaction() as session:
        store.findings.upsert(session, rows)
        if partials:
            store.partials.upsert(session, "churn", [
                PartialRow(version, start + i * timedelta(minutes=5), 300, "", 100, part.to_bytes()) for i in range(3)
            ], merge_bytes)


def outbox(store) -> list[tuple[str, str]]:
    with store.transaction() as session:
        return [(o.kind, o.dedup_key) for o in session.scalars(select(Outbox).order_by(Outbox.id))]


def states(store) -> dict[str, str]:
    with store.transaction() as session:
        return {f"{r.alertname}/{r.labels.get('model_version') or r.labels.get('source', '')}": r.state
                for r in session.scalars(select(AlertState))}


# window k -> shape; tick k evaluates window k-1.
SLOWER_EPISODE = ["healthy", "healthy", "slower", "slower", "slower", "slower", "healthy", "healthy", "healthy",
                  "healthy"]
# tick -> (ModelRegression state, outbox kinds so far)
EXPECTED = {
    1: ("inactive", []),
    3: ("pending", []),
    4: ("firing", ["post"]),  # for 15m: the second slower window
    5: ("firing", ["post"]),
    6: ("firing", ["post"]),
    7: ("firing", ["post"]),  # clear for 1 of resolve_after 2 windows
    8: ("resolved", ["post", "update", "reply"]),  # the second clear window
    10: ("resolved", ["post", "update", "reply"]),
}


def test_slower_episode_pages_once_and_resolves_across_restarts(open_store, tmp_path):
    config = make_config(tmp_path, slack_url="http://127.0.0.1:9/api/", alerts={"verdict": {"for": "15m"}})
    for k, shape in enumerate(SLOWER_EPISODE):
        write_window(open_store(), k, shape)
    for k in range(1, 11):
        store = open_store()  # a restart before every tick
        report = after_tick(config, store, at(k))
        if k == 4:
            again = after_tick(config, open_store(), at(k))  # the same tick re-run after a crash
            assert again.enqueued == 0
        if k in EXPECTED:
            state, kinds = EXPECTED[k]
            got = states(store)
            assert got.get("ModelRegression/v2", "inactive") == state, (k, report.transitions, report.decisions)
            assert [kind for kind, _ in outbox(store)] == kinds, (k, report.decisions)
    store = open_store()
    with store.transaction() as session:
        incidents = store.incidents.load(session, "churn")
        verdicts = store.verdicts.load(session, "churn")
    assert len(incidents) == 1
    inc = incidents[0]
    assert (inc["status"], inc["verdict"], inc["model_version"]) == ("resolved", "slower", "v2")
    assert inc["first_window_start"] == T0 + 2 * W and inc["opened_at"] == at(4) and inc["resolved_at"] == at(8)
    assert inc["summary"]["resolution"] == "fixed: healthy for 2 windows against the pre-incident baseline"
    linked = sorted(v["window_start"] for v in verdicts if v["incident_id"] == inc["id"])
    assert linked == [T0 + k * W for k in range(2, 6)]
    by_window = {v["window_start"]: v for v in verdicts}
    assert by_window[T0 + 2 * W]["verdict"] == "slower" and by_window[T0]["verdict"] == "healthy"
    slower = by_window[T0 + 3 * W]
    assert slower["attribution"]["stages"] == {"model": 1.0}
    assert slower["evidence"][0]["check"] == "latency" and slower["evidence"][0]["n"] == 300
    post = outbox(store)[0][1]
    assert post == f"incident:{inc['id']}:rev:1:post"


def test_an_open_incident_claims_each_window_as_it_is_scored_not_only_when_it_notifies(open_store, tmp_path):
    config = make_config(tmp_path, slack_url="http://127.0.0.1:9/api/", alerts={"verdict": {"for": "15m"}})
    for k, shape in enumerate(SLOWER_EPISODE):
        write_window(open_store(), k, shape)
    for k in range(1, 7):  # tick 4 posts; ticks 5 and 6 say nothing new (the incident stays open)
        report = after_tick(config, open_store(), at(k))
    assert [d["action"] for d in report.decisions] == ["none"] and [kind for kind, _ in outbox(open_store())] == ["post"]
    store = open_store()
    with store.transaction() as session:
        [inc] = store.incidents.load(session, "churn")
        verdicts = store.verdicts.load(session, "churn")
    assert inc["status"] == "open"
    # Windows 2-5 are slower: 4 and 5 were scored after the post, and point at the incident all the same.
    assert sorted(v["window_start"] for v in verdicts if v["incident_id"] == inc["id"]) == [T0 + k * W
                                                                                          for k in range(2, 6)]


def test_a_longer_window_that_began_before_the_onset_belongs_to_the_incident(open_store, tmp_path):
    """An hour's window from T0 holds the episode's first windows (its onset is T0 + 2W) and breaches on
    them: its verdict points at the incident, though it began before the onset."""
    config = make_config(tmp_path, slack_url="http://127.0.0.1:9/api/", alerts={"verdict": {"for": "15m"}})
    for k, shape in enumerate(SLOWER_EPISODE):
        write_window(open_store(), k, shape)
    store = open_store()
    with store.transaction() as session:
        tick = store.ticks.start(session, "churn", at(4))
    with store.transaction() as session:  # scored by the tick at(4), as a tick scores its hour
        store.findings.upsert(session, [{**f, "service": "churn", "model_version": "v2", "window_start": T0,
                                         "window_end": T0 + HOUR, "tick_id": tick} for f in shape_findings("slower")])
    for k in range(1, 7):
        after_tick(config, open_store(), at(k))
    store = open_store()
    with store.transaction() as session:
        [inc] = store.incidents.load(session, "churn")
        verdicts = store.verdicts.load(session, "churn")
    assert inc["first_window_start"] == T0 + 2 * W
    [hour] = [v for v in verdicts if v["window_end"] - v["window_start"] == HOUR]
    assert hour["verdict"] == "slower" and hour["incident_id"] == inc["id"]


@pytest.mark.parametrize("gap", ["first start", "restart"])
def test_an_episode_inside_a_backlog_opens_and_resolves_as_it_would_have_live(open_store, tmp_path, gap):
    """The whole slower episode lies in windows one tick scored (a first start on a backlog, or a restart
    after the daemon was down): the alert stage evaluates each window as live ticks would have, and the
    incident has the live onset, opening and resolve."""
    config = make_config(tmp_path, slack_url="http://127.0.0.1:9/api/", alerts={"verdict": {"for": "15m"}})
    if gap == "restart":
        after_tick(config, open_store(), at(1))  # the last tick before the daemon went down
    store = open_store()
    with store.transaction() as session:
        tick = store.ticks.start(session, "churn", at(10))
    for k, shape in enumerate(SLOWER_EPISODE):
        write_window(store, k, shape)
    with store.transaction() as session:
        # A longer window the tick scored starts before any data: no window before T0 is evaluated.
        store.findings.upsert(session, [{**shape_findings("healthy")[0], "service": "churn", "model_version": "v2",
                                         "window_start": T0 - 4 * HOUR, "window_end": T0 + 4 * HOUR}])
        session.execute(update(FindingRow).values(tick_id=tick))
    report = after_tick(config, open_store(), at(10))
    with open_store().transaction() as session:
        incidents = open_store().incidents.load(session, "churn")
    assert len(incidents) == 1, report.transitions
    inc = incidents[0]
    assert (inc["status"], inc["verdict"], inc["first_window_start"]) == ("resolved", "slower", T0 + 2 * W)
    assert (inc["opened_at"], inc["resolved_at"]) == (at(4), at(8))


def test_restart_in_the_middle_of_pending_keeps_the_timer(open_store, tmp_path):
    config = make_config(tmp_path, alerts={"verdict": {"for": "30m"}})
    for k, shape in enumerate(["healthy", "slower", "slower", "slower", "slower"]):
        write_window(open_store(), k, shape)
    after_tick(config, open_store(), at(2))  # window 1 slower: pending
    assert states(open_store())["ModelRegression/v2"] == "pending"
    after_tick(config, open_store(), at(3))
    assert states(open_store())["ModelRegression/v2"] == "pending"
    after_tick(config, open_store(), at(4))  # 30 min after pending began: firing
    assert states(open_store())["ModelRegression/v2"] == "firing"
    with open_store().transaction() as session:
        incidents = session.scalars(select(Incident)).all()
    assert len(incidents) == 1 and outbox(open_store()) == []  # no Slack configured: tracked, nothing queued


def test_no_data_fires_and_inhibits_drift(open_store, tmp_path):
    config = make_config(tmp_path, slack_url="http://127.0.0.1:9/api/",
                         alerts={"verdict": {"for": "0s"}, "no_data": {"for": "0s"}})
    write_window(open_store(), 0, "healthy")
    write_window(open_store(), 1, "drift", partials=False)  # findings but no predictions stored: stale
    after_tick(config, open_store(), at(2))
    got = states(open_store())
    assert got["no_data/predictions"] == "firing" and got["InputDrift/v2"] == "firing"
    store = open_store()
    with store.transaction() as session:
        incidents = store.incidents.load(session)
    assert [(i["verdict"], i["model_version"]) for i in incidents] == [("no_data", None)]
    assert [kind for kind, _ in outbox(store)] == ["post"]


def test_tick_error_is_an_alert_of_its_own(open_store, tmp_path):
    config = make_config(tmp_path, slack_url="http://127.0.0.1:9/api/")
    write_window(open_store(), 0, "healthy")
    store = open_store()
    with store.transaction() as session:
        tick = store.ticks.start(session, "churn", at(1))
        store.ticks.finish(session, tick, "error", {}, {"error": "OSError: disk full"})
    after_tick(config, store, at(1))
    assert states(store)["error/"] == "firing"
    with store.transaction() as session:
        inc = store.incidents.load(session)[0]
    assert inc["verdict"] == "error" and "disk full" in str(inc["summary"])


def test_a_file_unreadable_tick_after_tick_is_an_error_alert(open_store, tmp_path):
    """One tick that could not read a file is retried quietly (a file mid-rotation); the same in each of
    `alerts.source_error_ticks` ticks in a row fires `error`, and a readable tick clears it."""
    config = make_config(tmp_path, slack_url="http://127.0.0.1:9/api/")
    assert config.alerts.source_error_ticks == 3
    store = open_store()

    def tick_at(k: int, unreadable: int) -> None:
        write_window(store, k - 1, "healthy")
        with store.transaction() as session:
            tick = store.ticks.start(session, "churn", at(k))
            store.ticks.finish(session, tick, "ok", {}, {"quarantined": {"source_error": unreadable} if unreadable else {}})
        after_tick(config, store, at(k))

    for k in (1, 2):
        tick_at(k, 1)
        assert states(store).get("error/") != "firing"
    tick_at(3, 1)
    assert states(store)["error/"] == "firing"
    with store.transaction() as session:
        [alert] = [r for r in session.scalars(select(AlertState)) if r.alertname == "error"]
        assert "could not be read in each of the last 3 ticks" in alert.annotations["errors"][0]
    tick_at(4, 0)
    assert states(store)["error/"] != "firing"


def test_a_tick_quarantining_most_rows_is_a_no_data_alert_naming_the_fields(open_store, tmp_path):
    """Logs the contract cannot read look like no traffic: while the newest tick that read rows quarantined
    more than limits.max_quarantine_share of them, `no_data` (source quarantine) fires with its warning;
    a tick that reads no new lines changes nothing; a tick that reads its rows again clears it."""
    from monitor.ingest.quarantine import warning

    config = make_config(tmp_path, slack_url="http://127.0.0.1:9/api/", alerts={"no_data": {"for": "0s"}})
    said = warning(100, Counter({"missing_field": 90}), Counter({"missing_field:predictions:request_id": 90}),
                   config.limits.max_quarantine_share)
    assert said and "request_id" in said
    store = open_store()

    def tick_at(k: int, warnings: list[str], rows_read: int = 100) -> None:
        write_window(store, k - 1, "healthy")
        with store.transaction() as session:
            tick = store.ticks.start(session, "churn", at(k))
            store.ticks.finish(session, tick, "ok", {"rows_read": rows_read}, {"warnings": warnings})
        after_tick(config, store, at(k))

    tick_at(1, [])
    assert states(store).get("no_data/quarantine") != "firing"
    tick_at(2, [said])
    assert states(store)["no_data/quarantine"] == "firing"
    with store.transaction() as session:
        [alert] = [r for r in session.scalars(select(AlertState)) if r.labels.get("source") == "quarantine"]
        assert "request_id" in alert.annotations["summary"] and alert.labels["severity"] == "page"
    quiet = range(3, 3 + config.alerts.source_error_ticks + 2)  # more ticks than the newest few read back
    for k in quiet:  # the logs arrive less often than the daemon ticks
        tick_at(k, [], rows_read=0)
        assert states(store)["no_data/quarantine"] == "firing", k
    tick_at(quiet[-1] + 1, [])
    assert states(store)["no_data/quarantine"] != "firing"


def test_silence_mutes_then_expiry_notifies(open_store, tmp_path):
    from monitor.alerts.silence import parse_matcher

    config = make_config(tmp_path, slack_url="http://127.0.0.1:9/api/", alerts={"verdict": {"for": "0s"}})
    for k in range(4):
        write_window(open_store(), k, "slower")
    store = open_store()
    with store.transaction() as session:
        sid = store.silences.add(session, [parse_matcher("service=churn")], "test", "maintenance", T0, T0 + 4 * W)
    report = after_tick(config, store, at(1))
    assert states(store)["ModelRegression/v2"] == "firing" and outbox(store) == []
    assert any("silence" in d["reason"] for d in report.decisions)
    with store.transaction() as session:
        assert store.silences.expire(session, sid, at(2) - timedelta(minutes=1))
        assert not store.silences.expire(session, sid, at(2))
    after_tick(config, open_store(), at(2))
    assert [kind for kind, _ in outbox(open_store())] == ["post"]


@pytest.mark.parametrize("slo,fires", [("p95 total latency <= 100 ms", True), ("p95 total latency <= 300 ms", False),
                                       ("timeout rate <= 0.5%", False)])
def test_slo_rule_alert(open_store, tmp_path, slo, fires):
    config = make_config(tmp_path, rules=[{"name": "slo", "slo": slo, "severity": "page"}])
    for k in range(3):
        write_window(open_store(), k, "slower")
    after_tick(config, open_store(), at(2))
    assert states(open_store())["slo/"] == ("firing" if fires else "inactive")


@pytest.mark.parametrize("coverage,state", [(0.0, "firing"), (0.4, "inactive")])
def test_stale_labels_are_a_no_data_alert(open_store, tmp_path, coverage, state):
    config = make_config(tmp_path, quality={"windows": ["1d"], "accepted_version": "v1"})
    write_window(open_store(), 0, "healthy")
    day = timedelta(days=1)
    store = open_store()
    with store.transaction() as session:
        store.findings.upsert(session, [{"service": "churn", "check": "label_coverage", "model_version": "v2",
                                         "window_start": T0 - 3 * day, "window_end": T0 - 2 * day,
                                         "labels": {"class": "all"}, "status": "ok", "value": coverage, "n": 5000}])
    after_tick(config, store, at(1))
    assert states(store).get("no_data/labels", "inactive") == state
