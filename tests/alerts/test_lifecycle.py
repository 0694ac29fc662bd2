"""The alert lifecycle, table-driven with an explicit `now`: transition, silences, inhibition, dispatch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from monitor.alerts.alert import Alert, Sample
from monitor.alerts.group import OpenIncident, content_hash, dispatch
from monitor.alerts.lifecycle import transition
from monitor.alerts.silence import muted_by, parse_matcher
from monitor.config import Alerts

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
M = timedelta(minutes=1)
LABELS = {"alertname": "ModelRegression", "service": "churn", "model_version": "v2", "severity": "page"}

# (name, for, keep_firing_for, [(minute, active, expected state), ...])
TRANSITIONS = [
    ("pending then firing after for, kept, resolved", 10, 20, [
        (0, True, "pending"), (5, True, "pending"), (10, True, "firing"), (15, False, "firing"),
        (30, False, "firing"), (35, False, "resolved"), (40, False, "resolved")]),
    ("cleared while pending goes back to inactive", 10, 0, [
        (0, True, "pending"), (5, False, "inactive"), (10, True, "pending"), (20, True, "firing")]),
    ("no for: firing at once; no keep: resolved at once", 0, 0, [
        (0, True, "firing"), (15, False, "resolved")]),
    ("too few requests holds the state", 10, 0, [
        (0, True, "pending"), (5, None, "pending"), (10, True, "firing"), (15, None, "firing"),
        (20, False, "resolved")]),
    ("a flap inside keep_firing_for stays one firing episode", 0, 20, [
        (0, True, "firing"), (15, False, "firing"), (20, True, "firing"), (45, False, "firing"),
        (65, False, "resolved")]),
    ("resolved alert that comes back starts over at pending", 10, 0, [
        (0, True, "pending"), (10, True, "firing"), (15, False, "resolved"), (20, True, "pending"),
        (30, True, "firing")]),
]


@pytest.mark.parametrize("name,for_min,keep_min,steps", TRANSITIONS, ids=[t[0] for t in TRANSITIONS])
def test_transition_table(name, for_min, keep_min, steps):
    alert = None
    fired = []
    for minute, active, expected in steps:
        sample = Sample(LABELS, active, for_min * M, keep_min * M, {"window_start": (T0 + minute * M).isoformat()})
        alert, why = transition(alert, sample, T0 + minute * M)
        assert alert.state == expected, f"{name} at +{minute}m: {alert.state} ({why})"
        if alert.state == "firing" and alert.fired_at not in fired:
            fired.append(alert.fired_at)
    assert alert.fingerprint == Sample(LABELS, True).fingerprint


def test_onset_is_kept_through_the_episode():
    first, second = T0.isoformat(), (T0 + 15 * M).isoformat()
    a, _ = transition(None, Sample(LABELS, True, 10 * M, annotations={"window_start": first}), T0)
    a, _ = transition(a, Sample(LABELS, True, 10 * M, annotations={"window_start": second}), T0 + 10 * M)
    assert a.state == "firing" and a.annotations["onset"] == first and a.annotations["window_start"] == second


def test_fingerprint_is_the_sorted_label_set():
    assert Sample({"b": "1", "a": "2"}, True).fingerprint == Sample({"a": "2", "b": "1"}, True).fingerprint
    assert Sample({"a": "1"}, True).fingerprint != Sample({"a": "2"}, True).fingerprint


def firing(labels=LABELS, at=T0, digest="slower") -> Alert:
    return Alert(Sample(labels, True).fingerprint, dict(labels), "firing", at, at, None, at, at, {"digest": digest})


SETTINGS = Alerts(group_wait="30s", group_interval="5m", repeat_interval="4h")


def notified(alerts, at) -> OpenIncident:
    return OpenIncident(1, content_hash(alerts), at)


# (name, alerts, muted, incident, now offset, expected action)
A = firing()
B = firing({**LABELS, "alertname": "InputDrift", "severity": "warn"}, digest="drift")
DISPATCH = [
    ("new firing group posts, due after group_wait", [A], {}, None, 0, "post"),
    ("pending only: nothing", [Alert(A.fingerprint, A.labels, "pending", T0)], {}, None, 0, "none"),
    ("silenced: nothing", [A], {A.fingerprint: "silence 1"}, None, 0, "none"),
    ("unchanged within repeat_interval: nothing", [A], {}, notified([A], T0), 60, "none"),
    ("unchanged past repeat_interval: repeat", [A], {}, notified([A], T0), 4 * 60, "repeat"),
    ("a new alert joined, within group_interval: wait", [A, B], {}, notified([A], T0), 2, "none"),
    ("a new alert joined, past group_interval: update", [A, B], {}, notified([A], T0), 5, "update"),
    ("all resolved: resolve", [Alert(A.fingerprint, A.labels, "resolved", None, T0, T0)], {},
     notified([A], T0), 30, "resolve"),
    ("muted after notifying: stay quiet, not resolved", [A], {A.fingerprint: "silence 2"}, notified([A], T0),
     4 * 60, "none"),
]


@pytest.mark.parametrize("name,alerts,muted,incident,minutes,action", DISPATCH, ids=[d[0] for d in DISPATCH])
def test_dispatch_table(name, alerts, muted, incident, minutes, action):
    decision = dispatch(alerts, muted, incident, SETTINGS, T0 + minutes * M)
    assert decision.action == action, decision.reason
    assert decision.reason
    if action == "post":
        assert decision.due == T0 + timedelta(seconds=30)


def test_silence_matchers_and_expiry():
    silence = {"id": 7, "matchers": [parse_matcher("service=churn"), parse_matcher("alertname=~Model.*")],
               "starts_at": T0, "ends_at": T0 + 60 * M}
    assert muted_by(A, [A], [silence], SETTINGS, T0 + M) == "silence 7"
    assert muted_by(A, [A], [silence], SETTINGS, T0 + 60 * M) is None  # expired
    assert muted_by(A, [A], [silence], SETTINGS, T0 - M) is None  # not started
    other = {**silence, "matchers": [parse_matcher("model_version!=v2")]}
    assert muted_by(A, [A], [other], SETTINGS, T0 + M) is None
    with pytest.raises(ValueError):
        parse_matcher("no operator")


def test_inhibition_needs_a_firing_source_with_equal_labels():
    no_data = firing({"alertname": "no_data", "service": "churn", "severity": "page", "source": "predictions"})
    drift = firing({"alertname": "InputDrift", "service": "churn", "model_version": "v2", "severity": "warn"})
    assert muted_by(drift, [no_data, drift], [], SETTINGS, T0) == "inhibited by no_data"
    other_service = firing({**no_data.labels, "service": "fraud"})
    assert muted_by(drift, [other_service, drift], [], SETTINGS, T0) is None
    # A regression of another version does not mute this version's drift (equal: service, model_version).
    regression_v3 = firing({**LABELS, "model_version": "v3"})
    assert muted_by(drift, [regression_v3, drift], [], SETTINGS, T0) is None
    assert muted_by(drift, [firing(), drift], [], SETTINGS, T0) == "inhibited by ModelRegression"


RULE = {"rule": "recall", "metric": "recall", "class": "1", "group": "occupation_5"}


def _rule(status: str, n: int = 40, estimated: bool = False, value: float = 0.7) -> dict:
    return {"check": "acceptance", "labels": dict(RULE), "status": status, "n": n, "value": value,
            "baseline": 0.8, "detail": {"estimated": True} if estimated else {}}


# (name, the window's acceptance findings, held)
RULE_BACK = [
    ("decided clear: back", [_rule("ok", 400)], False),
    ("too few labels to tell: held", [_rule("insufficient", 12)], True),
    ("still breaching: held", [_rule("breach", 400)], True),
    ("not scored at all (no such group today): not held", [], False),
    ("an estimate does not clear what labels hold", [_rule("insufficient", 12), _rule("ok", 900, estimated=True)], True),
    ("an estimate speaks when no label scored it", [_rule("ok", 900, estimated=True)], False),
    ("the shortest decided window speaks", [_rule("insufficient", 12), _rule("ok", 300)], False),
]


@pytest.mark.parametrize("name,found,held", RULE_BACK, ids=[r[0] for r in RULE_BACK])
def test_a_quality_episode_is_back_only_where_a_window_decides_it(name, found, held):
    """An episode that breached on an acceptance rule holds until a window decides the rule clear: a
    small group's window that cannot exclude the drop neither resolves it nor counts as clear."""
    from monitor.alerts.lifecycle import lifecycle, not_back, pre_incident
    from monitor.verdicts.verdict import Verdict

    pre = pre_incident([[{"check": "acceptance", "labels": dict(RULE), "status": "breach", "value": 0.6,
                          "baseline": 0.8, "n": 300}]])
    assert list(pre.values()) == [{"check": "acceptance", "labels": RULE, "baseline": 0.8, "value": 0.6}]
    why = not_back(pre, found, Alerts().verdict)
    assert bool(why) == held, why
    if held:
        assert "occupation_5" in why[0] and ("too few labels" in why[0] or "still breaching" in why[0])
    # The lifecycle: a healthy verdict long after the breach resolves only when nothing holds it.
    healthy = Verdict("svc", "v2", T0, T0 + timedelta(days=1), "healthy", rows=500)
    active, resolves, notes = lifecycle("v2", healthy, [], ("worse", "both"), end=T0 + timedelta(days=1),
                                        shortest=timedelta(days=1), serving=["v2"], resolve_after=1,
                                        last_active_end=T0 - timedelta(days=3), not_back=why)
    assert (active, resolves) == (False, not held)
    assert ("clearing" in notes) == held and ("resolution" in notes) == (not held)
