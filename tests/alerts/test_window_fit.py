"""Alerts on every window length: each finding is taken from the shortest last complete window that
decides it, one alert per version and verdict; table-driven with an explicit `now`, on SQLite and
PostgreSQL."""

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
from storage.models import AlertState, Outbox
from storage.rows import PartialRow

DAY = datetime(2026, 11, 2, tzinfo=UTC)
HOUR = timedelta(hours=1)
NOW = DAY + timedelta(days=1, minutes=10)  # past the 5 min join lateness: [23:00, 24:00) and the day are closed
RECALL = {"metric": "recall", "class": "yes", "group": "all"}


def finding(check, labels, status, n, value=1.0, baseline=1.0, needed=None) -> dict:
    return {"check": check, "labels": labels, "status": status, "n": n, "value": value, "baseline": baseline,
            "detail": {"needed_n": needed} if needed else {}}


def window_findings(n: int, p95: str, recall: str, p50: str = "ok") -> list[dict]:
    """A window of n requests: failure rate (decides from 100), total p50 (from 6) and p95 (from 72), and
    the recall acceptance rule (from 30 labels, 80% of them labelled)."""
    labelled = int(n * 0.8)
    return [finding("latency", {"rate": "failure"}, "ok" if n >= 100 else "insufficient", n, 0.0, 0.0),
            finding("latency", {"stage": "total", "quantile": "p50"}, p50, n, 40.0, 40.0, 6),
            finding("latency", {"stage": "total", "quantile": "p95"}, p95, n,
                    300.0 if p95 == "breach" else 90.0, 90.0, 72),
            finding("latency", {"stage": "model", "quantile": "p95"}, p95, n,
                    270.0 if p95 == "breach" else 60.0, 60.0, 72),
            finding("acceptance", RECALL, recall, labelled, 0.55 if recall == "breach" else 0.9, 0.9, 30)]


# name -> (findings of the hour [23:00, 24:00), findings of the day, ModelRegression state, verdict, onset)
CASES = {
    # At ~165 requests a day the hour holds 7: only the day decides recall, and its breach pages.
    "quality decided on the day only": (window_findings(7, "insufficient", "insufficient"),
                                        window_findings(165, "ok", "breach"), "firing", "worse", DAY),
    # The shortest window that decides a finding speaks for it: the hour's recall holds.
    "the hour decides first": (window_findings(120, "ok", "ok"), window_findings(2900, "ok", "breach"),
                               "inactive", None, None),
    # A slowdown both lengths see is one alert, with its onset at the hour that decided it.
    "slower on every length": (window_findings(120, "breach", "insufficient"),
                               window_findings(2900, "breach", "insufficient"), "firing", "slower", DAY + 23 * HOUR),
    # Nothing decides anywhere: the state holds, and the verdicts say what each check needs.
    "nothing decides": (window_findings(3, "insufficient", "insufficient", p50="insufficient"),
                        window_findings(5, "insufficient", "insufficient", p50="insufficient"), "inactive", None, None),
}


def write(store, start: datetime, end: datetime, findings: list[dict], rows: int = 0) -> None:
    """The window's findings, and with `rows` its last bucket's partial (so the hour is not `no_data`)."""
    part = Partial(Counter({"rows": rows, "status:ok": rows}),
                   sketches={"latency_ms": Sketch.of(np.full(rows, 50.0))})
    with store.transaction() as session:
        store.findings.upsert(session, [{**f, "service": "churn", "model_version": "v2", "window_start": start,
                                         "window_end": end} for f in findings])
        if rows:
            store.partials.upsert(session, "churn", [PartialRow("v2", end - timedelta(minutes=5), 300, "", rows,
                                                                part.to_bytes())], merge_bytes)


@pytest.mark.parametrize("case", CASES)
def test_alerts_sample_every_window_length(open_store, tmp_path, case):
    hour, day, state, verdict, onset = CASES[case]
    config = make_config(tmp_path, slack_url="http://127.0.0.1:9/api/", windows=["1h", "1d"],
                         quality={"windows": ["1d"], "rules": [{**RECALL, "max_drop": 0.05}]})
    write(open_store(), DAY + 23 * HOUR, DAY + 24 * HOUR, hour, hour[0]["n"])
    write(open_store(), DAY, DAY + 24 * HOUR, day)
    store = open_store()
    report = after_tick(config, store, NOW)
    with store.transaction() as session:
        alerts = {r.alertname: r for r in session.scalars(select(AlertState)) if r.alertname == "ModelRegression"}
        posts = [o for o in session.scalars(select(Outbox)) if o.kind == "post"]
        stored = {(v["window_start"], v["window_end"]): v for v in store.verdicts.load(session, "churn")}
    assert list(alerts) == ["ModelRegression"], report.transitions  # one identity, whatever the lengths
    alert = alerts["ModelRegression"]
    assert alert.state == state, (report.transitions, report.verdicts)
    if verdict is not None:
        assert alert.annotations["verdict"] == verdict
        assert datetime.fromisoformat(alert.annotations["onset"]) == onset
        assert len(posts) == 1
    if case == "quality decided on the day only":
        assert "acceptance" in alert.annotations["summary"] and alert.annotations["rows"] == 165
    if case == "slower on every length":
        assert alert.annotations["attribution"]["top_stage"] == "model"
    if case == "nothing decides":
        assert not posts
        day_verdict = stored[(DAY, DAY + 24 * HOUR)]
        assert day_verdict["verdict"] == "insufficient_data"
        needed = {(e["check"], e["labels"].get("quantile")): e.get("needed_n") for e in day_verdict["evidence"]}
        assert needed[("latency", "p95")] == 72 and needed[("acceptance", None)] == 30
        assert "n=5 of 6 needed" in day_verdict["summary"]


def coverage(matured: bool, n: int = 165) -> dict:
    """The label coverage finding of a quality window, its labels matured or not."""
    return {**finding("label_coverage", {"class": "all"}, "ok", n, 0.97 if matured else 0.1, None),
            "detail": {"matured": matured}}


def test_labels_that_mature_late_reach_the_alert(open_store, tmp_path):
    """The recall of 10:00-11:00 breaches once its labels matured, at 13:10, while the last hour's labels
    are not in yet: the newest hour whose labels matured speaks for it, so the breach alerts (since 10:00);
    the 11:00 hour maturing clear resolves it."""
    config = make_config(tmp_path, windows=["15m"], quality={"windows": ["1h"], "rules": [{**RECALL, "max_drop": 0.05}]})
    at = DAY + 10 * HOUR
    quarter = timedelta(minutes=15)
    healthy = [f for f in window_findings(120, "ok", "ok") if f["check"] == "latency"]
    write(open_store(), at + 3 * HOUR - quarter, at + 3 * HOUR, healthy, 120)
    write(open_store(), at + 2 * HOUR, at + 3 * HOUR,
          [*window_findings(5, "insufficient", "insufficient"), coverage(False, 5)])
    write(open_store(), at, at + HOUR, [*window_findings(900, "ok", "breach"), coverage(True, 900)])
    after_tick(config, open_store(), at + 3 * HOUR + timedelta(minutes=10))
    alert = regression(open_store())
    assert (alert.state, alert.annotations.get("verdict")) == ("firing", "worse"), alert.annotations.get("summary")
    assert datetime.fromisoformat(alert.annotations["onset"]) == at
    write(open_store(), at + 3 * HOUR, at + 3 * HOUR + quarter, healthy, 120)
    write(open_store(), at + HOUR, at + 2 * HOUR, [*window_findings(900, "ok", "ok"), coverage(True, 900)])
    after_tick(config, open_store(), at + 3 * HOUR + timedelta(minutes=25))
    alert = regression(open_store())
    assert alert.state == "resolved" and alert.annotations["resolution"].startswith("fixed")


def regression(store) -> AlertState:
    with store.transaction() as session:
        [row] = [r for r in session.scalars(select(AlertState)) if r.alertname == "ModelRegression"]
        session.expunge(row)
    return row


def test_a_worse_verdict_confirmed_by_labels_days_late_reaches_the_alerts(open_store, tmp_path):
    """Labels a week late: the last complete day is not judged on quality yet, the day six days back has
    matured and breaches the recall rule. Within maturity_horizon, that confirmed worse verdict fires, dated
    to its window."""
    config = make_config(tmp_path, slack_url="http://127.0.0.1:9/api/", windows=["1h", "1d"],
                         quality={"windows": ["1d"], "maturity_horizon": "10d",
                                  "rules": [{**RECALL, "max_drop": 0.05}]})
    old = DAY - timedelta(days=6)
    hour = [f for f in window_findings(120, "ok", "insufficient") if f["check"] != "acceptance"]
    write(open_store(), DAY + 23 * HOUR, DAY + 24 * HOUR, hour, 120)
    write(open_store(), DAY, DAY + 24 * HOUR, [*window_findings(165, "ok", "insufficient")[:-1], coverage(False)])
    write(open_store(), old, old + 24 * HOUR, [*window_findings(165, "ok", "breach"), coverage(True)])
    store = open_store()
    report = after_tick(config, store, NOW)
    with store.transaction() as session:
        [alert] = [r for r in session.scalars(select(AlertState)) if r.alertname == "ModelRegression"]
    assert alert.state == "firing", report.transitions
    assert alert.annotations["verdict"] == "worse" and not alert.annotations["estimated"]
    assert datetime.fromisoformat(alert.annotations["onset"]) == old
