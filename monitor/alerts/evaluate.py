"""Alerts after Prometheus and Alertmanager: verdicts and SLO rules become alert samples; each alert
(identity = fingerprint of its sorted labels) goes inactive -> pending -> firing after `for`, then
resolves: a rule `keep_firing_for` after its condition clears, a verdict alert once `resolve_after`
windows in a row are clear or its version's traffic is gone (and it says which). Alerts are grouped by
`group_by` labels; a group's notifications (group_wait, group_interval, repeat_interval, silences,
inhibition) are written to the outbox in the same transaction as the state that caused them.

Each stage has its module: samples (samples), the lifecycle (lifecycle: `transition`), silences and
inhibition (silence: `muted_by`), grouping and dispatch (group: `dispatch`); they are pure functions with
the clock passed in, and `after_tick` here reads and writes the store around them.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from monitor.alerts.alert import ACTIVE_STATES, Alert, AlertsReport, Sample, fingerprint
from monitor.alerts.group import (
    Action,
    OpenIncident,
    attach_verdicts,
    dispatch,
    group_labels,
    notify_group,
    span_incident,
)
from monitor.alerts.lifecycle import transition
from monitor.alerts.samples import eval_windows, service_samples
from monitor.alerts.silence import muted_by
from monitor.config import Alerts, Config
from monitor.verdicts.windows import MAX_RESCORED, floor_to
from storage.database import utc
from storage.store import Store

log = logging.getLogger(__name__)


def after_tick(config: Config, store: Store, now: datetime) -> AlertsReport:
    """Verdicts for newly scored windows, rules, alert states and outbox items at clock `now`; after a gap
    (a first start on a backlog, a restart, a tick longer than a window) first at each clock a live tick
    would have evaluated a window no evaluation saw (missed_closes), so an episode inside the gap opens
    and resolves as it would have live."""
    now = utc(now)
    report = AlertsReport(now=now.isoformat())
    for clock in [*missed_closes(config, store, now), now]:
        step = _evaluate(config, store, clock)
        report.verdicts += step.verdicts
        report.transitions += step.transitions
        report.decisions += step.decisions
        report.enqueued += step.enqueued
        report.firing, report.pending = step.firing, step.pending
    return report


def missed_closes(config: Config, store: Store, now: datetime) -> list[datetime]:
    """The clocks (a window's end plus the join lateness) at which live ticks would have evaluated each
    service's shortest windows that closed after its last evaluation (on a first start: from the first
    shortest window a tick scored) and before the window `now` evaluates; the newest MAX_RESCORED (as many as a
    tick re-scores), oldest first."""
    out: set[datetime] = set()
    for service in config.services:
        start, end = eval_windows(service, now)[0]
        size, lateness = end - start, service.join.lateness
        with store.transaction() as session:
            cursor = store.alerts.cursor(session, service.name)
            if cursor is not None:  # the window after the one its last evaluation saw
                first = floor_to(utc(cursor.updated_at) - lateness, size) + size
            else:
                # The first window of the shortest length scored: a longer one may start before any data.
                scored = [s for _, s, e in store.findings.scored_since(session, service.name, 0, now)[0] if e - s == size]
                if not scored:
                    continue
                first = min(scored) + size
        ends = [first + k * size for k in range(max((end - first) // size, 0))]
        out.update(e + lateness for e in ends[-MAX_RESCORED:] if e + lateness < now)
    return sorted(out)


def _evaluate(config: Config, store: Store, now: datetime) -> AlertsReport:
    """after_tick's evaluation at one clock."""
    settings = config.alerts
    report = AlertsReport(now=now.isoformat())
    samples: list[Sample] = []
    services = set()
    for service in config.services:
        services.add(service.name)
        samples += service_samples(service, store, now, settings, report)
    with store.transaction() as session:
        _apply(session, store, samples, services, settings, now, report)
    return report


def _load_alerts(session, store: Store) -> dict[str, Alert]:
    return {r.fingerprint: Alert(r.fingerprint, dict(r.labels or {}), r.state, r.active_since, r.fired_at,
                                 r.resolved_at, r.last_active_at, r.last_eval_at, dict(r.annotations or {}),
                                 r.keep_firing_since)
            for r in store.alerts.load(session)}


def _apply(session, store: Store, samples: list[Sample], services: set[str], settings: Alerts, now: datetime,
           report: AlertsReport) -> None:
    """Transition every alert, then dispatch every group, writing states, incidents and outbox items."""
    alerts = _load_alerts(session, store)
    seen = set()
    for sample in samples:
        prev = alerts.get(sample.fingerprint)
        alert, why = transition(prev, sample, now)
        seen.add(sample.fingerprint)
        if prev is None or prev.state != alert.state:
            report.transitions.append(f"{_describe(alert.labels)}: {prev.state if prev else 'new'} -> "
                                      f"{alert.state} ({why})")
        alerts[alert.fingerprint] = alert
    for fp, alert in list(alerts.items()):
        # An alert no evaluation produced any more (a version without traffic, a removed rule) clears.
        if fp not in seen and alert.labels.get("service") in services and alert.state in ACTIVE_STATES:
            new, why = transition(alert, Sample(alert.labels, False, annotations={
                "resolution": "no longer evaluated (its rule was removed, or its labels changed)"}), now)
            report.transitions.append(f"{_describe(alert.labels)}: {alert.state} -> {new.state} (not evaluated: {why})")
            alerts[fp] = new
    _save_alerts(session, store, alerts.values(), settings, now)

    silences = store.silences.load(session, now)
    firing = [a for a in alerts.values() if a.state == "firing"]
    groups: dict[str, list[Alert]] = defaultdict(list)
    for a in alerts.values():
        if a.state in ACTIVE_STATES or a.state == "resolved":
            groups[fingerprint(group_labels(a.labels, settings.group_by))].append(a)
    open_incidents = {i.fingerprint: i for i in store.incidents.load_open(session)}
    for group_fp in sorted(set(groups) | set(open_incidents)):
        members = groups.get(group_fp, [])
        incident = open_incidents.get(group_fp)
        if incident is not None:
            # The incident's alerts: those that fired in it, even if resolved since.
            members = [a for a in members if a.state != "resolved" or (a.resolved_at and a.resolved_at >= incident.opened_at)]
        elif not any(a.state == "firing" for a in members):
            continue
        muted = {a.fingerprint: muted_by(a, firing, silences, settings, now) for a in members}
        view = OpenIncident(incident.id, incident.notified_hash, incident.last_notified_at) if incident else None
        decision = dispatch(members, muted, view, settings, now)
        labels = group_labels(members[0].labels, settings.group_by) if members else dict(incident.group_labels or {})
        report.decisions.append({"group": _describe(labels), "action": decision.action, "reason": decision.reason})
        if incident is not None:
            span_incident(incident, members)  # a backfill may have moved the onset while nothing is sent
        if decision.action == Action.NONE:
            if incident is not None:
                attach_verdicts(session, store, incident, now)  # its windows scored since it last notified
            continue
        report.enqueued += notify_group(session, store, decision, group_fp, labels, members, muted, incident, settings, now)
    report.firing = sum(a.state == "firing" for a in alerts.values())
    report.pending = sum(a.state == "pending" for a in alerts.values())


def _save_alerts(session, store: Store, alerts, settings: Alerts, now: datetime) -> None:
    stored = {r.fingerprint: r for r in store.alerts.load(session)}
    for a in alerts:
        row = stored.get(a.fingerprint)
        if row is None:
            row = store.alerts.add(session, a.fingerprint)
        row.labels, row.state, row.active_since, row.fired_at = a.labels, a.state, a.active_since, a.fired_at
        row.resolved_at, row.last_eval_at, row.annotations = a.resolved_at, a.last_eval_at, a.annotations
        row.last_active_at, row.keep_firing_since, row.updated_at = a.last_active_at, a.keep_firing_since, now
        row.service, row.alertname = a.labels.get("service"), a.labels.get("alertname")
        row.group_fingerprint = fingerprint(group_labels(a.labels, settings.group_by))
    session.flush()


def _describe(labels: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
