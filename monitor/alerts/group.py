"""Grouping and dispatch (Alertmanager): when a group of alerts notifies and why, and the group's
incident and outbox items written for it."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from monitor.alerts.alert import DRIFT, REGRESSION, SEVERITY_RANK, Alert
from monitor.alerts.render import route
from monitor.config import Alerts
from storage.alerts import Incident, Incidents
from storage.database import utc
from storage.jsontext import dumps
from storage.store import Store

ALERT = "alert"  # the outbox kind of an Alertmanager message


def group_labels(labels: Mapping[str, str], group_by: Sequence[str]) -> dict[str, str]:
    return {k: labels[k] for k in group_by if k in labels}


@dataclass(frozen=True)
class OpenIncident:
    """What dispatch needs to know of a group's open incident."""

    id: int
    notified_hash: str | None
    last_notified_at: datetime | None


class Action(enum.StrEnum):
    """What a group's dispatch decides to send now; the value is what reports and messages say."""

    NONE = "none"
    POST = "post"
    UPDATE = "update"
    REPEAT = "repeat"
    RESOLVE = "resolve"


@dataclass(frozen=True)
class Decision:
    """What to send for one group now (an Action), and why."""

    action: Action
    reason: str
    content: str = ""  # hash of what the notification says (firing alerts and their digests)
    due: datetime | None = None  # when the notification may be sent (None: now)


def content_hash(alerts: Sequence[Alert]) -> str:
    """What a notification says, as a hash: which alerts fire, their digests (verdict, cause), severity
    and onset, not their numbers: values move every window, the story does not."""
    body = sorted((a.fingerprint, str(a.annotations.get("digest", "")), a.labels.get("severity", ""),
                   str(a.annotations.get("onset", ""))) for a in alerts)
    return hashlib.sha256(dumps(body).encode()).hexdigest()[:16]


def dispatch(alerts: Sequence[Alert], muted: Mapping[str, str | None], incident: OpenIncident | None,
             settings: Alerts, now: datetime) -> Decision:
    """Alertmanager's dispatch for one group at `now`: whether to notify and why."""
    firing = [a for a in alerts if a.state == "firing"]
    loud = [a for a in firing if not muted.get(a.fingerprint)]
    content = content_hash(loud)
    if incident is None:
        if not loud:
            # Nothing firing unmuted: nothing to say (pending alerts wait for `for`, muted ones stay quiet).
            return Decision(Action.NONE, "no unmuted firing alert" if not firing else "all firing alerts muted: "
                            + "; ".join(sorted({str(muted[a.fingerprint]) for a in firing})))
        first = min(a.fired_at or now for a in loud)
        # A new group: open the incident with one message, held until group_wait after the first alert
        # fired (alerts evaluated in the same tick already share it).
        return Decision(Action.POST, f"{len(loud)} alert(s) firing; due after group_wait", content,
                        max(now, first + settings.group_wait))
    if not firing and not any(a.state == "pending" for a in alerts):
        # Every alert of the incident cleared (keep_firing_for passed): say it is resolved, once.
        return Decision(Action.RESOLVE, "every alert resolved", content)
    if not firing:
        # Cleared, but an alert is pending again: wait for it to fire or clear before saying anything.
        return Decision(Action.NONE, "no alert firing, one pending again", content)
    if not loud:
        # Still firing but all muted: a silence or inhibition means "stop talking", not "resolved".
        return Decision(Action.NONE, "firing alerts muted: " + "; ".join(sorted({str(muted[a.fingerprint])
                                                                                  for a in firing})), content)
    since = now - (incident.last_notified_at or now)
    if content != incident.notified_hash:
        if since >= settings.group_interval:
            # The story changed (an alert joined or left, the verdict or cause moved): update in place.
            return Decision(Action.UPDATE, "the firing alerts or their verdict changed", content)
        # group_interval: batch changes instead of editing the message on every evaluation.
        return Decision(Action.NONE, f"changed, but group_interval not over ({since} of {settings.group_interval})",
                        content)
    if since >= settings.repeat_interval:
        # repeat_interval: still firing, unchanged: remind in the thread.
        return Decision(Action.REPEAT, f"unchanged for {since}: repeat", content)
    # Unchanged and notified recently: already said.
    return Decision(Action.NONE, "already notified; nothing changed", content)


def _headline(members: Sequence[Alert]) -> Alert:
    """The alert a message leads with: a firing regression, then drift, then by severity."""
    order = {REGRESSION: 0, DRIFT: 1}
    return min(members, key=lambda a: (a.state != "firing", order.get(a.labels.get("alertname"), 2),
                                       SEVERITY_RANK.get(a.labels.get("severity"), 3), a.fingerprint))


def notify_group(session, store: Store, decision: Decision, group_fp: str, labels: dict[str, str],
                 members: list[Alert], muted: dict[str, str | None], incident: Incident | None, settings: Alerts,
                 now: datetime) -> int:
    """Open / update / resolve the group's incident and write its outbox items; returns how many."""
    head = _headline(members) if members else None
    verdict = (head.annotations.get("verdict") or head.labels.get("alertname")) if head else "resolved"
    if incident is None:
        incident = store.incidents.add(
            session, service=labels.get("service") or (head.labels.get("service", "") if head else ""),
            model_version=labels.get("model_version"), verdict=verdict, status="open",
            opened_at=min(a.fired_at or now for a in members if a.state == "firing"),
            fingerprint=group_fp, group_labels=labels, revision=0, updated_at=now)
    incident.revision += 1
    if decision.action != Action.RESOLVE:
        incident.verdict = verdict
    span_incident(incident, members)
    if decision.action == Action.RESOLVE:
        incident.status, incident.resolved_at = "resolved", now
    incident.notified_hash, incident.last_notified_at, incident.updated_at = decision.content, now, now
    loud = [a for a in members if a.state == "firing" and not muted.get(a.fingerprint)]
    severity = min((a.labels.get("severity", "info") for a in loud or members), key=lambda s: SEVERITY_RANK.get(s, 3),
                   default="info")
    if incident.channel is None:
        incident.channel = route(settings.slack, {**labels, "severity": severity})
    session.flush()
    summary = {"verdict": incident.verdict, "severity": severity, "labels": labels,
               "since": incident.first_window_start.isoformat() if incident.first_window_start else None,
               "alerts": [{"labels": a.labels, "state": a.state, "muted": muted.get(a.fingerprint),
                           "fired_at": a.fired_at.isoformat() if a.fired_at else None,
                           "annotations": {k: v for k, v in a.annotations.items() if k != "digest"}}
                          for a in sorted(members, key=lambda a: a.fingerprint)]}
    segment = (head.annotations.get("attribution") or {}).get("segment") if head else None
    if segment:
        # The part of the traffic a slowdown rests on (`lang=de`): what the incident is about, for its page.
        summary["segment"] = segment
    if decision.action == Action.RESOLVE:
        # Why it resolved, from the alert the message leads with: fixed, rolled back, or no traffic.
        summary["resolution"] = (head.annotations.get("resolution") if head else None) or "every alert resolved"
    incident.summary = summary
    attach_verdicts(session, store, incident, now)
    if settings.slack is None and settings.alertmanager is None:
        # No notifier configured: the incident is tracked (`tailwatch alerts` shows it), but nothing is
        # queued that no sender would ever drain.
        return 0
    # The message, not its rendering: each notifier renders it when it sends.
    message = {"incident": incident_view(incident), "action": str(decision.action)}
    kinds = {Action.POST: ["post"], Action.UPDATE: ["update"], Action.REPEAT: ["reply"],
             Action.RESOLVE: ["update", "reply"]}[decision.action] if settings.slack is not None else []
    written = 0
    for kind in kinds:
        key = f"incident:{incident.id}:rev:{incident.revision}:{kind}"
        store.outbox.add(session, dedup_key=key, created_at=now, channel=incident.channel or "", payload=message,
                         status="pending", attempts=0, next_attempt_at=decision.due or now,
                         incident_id=incident.id, kind=kind)
        written += 1
    if settings.alertmanager is not None:
        # Alertmanager does its own group_wait: the alerts go at once, in their own outbox item, so its
        # retries and Slack's never wait for each other.
        store.outbox.add(session, dedup_key=f"incident:{incident.id}:rev:{incident.revision}:{ALERT}",
                         created_at=now, channel="", payload=message, status="pending", attempts=0,
                         next_attempt_at=now, incident_id=incident.id, kind=ALERT)
        written += 1
    session.flush()
    return written


def attach_verdicts(session, store: Store, incident: Incident, now: datetime) -> None:
    """Point the regression and drift verdicts of the incident's windows up to `now` at it (for `tailwatch
    explain` and `query verdicts --incident`): every tick it is open, not only the ticks that notify."""
    if incident.model_version:
        store.verdicts.attach(session, incident.id, incident.service, incident.model_version,
                              incident.first_window_start or incident.opened_at, now,
                              ("slower", "worse", "both", "drift"))


def span_incident(incident: Incident, members: Sequence[Alert]) -> None:
    """The incident's first window start (the earliest onset of its alerts: it only moves back) and last
    window end (the newest window its alerts weighed)."""
    onsets = [datetime.fromisoformat(a.annotations["onset"]) for a in members if a.annotations.get("onset")]
    ends = [datetime.fromisoformat(a.annotations["window_end"]) for a in members if a.annotations.get("window_end")]
    if onsets:
        first = min(onsets)
        incident.first_window_start = min(utc(incident.first_window_start), first) if incident.first_window_start \
            else first
    if ends:
        incident.last_window_end = max(ends)


def incident_view(incident: Incident) -> dict[str, Any]:
    """The incident as the renderer reads it."""
    return Incidents.as_dict(incident)
