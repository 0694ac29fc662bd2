"""Alerts after Prometheus and Alertmanager: verdicts and SLO rules become alert samples; each alert
(identity = fingerprint of its sorted labels) goes inactive -> pending -> firing after `for`, stays
firing `keep_firing_for` after its condition clears, then resolves. Alerts are grouped by `group_by`
labels; a group's notifications (group_wait, group_interval, repeat_interval, silences, inhibition)
are written to the outbox in the same transaction as the state that caused them.

Stages are pure functions with the clock passed in (`transition`, `muted_by`, `dispatch`);
`after_tick` reads and writes the store around them.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from monitor.config import Alerts, Config, Service
from monitor.notify.slack import render, route
from monitor.rules import RuleResult, evaluate, partial_loader
from monitor.verdict import HARMFUL, Evidence, Verdict, decide
from monitor.windows import floor_to
from storage.models import AlertCursor, AlertState, Incident, Outbox, VerdictRow, dumps
from storage.store import Store, TickRecord, utc

log = logging.getLogger(__name__)

REGRESSION, DRIFT, NO_DATA, ERROR = "ModelRegression", "InputDrift", "no_data", "error"
SEVERITY_RANK = {"page": 0, "warn": 1, "info": 2}
ACTIVE_STATES = ("pending", "firing")


def fingerprint(labels: Mapping[str, Any]) -> str:
    """The identity of a label set: 16 hex digits of the SHA-256 of its canonical sorted JSON."""
    return hashlib.sha256(dumps(dict(labels)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Sample:
    """What one evaluation says about one alert: active (True), clear (False) or cannot tell (None: too
    few requests; the alert keeps its state)."""

    labels: dict[str, str]
    active: bool | None
    for_: timedelta = timedelta(0)
    keep_firing_for: timedelta = timedelta(0)
    annotations: dict[str, Any] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.labels)


@dataclass(frozen=True)
class Alert:
    """The persisted state of one alert."""

    fingerprint: str
    labels: dict[str, str]
    state: str = "inactive"  # inactive | pending | firing | resolved
    active_since: datetime | None = None
    fired_at: datetime | None = None
    resolved_at: datetime | None = None
    last_active_at: datetime | None = None
    last_eval_at: datetime | None = None
    annotations: dict[str, Any] = field(default_factory=dict)
    keep_firing_since: datetime | None = None  # first clear evaluation of a firing alert


def transition(prev: Alert | None, sample: Sample, now: datetime) -> tuple[Alert, str]:
    """The alert's next state at `now` given `sample`, and why (Prometheus rule semantics)."""
    alert = prev or Alert(sample.fingerprint, dict(sample.labels))
    notes = dict(sample.annotations)
    if alert.state in ACTIVE_STATES:
        notes.setdefault("onset", alert.annotations.get("onset"))  # where the episode began stays put
    else:
        notes.setdefault("onset", notes.get("window_start"))
    alert = replace(alert, labels=dict(sample.labels), last_eval_at=now)
    if sample.active is None:
        return alert, "too few requests to tell: state held"
    if sample.active:
        alert = replace(alert, annotations=notes, last_active_at=now, keep_firing_since=None)
        if alert.state not in ACTIVE_STATES:
            alert = replace(alert, state="pending", active_since=now, fired_at=None, resolved_at=None)
            if sample.for_ <= timedelta(0):
                return replace(alert, state="firing", fired_at=now), "active, no `for`: firing at once"
            return alert, f"active: pending for {sample.for_}"
        if alert.state == "pending" and now - alert.active_since >= sample.for_:
            return replace(alert, state="firing", fired_at=now), f"active for {now - alert.active_since}: firing"
        return alert, f"still active: {alert.state}"
    if alert.state == "pending":
        return replace(alert, state="inactive", active_since=None), "cleared before `for` elapsed: back to inactive"
    if alert.state == "firing":
        # keep_firing_for counts from the first evaluation that found the condition clear (Prometheus).
        since = alert.keep_firing_since or now
        if now - since < sample.keep_firing_for:
            return replace(alert, keep_firing_since=since), \
                f"cleared {now - since} ago, keep_firing_for {sample.keep_firing_for}: still firing"
        return replace(alert, state="resolved", resolved_at=now, active_since=None, keep_firing_since=None), \
            "cleared: resolved"
    return alert, "clear"


# -- silences and inhibition -------------------------------------------------------------------------

_MATCHER = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$")


def parse_matcher(text: str) -> dict[str, str]:
    """`name=value`, `name!=value`, `name=~regex`, `name!~regex` -> {name, op, value}."""
    m = _MATCHER.match(text)
    if not m:
        raise ValueError(f"not a matcher: {text!r} (write name=value, name!=value, name=~regex or name!~regex)")
    name, op, value = m.groups()
    if op in ("=~", "!~"):
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"matcher {text!r}: bad regex: {exc}") from None
    return {"name": name, "op": op, "value": value.strip("\"'")}


def matches(labels: Mapping[str, str], matchers: Sequence[Mapping[str, str]]) -> bool:
    """True when every matcher holds for `labels` (an absent label is the empty string)."""
    for m in matchers:
        value = str(labels.get(m["name"], ""))
        op = m.get("op", "=")
        ok = {"=": value == m["value"], "!=": value != m["value"],
              "=~": op == "=~" and re.fullmatch(m["value"], value) is not None,
              "!~": op == "!~" and re.fullmatch(m["value"], value) is None}[op]
        if not ok:
            return False
    return True


def muted_by(alert: Alert, firing: Sequence[Alert], silences: Sequence[Mapping[str, Any]], settings: Alerts,
             now: datetime) -> str | None:
    """Why `alert`'s notifications are muted at `now` ('silence 3', 'inhibited by no_data'), or None."""
    for s in silences:
        if s["starts_at"] <= now < s["ends_at"] and matches(alert.labels, s["matchers"]):
            return f"silence {s['id']}"
    for rule in settings.inhibit:
        if not matches(alert.labels, _exact(rule.target)):
            continue
        for source in firing:
            if source.fingerprint == alert.fingerprint or not matches(source.labels, _exact(rule.source)):
                continue
            if all(source.labels.get(k) == alert.labels.get(k) for k in rule.equal):
                return f"inhibited by {source.labels.get('alertname', source.fingerprint)}"
    return None


def _exact(pairs: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "op": "=", "value": v} for k, v in pairs.items()]


# -- grouping and dispatch ---------------------------------------------------------------------------

def group_labels(labels: Mapping[str, str], group_by: Sequence[str]) -> dict[str, str]:
    return {k: labels[k] for k in group_by if k in labels}


@dataclass(frozen=True)
class OpenIncident:
    """What dispatch needs to know of a group's open incident."""

    id: int
    notified_hash: str | None
    last_notified_at: datetime | None


@dataclass(frozen=True)
class Decision:
    """What to send for one group now: none | post | update | repeat | resolve, and why."""

    action: str
    reason: str
    content: str = ""  # hash of what the notification says (firing alerts and their digests)
    due: datetime | None = None  # when the notification may be sent (None: now)


def content_hash(alerts: Sequence[Alert]) -> str:
    """What a notification says, as a hash: which alerts fire and their digests (verdict, cause), not
    their numbers: values move every window, the story does not."""
    body = sorted((a.fingerprint, str(a.annotations.get("digest", ""))) for a in alerts)
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
            return Decision("none", "no unmuted firing alert" if not firing else "all firing alerts muted: "
                            + "; ".join(sorted({str(muted[a.fingerprint]) for a in firing})))
        first = min(a.fired_at or now for a in loud)
        # A new group: open the incident with one message, held until group_wait after the first alert
        # fired (alerts evaluated in the same tick already share it).
        return Decision("post", f"{len(loud)} alert(s) firing; due after group_wait", content,
                        max(now, first + settings.group_wait))
    if not firing and not any(a.state == "pending" for a in alerts):
        # Every alert of the incident cleared (keep_firing_for passed): say it is resolved, once.
        return Decision("resolve", "every alert resolved", content)
    if not firing:
        # Cleared, but an alert is pending again: wait for it to fire or clear before saying anything.
        return Decision("none", "no alert firing, one pending again", content)
    if not loud:
        # Still firing but all muted: a silence or inhibition means "stop talking", not "resolved".
        return Decision("none", "firing alerts muted: " + "; ".join(sorted({str(muted[a.fingerprint])
                                                                             for a in firing})), content)
    since = now - (incident.last_notified_at or now)
    if content != incident.notified_hash:
        if since >= settings.group_interval:
            # The story changed (an alert joined or left, the verdict or cause moved): update in place.
            return Decision("update", "the firing alerts or their verdict changed", content)
        # group_interval: batch changes instead of editing the message on every evaluation.
        return Decision("none", f"changed, but group_interval not over ({since} of {settings.group_interval})",
                        content)
    if since >= settings.repeat_interval:
        # repeat_interval: still firing, unchanged: remind in the thread.
        return Decision("repeat", f"unchanged for {since}: repeat", content)
    # Unchanged and notified recently: already said.
    return Decision("none", "already notified; nothing changed", content)


# -- samples from verdicts, rules, no_data and errors -------------------------------------------------

def verdict_samples(service: Service, verdicts: Sequence[Verdict], settings: Alerts) -> list[Sample]:
    """ModelRegression (slower / worse / both) and InputDrift (drift) per model version of the window."""
    out = []
    for v in verdicts:
        active_regression = None if v.verdict == "insufficient_data" else v.verdict in HARMFUL
        active_drift = None if v.verdict == "insufficient_data" else v.verdict == "drift"
        notes = verdict_annotations(v)
        out.append(Sample({"alertname": REGRESSION, "service": service.name, "model_version": v.model_version,
                           "severity": settings.verdict.regression_severity}, active_regression,
                          settings.verdict.for_, settings.verdict.keep_firing_for, notes))
        out.append(Sample({"alertname": DRIFT, "service": service.name, "model_version": v.model_version,
                           "severity": settings.verdict.drift_severity}, active_drift,
                          settings.verdict.for_, settings.verdict.keep_firing_for, notes))
    return out


def verdict_annotations(v: Verdict) -> dict[str, Any]:
    digest = [v.verdict, v.estimated, v.rollback_to, v.attribution.get("top_stage"),
              sorted(c["value"] for c in v.what_changed)]
    return {"verdict": v.verdict, "estimated": v.estimated, "summary": v.summary, "text": v.summary,
            "window_start": v.window_start.isoformat(), "window_end": v.window_end.isoformat(), "rows": v.rows,
            "evidence": [e.as_dict() for e in v.evidence], "attribution": v.attribution,
            "what_changed": list(v.what_changed), "next_steps": list(v.next_steps), "rollback_to": v.rollback_to,
            "digest": dumps(digest)}


def rule_sample(service: Service, rule, result: RuleResult) -> Sample:
    labels = {**rule.labels, "alertname": rule.name, "service": service.name, "severity": rule.severity}
    return Sample(labels, result.active, rule.for_, rule.keep_firing_for,
                  {"summary": f"SLO {rule.name}: {result.text}", "text": result.text, "value": result.value,
                   "n": result.n, "burn": result.burn, "window_start": result.window_start.isoformat(),
                   "window_end": result.window_end.isoformat(), "digest": rule.slo})


# -- the entry point ---------------------------------------------------------------------------------

@dataclass
class AlertsReport:
    """What one after_tick did: verdicts written, alert states, decisions per group, outbox items."""

    now: str
    verdicts: list[dict[str, Any]] = field(default_factory=list)  # {service, model_version, window, verdict}
    transitions: list[str] = field(default_factory=list)
    decisions: list[dict[str, str]] = field(default_factory=list)  # {group, action, reason}
    enqueued: int = 0
    firing: int = 0
    pending: int = 0


def eval_windows(service: Service, now: datetime) -> list[tuple[datetime, datetime]]:
    """The last complete window of each length the service scores (`buckets.windows` and
    `quality.windows`), shortest first: closed, and past the join lateness so its rows have been folded."""
    sizes = set(service.buckets.windows or [service.buckets.size])
    if service.quality is not None:
        sizes |= set(service.quality.windows)
    ends = {size: floor_to(now - service.join.lateness, size) for size in sorted(sizes)}
    return [(end - size, end) for size, end in ends.items()]


def fit_windows(by_window: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One finding per check and labels from the findings of windows shortest first: the shortest window's
    that decides (status ok or breach), else the longest window's (`insufficient`, with what it needs)."""
    chosen: dict[tuple[str, str], Mapping[str, Any]] = {}
    for findings in by_window:
        for f in findings:
            key = (f["check"], dumps(dict(f.get("labels") or {})))
            if key not in chosen or chosen[key]["status"] == "insufficient":
                chosen[key] = f
    return [dict(f) for f in chosen.values()]


def fitted_verdict(by_window: Sequence[Sequence[Mapping[str, Any]]], windows: Sequence[tuple[datetime, datetime]],
                   **kwargs: Any) -> Verdict:
    """The verdict of one version on its last complete windows (`windows`, shortest first, with their
    findings `by_window`): each finding from the shortest window that holds enough samples to decide it
    (fit_windows). Its window spans the windows of its breaching findings, else it is the shortest one."""
    fitted = fit_windows(by_window)
    breach = [f for f in fitted if f["status"] == "breach"]
    start = min((f["window_start"] for f in breach), default=windows[0][0])
    end = max((f["window_end"] for f in breach), default=windows[0][1])
    for f in fitted:
        f.pop("window_start", None), f.pop("window_end", None)
    return decide(fitted, window_start=start, window_end=end, **kwargs)


def after_tick(config: Config, store: Store, now: datetime) -> AlertsReport:
    """Verdicts for newly scored windows, rules, alert states and outbox items at clock `now`."""
    now = utc(now)
    settings = config.alerts
    report = AlertsReport(now=now.isoformat())
    samples: list[Sample] = []
    services = set()
    for service in config.services:
        services.add(service.name)
        samples += _service_samples(service, store, now, settings, report)
    with store.transaction() as session:
        _apply(session, store, samples, services, settings, now, report)
    return report


def _service_samples(service: Service, store: Store, now: datetime, settings: Alerts,
                     report: AlertsReport) -> list[Sample]:
    name = service.name
    lengths = eval_windows(service, now)
    start, end = lengths[0]
    load = partial_loader(store, name)
    rule_results = [(rule, evaluate(rule, load, end, end - start)) for rule in service.rules]
    with store.transaction() as session:
        versions = store.load_versions(session, name)
        cursor = session.get(AlertCursor, name)
        windows, last_tick = store.scored_since(session, name, cursor.last_tick_id if cursor else 0, now)
        by_length = [[f for f in store.load_findings(session, name, since=a, until=a + timedelta(microseconds=1))
                      if f["window_end"] == b] for a, b in lengths]
        ticks = store.last_ticks(session, name, limit=settings.source_error_ticks + 1)
        # The daemon's job errors and missed runs (process-wide) during the evaluated window.
        job_events = store.load_job_events(session, start, now + timedelta(microseconds=1))
    eval_versions = sorted({f["model_version"] for f in by_length[0]})
    # A version with no rows in the shortest window while another has them: its traffic moved on, and its
    # alerts clear. With no rows at all (a quiet hour at low traffic), the longer windows speak for it.
    sampled = eval_versions or sorted({f["model_version"] for found in by_length for f in found})
    wanted = sorted(set(windows) | {(f["model_version"], a, b) for (a, b), found in zip(lengths, by_length, strict=True)
                                    for f in found})
    rule_evidence = [Evidence("slo:" + rule.name, {"slo": rule.slo}, r.value, None, r.n)
                     for rule, r in rule_results if r.active and r.window_end == end and r.window_start == start]
    accepted = list(service.accepted_versions)
    if service.quality is not None and service.quality.accepted_version not in (None, *accepted):
        accepted.append(service.quality.accepted_version)
    by_start: dict[datetime, list[dict]] = {}
    verdicts: dict[tuple[str, datetime, datetime], Verdict] = {}
    for version, w_start, w_end in wanted:
        if w_start not in by_start:
            with store.transaction() as session:
                by_start[w_start] = store.load_findings(session, name, since=w_start,
                                                        until=w_start + timedelta(microseconds=1))
        found = [f for f in by_start[w_start] if f["window_end"] == w_end and f["model_version"] == version]
        # An SLO breach is service-wide: it counts for a version only when that version had the window alone.
        rules_here = rule_evidence if (w_start, w_end) == (start, end) and len(eval_versions) == 1 else []
        verdicts[(version, w_start, w_end)] = decide(
            found, service=name, model_version=version, window_start=w_start, window_end=w_end, now=now,
            versions=versions, accepted_versions=accepted, rule_breaches=rules_here)
    with store.transaction() as session:
        store.upsert_verdicts(session, [v.to_row() for v in verdicts.values()])
        row = session.get(AlertCursor, name)
        if row is None:
            session.add(AlertCursor(service=name, last_tick_id=last_tick, updated_at=now))
        else:
            row.last_tick_id, row.updated_at = last_tick, now
    report.verdicts += [{"service": name, "model_version": v.model_version, "window_start": v.window_start.isoformat(),
                         "window_end": v.window_end.isoformat(), "verdict": v.verdict, "summary": v.summary}
                        for v in verdicts.values()]

    # One verdict per version for its alerts, whichever window lengths decided it: one alert identity per
    # version and verdict, so an incident is not paged once per window length.
    current = [fitted_verdict([[f for f in found if f["model_version"] == v] for found in by_length], lengths,
                              service=name, model_version=v, now=now, versions=versions,
                              accepted_versions=accepted, rule_breaches=rule_evidence if eval_versions == [v] else [])
               for v in sampled]
    samples = verdict_samples(service, current, settings)
    samples += [rule_sample(service, rule, r) for rule, r in rule_results]
    has_rows = load(start, end).rows > 0
    samples.append(Sample({"alertname": NO_DATA, "service": name, "severity": settings.no_data.severity,
                           "source": "predictions"}, not has_rows, settings.no_data.for_, timedelta(0),
                          {"summary": f"no predictions logged for {name} in {start:%H:%M}-{end:%H:%M} UTC",
                           "window_start": start.isoformat(), "window_end": end.isoformat(), "digest": "no_data"}))
    if service.quality is not None:
        samples.append(_labels_stale(service, store, now, settings))
    errors = sorted({e for v in current for e in v.errors})
    ticks = [t for t in ticks if t.now <= now]
    tick = ticks[0] if ticks else None
    if tick is not None and tick.status == "error":
        errors.insert(0, f"tick {tick.id}: {(tick.summary or {}).get('error') or 'failed'}")
    unreadable = _unreadable(ticks, settings.source_error_ticks)
    if unreadable:
        errors.append(unreadable)
    errors += [f"{e['job']} {e['kind']} at {e['at']:%H:%M:%S}: {e['message']}" for e in job_events]
    samples.append(Sample({"alertname": ERROR, "service": name, "severity": "warn"}, bool(errors), timedelta(0),
                          timedelta(0), {"summary": f"{len(errors)} error(s) in {name}'s pipeline",
                                         "errors": errors[:10], "window_start": start.isoformat(),
                                         "window_end": end.isoformat(), "digest": dumps(errors[:10])}))
    return samples


def _unreadable(ticks: Sequence[TickRecord], in_a_row: int) -> str | None:
    """What to say when each of the newest `in_a_row` ticks (newest first) could not read a source file
    (rows quarantined `source_error`); None otherwise."""
    recent = ticks[:in_a_row]
    counts = [((t.summary or {}).get("quarantined") or {}).get("source_error", 0) for t in recent]
    if len(recent) < in_a_row or not all(counts):
        return None
    return (f"a source file could not be read in each of the last {in_a_row} ticks (tick {recent[0].id}: "
            f"{counts[0]} unreadable; the quarantine's source_error rows name the file and the OS error)")


def _labels_stale(service: Service, store: Store, now: datetime, settings: Alerts) -> Sample:
    """no_data (source labels): the newest quality window that ended `labels_after` ago or earlier has no
    label at all for a window with predictions (label_coverage of all classes is 0)."""
    horizon = now - settings.no_data.labels_after
    with store.transaction() as session:
        rows = store.load_findings(session, service.name, since=horizon - timedelta(days=7), until=horizon,
                                   check="label_coverage")
    rows = [f for f in rows if (f["labels"] or {}).get("class") == "all" and "segment" not in (f["labels"] or {})
            and f["window_end"] <= horizon and f["n"] > 0]
    newest = max(rows, key=lambda f: f["window_end"], default=None)
    active = None if newest is None else not (newest["value"] or 0) > 0
    shown = f"{newest['window_start']:%Y-%m-%d %H:%M}" if newest else "-"
    return Sample({"alertname": NO_DATA, "service": service.name, "severity": settings.no_data.labels_severity,
                   "source": "labels"}, active, timedelta(0), timedelta(0),
                  {"summary": f"labels stale for {service.name}: no label for the window of {shown} UTC "
                              f"({settings.no_data.labels_after} after it ended)", "digest": "labels"})


def _load_alerts(session) -> dict[str, Alert]:
    return {r.fingerprint: Alert(r.fingerprint, dict(r.labels or {}), r.state, r.active_since, r.fired_at,
                                 r.resolved_at, r.last_active_at, r.last_eval_at, dict(r.annotations or {}),
                                 r.keep_firing_since)
            for r in session.scalars(select(AlertState))}


def _apply(session, store: Store, samples: list[Sample], services: set[str], settings: Alerts, now: datetime,
           report: AlertsReport) -> None:
    """Transition every alert, then dispatch every group, writing states, incidents and outbox items."""
    alerts = _load_alerts(session)
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
            keep = timedelta(0)
            if alert.labels.get("alertname") in (REGRESSION, DRIFT):
                keep = settings.verdict.keep_firing_for
            new, why = transition(alert, Sample(alert.labels, False, keep_firing_for=keep), now)
            new = replace(new, annotations=alert.annotations)
            report.transitions.append(f"{_describe(alert.labels)}: {alert.state} -> {new.state} (not evaluated: {why})")
            alerts[fp] = new
    _save_alerts(session, alerts.values(), settings, now)

    silences = store.load_silences(session, now)
    firing = [a for a in alerts.values() if a.state == "firing"]
    groups: dict[str, list[Alert]] = defaultdict(list)
    for a in alerts.values():
        if a.state in ACTIVE_STATES or a.state == "resolved":
            groups[fingerprint(group_labels(a.labels, settings.group_by))].append(a)
    open_incidents = {i.fingerprint: i for i in session.scalars(select(Incident).where(Incident.status == "open"))}
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
        if decision.action == "none":
            continue
        report.enqueued += _notify(session, store, decision, group_fp, labels, members, muted, incident, settings, now)
    report.firing = sum(a.state == "firing" for a in alerts.values())
    report.pending = sum(a.state == "pending" for a in alerts.values())


def _save_alerts(session, alerts, settings: Alerts, now: datetime) -> None:
    stored = {r.fingerprint: r for r in session.scalars(select(AlertState))}
    for a in alerts:
        row = stored.get(a.fingerprint)
        if row is None:
            row = AlertState(fingerprint=a.fingerprint)
            session.add(row)
        row.labels, row.state, row.active_since, row.fired_at = a.labels, a.state, a.active_since, a.fired_at
        row.resolved_at, row.last_eval_at, row.annotations = a.resolved_at, a.last_eval_at, a.annotations
        row.last_active_at, row.keep_firing_since, row.updated_at = a.last_active_at, a.keep_firing_since, now
        row.service, row.alertname = a.labels.get("service"), a.labels.get("alertname")
        row.group_fingerprint = fingerprint(group_labels(a.labels, settings.group_by))
    session.flush()


def _describe(labels: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _headline(members: Sequence[Alert]) -> Alert:
    """The alert a message leads with: a firing regression, then drift, then by severity."""
    order = {REGRESSION: 0, DRIFT: 1}
    return min(members, key=lambda a: (a.state != "firing", order.get(a.labels.get("alertname"), 2),
                                       SEVERITY_RANK.get(a.labels.get("severity"), 3), a.fingerprint))


def _notify(session, store: Store, decision: Decision, group_fp: str, labels: dict[str, str],
            members: list[Alert], muted: dict[str, str | None], incident: Incident | None, settings: Alerts,
            now: datetime) -> int:
    """Open / update / resolve the group's incident and write its outbox items; returns how many."""
    head = _headline(members) if members else None
    verdict = (head.annotations.get("verdict") or head.labels.get("alertname")) if head else "resolved"
    onsets = [a.annotations.get("onset") for a in members if a.annotations.get("onset")]
    ends = [a.annotations.get("window_end") for a in members if a.annotations.get("window_end")]
    if incident is None:
        incident = Incident(service=labels.get("service") or (head.labels.get("service", "") if head else ""),
                            model_version=labels.get("model_version"), verdict=verdict, status="open",
                            opened_at=min(a.fired_at or now for a in members if a.state == "firing"),
                            fingerprint=group_fp, group_labels=labels, revision=0, updated_at=now)
        session.add(incident)
    incident.revision += 1
    if decision.action != "resolve":
        incident.verdict = verdict
    if onsets:
        first = min(datetime.fromisoformat(o) for o in onsets)
        incident.first_window_start = min(incident.first_window_start or first, first)
    if ends:
        incident.last_window_end = max(datetime.fromisoformat(e) for e in ends)
    if decision.action == "resolve":
        incident.status, incident.resolved_at = "resolved", now
    incident.notified_hash, incident.last_notified_at, incident.updated_at = decision.content, now, now
    loud = [a for a in members if a.state == "firing" and not muted.get(a.fingerprint)]
    severity = min((a.labels.get("severity", "info") for a in loud or members), key=lambda s: SEVERITY_RANK.get(s, 3),
                   default="info")
    if incident.channel is None:
        incident.channel = route(settings.slack, {**labels, "severity": severity})
    session.flush()
    summary = {"verdict": incident.verdict, "severity": severity, "labels": labels,
               "alerts": [{"labels": a.labels, "state": a.state, "muted": muted.get(a.fingerprint),
                           "fired_at": a.fired_at.isoformat() if a.fired_at else None,
                           "annotations": {k: v for k, v in a.annotations.items() if k != "digest"}}
                          for a in sorted(members, key=lambda a: a.fingerprint)]}
    incident.summary = summary
    if incident.model_version:
        # The verdicts of the incident's windows point at it, for `tailwatch explain`.
        for row in session.scalars(select(VerdictRow).where(
                VerdictRow.service == incident.service, VerdictRow.model_version == incident.model_version,
                VerdictRow.window_start >= (incident.first_window_start or incident.opened_at),
                VerdictRow.window_end <= now, VerdictRow.incident_id.is_(None),
                VerdictRow.verdict.in_(("slower", "worse", "both", "drift")))):
            row.incident_id = incident.id
    if settings.slack is None:
        # No notifier configured: the incident is tracked (`tailwatch alerts` shows it), but nothing is
        # queued that no sender would ever drain.
        return 0
    kinds = {"post": ["post"], "update": ["update"], "repeat": ["reply"], "resolve": ["update", "reply"]}
    written = 0
    for kind in kinds[decision.action]:
        payload = render(incident_view(incident), kind, decision.action, settings.slack)
        key = f"incident:{incident.id}:rev:{incident.revision}:{kind}"
        session.add(Outbox(dedup_key=key, created_at=now, channel=incident.channel or "", payload=payload,
                           status="pending", attempts=0, next_attempt_at=decision.due or now,
                           incident_id=incident.id, kind=kind))
        written += 1
    session.flush()
    return written


def incident_view(incident: Incident) -> dict[str, Any]:
    """The incident as the renderer reads it."""
    cols = [c.key for c in Incident.__table__.columns]
    return {c: getattr(incident, c) for c in cols}
