"""bench/incidents.py's scoring on small hand-made incidents and verdicts: onset error, first alert,
premature resolves, resolve delay, false pages, deploy alerts, the verdict per window and the misses."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from monitor.simulate import SCENARIOS

_spec = importlib.util.spec_from_file_location(
    "bench_incidents", Path(__file__).resolve().parents[2] / "bench" / "incidents.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # dataclasses look their module up there
_spec.loader.exec_module(bench)

T0 = datetime(2026, 11, 2, tzinfo=UTC)
W = timedelta(minutes=15)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def truth(verdict="slower", onset=1.0, fault_end=2.5, hours=4.0, before="v1", after="v2", deploys=(), events=()):
    return bench.Truth(verdict, T0, at(hours), None if onset is None else at(onset),
                       None if fault_end is None else at(fault_end), before, after, tuple(deploys),
                       tuple(sorted(deploys + events)))


def incident(i, verdict, opened, since, resolved=None, severity="page", version="v2"):
    return {"id": i, "verdict": verdict, "model_version": version, "opened_at": at(opened),
            "first_window_start": None if since is None else at(since),
            "resolved_at": None if resolved is None else at(resolved), "summary": {"severity": severity}}


def verdicts(version, start_h, end_h, verdict):
    out, t = [], at(start_h)
    while t < at(end_h):
        out.append({"model_version": version, "window_start": t, "window_end": t + W, "verdict": verdict})
        t += W
    return out


def test_window_truth_version_change_and_straddling_windows():
    tr = truth()
    assert bench.window_truth(tr, "v2", at(1.0), at(1.25)) == "slower"
    assert bench.window_truth(tr, "v1", at(1.0), at(1.25)) == "healthy"  # the old version is unaffected
    assert bench.window_truth(tr, "v1", at(0.75), at(1.0)) == "healthy"
    assert bench.window_truth(tr, "v2", at(0.9), at(1.15)) is None  # straddles the onset
    assert bench.window_truth(tr, "v2", at(2.4), at(2.65)) is None  # straddles the fault end
    assert bench.window_truth(tr, "v1", at(2.5), at(2.75)) == "healthy"
    same = truth(before="v1", after="v1")
    assert bench.window_truth(same, "v1", at(1.0), at(1.25)) == "slower"
    assert bench.window_truth(truth(fault_end=None), "v2", at(3.75), at(4.0)) == "slower"
    assert bench.window_truth(truth("healthy", onset=None, fault_end=None), "v2", at(1), at(1.25)) == "healthy"


def test_quality_windows_without_labels_by_the_end_are_left_out():
    tr = bench.Truth("worse", T0, at(4.0), at(1.0), None, "v1", "v2", labels_until=at(3.0))
    assert bench.window_truth(tr, "v2", at(2.75), at(3.0)) == "worse"
    assert bench.window_truth(tr, "v2", at(3.0), at(3.25)) is None  # its labels came after the run
    assert bench.window_truth(tr, "v2", at(0.5), at(0.75)) == "healthy"  # before the onset: judged as ever
    rows = verdicts("v2", 1.0, 3.0, "worse") + verdicts("v2", 3.0, 4.0, "drift")
    assert bench.score(tr, [], rows).right_share == 1.0


def test_a_real_data_quality_fault_is_scored_on_its_quality_window():
    from monitor.simulate import realdata

    case = realdata.shuttle_case(days=33, label_delay_days=7, quality_windows=("7d",))
    end = case.start + timedelta(days=33)
    assert bench.case_window(case, "slowdown", end) == (timedelta(days=1), None)
    window, labels_until = bench.case_window(case, "quality", end)
    assert window == timedelta(days=7) and labels_until == end - timedelta(days=7, hours=6)


def test_one_incident_dated_right_resolved_after_the_fault():
    tr = truth()
    s = bench.score(tr, [incident(1, "slower", opened=1.5, since=1.0, resolved=3.0)], [])
    assert (s.verdict, s.onset_error_min, s.first_alert_min, s.resolve_delay_min) == ("slower", 0, 30, 30)
    assert s.premature_resolves == 0 and s.false_pages == 0


def test_a_backlog_alerts_no_earlier_than_the_daemon_starts():
    tr = truth()
    caught_up = [incident(1, "slower", opened=1.25, since=1.0, resolved=3.0)]  # dated to its live opening
    assert bench.score(tr, caught_up, []).first_alert_min == 15
    assert bench.score(tr, caught_up, [], first_tick=at(1.75)).first_alert_min == 45
    assert bench.score(tr, caught_up, [], first_tick=at(0.5)).first_alert_min == 15


def test_incident_dated_to_the_noticing_tick_and_resolved_early():
    tr = truth()
    incidents = [incident(1, "slower", opened=1.75, since=1.5, resolved=2.0),
                 incident(2, "slower", opened=2.25, since=2.0, resolved=2.75)]
    s = bench.score(tr, incidents, [])
    assert s.onset_error_min == 30 and s.first_alert_min == 45
    assert s.premature_resolves == 1 and s.resolve_delay_min == 15
    assert bench.misses(tr, s) == ["onset error > 1 window", "1 premature resolve(s)",
                                   "right verdict < 95% of fault windows"]


def test_still_open_is_never_resolved_and_any_resolve_is_premature_without_an_end():
    s = bench.score(truth(), [incident(1, "slower", opened=1.25, since=1.0)], [])
    assert s.resolve_delay_min is None and "never resolved" in bench.misses(truth(), s)
    no_end = truth(fault_end=None)
    s = bench.score(no_end, [incident(1, "slower", opened=1.25, since=1.0, resolved=3.9)], [])
    assert s.premature_resolves == 1 and s.resolve_delay_min is None


def test_pages_outside_the_fault_are_false_pages_per_simulated_day():
    tr = truth(hours=48.0)
    incidents = [incident(1, "slower", opened=1.25, since=1.0, resolved=2.75),  # about the fault
                 incident(2, "slower", opened=0.5, since=0.25, resolved=0.75),  # before the onset: false
                 incident(3, "no_data", opened=10, since=None, version=None),  # not a regression: false
                 incident(4, "drift", opened=20, since=19.5, severity="warn")]  # warn: not a page
    s = bench.score(tr, incidents, [])
    assert s.false_pages == 2 and s.false_pages_per_day == 1.0
    assert s.first_alert_min == 15


def test_severity_is_the_loudest_fired_alert():
    inc = {"summary": {"severity": "info", "alerts": [
        {"labels": {"severity": "page"}, "fired_at": "x"}, {"labels": {"severity": "warn"}, "fired_at": None}]}}
    assert bench.severity(inc) == "page"
    assert bench.severity({"summary": None}) == "info"


def test_healthy_week_counts_pages_and_alerts_on_the_equivalent_deploy():
    tr = truth("healthy", onset=None, fault_end=None, hours=168.0, deploys=(at(34),), events=(at(62), at(83)))
    incidents = [incident(1, "slower", opened=35, since=34, severity="warn", version="v2"),
                 incident(2, "drift", opened=40, since=39, severity="info", version="v2"),  # info: not an alert
                 incident(3, "slower", opened=50, since=49, severity="page", version="v2"),
                 incident(4, "slower", opened=62.5, since=62, severity="page", version="v2"),  # the cache restart's
                 incident(5, "drift", opened=40, since=39, severity="warn", version="v1")]  # not the deployed version
    s = bench.score(tr, incidents, verdicts("v2", 34, 35, "slower"))
    assert s.deploy_alerts == 2 and s.false_pages == 2 and s.verdict == "healthy"
    assert s.incident_windows == 0 and s.confusion[("healthy", "slower")] == 4
    assert bench.misses(tr, s) == ["2 page(s)", "2 alert(s) on the equivalent deploy"]
    assert bench.misses(tr, bench.score(tr, [], [])) == []


def test_verdict_per_window_right_share_and_opposite_kind():
    tr = truth("worse")
    rows = (verdicts("v1", 0, 1, "healthy") + verdicts("v2", 1, 1.75, "worse") + verdicts("v2", 1.75, 2.25, "slower")
            + verdicts("v2", 2.25, 2.5, "insufficient_data") + verdicts("v1", 2.5, 4, "healthy"))
    rows.append({"model_version": "v2", "window_start": at(1), "window_end": at(2), "verdict": "slower"})  # 1 h
    s = bench.score(tr, [incident(1, "worse", opened=1.25, since=1.0, resolved=2.75)], rows)
    assert s.incident_windows == 6 and s.right_windows == 3 and s.opposite_windows == 2
    assert s.right_share == pytest.approx(0.5)
    assert s.confusion == Counter({("healthy", "healthy"): 10, ("worse", "worse"): 3, ("worse", "slower"): 2,
                                   ("worse", "insufficient_data"): 1})
    assert bench.misses(tr, s) == ["right verdict < 95% of fault windows", "2 window(s) of the opposite kind"]


def test_all_targets_met_is_no_miss():
    tr = truth("both")
    rows = verdicts("v1", 0, 1, "healthy") + verdicts("v2", 1, 2.5, "both") + verdicts("v1", 2.5, 4, "healthy")
    s = bench.score(tr, [incident(1, "both", opened=1.25, since=1.0, resolved=3.0)], rows)
    assert bench.misses(tr, s) == [] and s.right_share == 1.0
    late = bench.score(tr, [incident(1, "both", opened=1.25, since=1.0, resolved=3.5)], rows)
    assert bench.misses(tr, late) == ["resolved > 3 windows after the fault end"]
    assert bench.misses(tr, bench.score(tr, [], rows)) == ["no both incident"]


@pytest.mark.slow  # ~6 s a replay: the short version of `bench/incidents.py --short`
@pytest.mark.parametrize("scenario, mode", [(s, m) for s in SCENARIOS for m in ("live", "backlog")])
def test_short_replay_meets_every_target(scenario, mode, monkeypatch):
    """Every simulator scenario replayed live and as a backlog, scored against its ground truth: onset
    within a window, no premature resolve, resolved within 3 windows of the fault's end, the right verdict
    on >= 95% of the fault's windows and none of the opposite kind, no false page."""
    from alerts_support import TOKEN

    monkeypatch.setenv("TW_SLACK_TOKEN", TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    truth, s, incidents, _ = bench.replay(scenario, bench.Plan.of(scenario, short=True), mode)
    assert bench.misses(truth, s) == [], (bench.row(scenario, mode, truth, s),
                                          [bench.describe(i) for i in incidents])
