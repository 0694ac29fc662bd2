"""Alerts after Prometheus and Alertmanager: verdicts and SLO rules become alert samples; each alert
(identity = fingerprint of its sorted labels) goes inactive -> pending -> firing after `for`, then
resolves: a rule `keep_firing_for` after its condition clears, a verdict alert once `resolve_after`
windows in a row are clear or its version's traffic is gone (and it says which). Alerts are grouped by
`group_by` labels; a group's notifications (group_wait, group_interval, repeat_interval, silences,
inhibition) are written to the outbox in the same transaction as the state that caused them.

Stages are pure functions with the clock passed in (`transition`, `muted_by`, `dispatch`);
`after_tick` reads and writes the store around them.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from checks.rules import RuleResult, evaluate, partial_loader
from monitor.alerts.render import render, route
from monitor.config import Alerts, Config, Service, VerdictAlerts
from monitor.verdicts.verdict import (
    CONFIRMED_QUALITY,
    HARMFUL,
    SERVING_CHECKS,
    Evidence,
    Verdict,
    decide,
    episode_signals,
    is_service_regression,
)
from monitor.verdicts.windows import MAX_RESCORED, floor_to
from storage.models import AlertCursor, AlertState, Incident, Outbox, VerdictRow, dumps
from storage.store import Store, TickRecord, utc

log = logging.getLogger(__name__)

REGRESSION, DRIFT, NO_DATA, ERROR = "ModelRegression", "InputDrift", "no_data", "error"
SEVERITY_RANK = {"page": 0, "warn": 1, "info": 2}
ACTIVE_STATES = ("pending", "firing")
FAMILY = {REGRESSION: HARMFUL, DRIFT: ("drift",)}  # the verdicts that make each verdict alert active
# How far back the onset walk reads stored verdicts: an episode older than this is dated to its limit.
ONSET_LOOKBACK = timedelta(days=7)
# The most clear windows the onset walk crosses between two breaching ones (each is checked against the
# earlier one's baseline): a longer quiet stretch is taken as the end of an earlier episode.
MAX_GAP = 8


def fingerprint(labels: Mapping[str, Any]) -> str:
    """The identity of a label set: 16 hex digits of the SHA-256 of its canonical sorted JSON."""
    return hashlib.sha256(dumps(dict(labels)).encode()).hexdigest()[:16]


def identity(labels: Mapping[str, Any]) -> dict[str, Any]:
    """The labels an alert's fingerprint is made of: all, but a ModelRegression's severity, which follows
    the size of the effect window by window (one episode stays one alert while it escalates)."""
    if labels.get("alertname") == REGRESSION:
        return {k: v for k, v in labels.items() if k != "severity"}
    return dict(labels)


def louder(a: str | None, b: str | None) -> str | None:
    """The louder of two severities (page > warn > info); either may be None."""
    return min((s for s in (a, b) if s), key=lambda s: SEVERITY_RANK.get(s, 3), default=None)


@dataclass(frozen=True)
class Sample:
    """What one evaluation says about one alert: active (True), clear (False) or cannot tell (None: too
    few requests; the alert keeps its state). A clear sample with `resolves` False does not end a firing
    episode yet (a verdict alert's clear windows are fewer than `resolve_after`); annotations `resolution`
    and `clearing` say why it resolves or why not yet."""

    labels: dict[str, str]
    active: bool | None
    for_: timedelta = timedelta(0)
    keep_firing_for: timedelta = timedelta(0)
    annotations: dict[str, Any] = field(default_factory=dict)
    resolves: bool = True

    @property
    def fingerprint(self) -> str:
        return fingerprint(identity(self.labels))


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
    notes = {k: v for k, v in sample.annotations.items() if k not in ("resolution", "clearing", "held_end")}
    labels = dict(sample.labels)
    if alert.state in ACTIVE_STATES:
        # Where the episode began stays put, unless the walk back over stored windows found an earlier
        # breaching window of the same run (a backfill scored it since).
        onsets = [o for o in (alert.annotations.get("onset"), notes.get("onset")) if o]
        notes["onset"] = min(onsets, key=datetime.fromisoformat) if onsets else notes.get("window_start")
        if "pre_incident" in notes or "pre_incident" in alert.annotations:
            # The baseline each signal had when the episode first breached on it stays the reference.
            notes["pre_incident"] = {**notes.get("pre_incident", {}), **alert.annotations.get("pre_incident", {})}
        # An episode's severity only rises: a page does not turn into an info while it lasts.
        kept = alert.labels.get("severity")
        labels["severity"] = louder(kept, labels.get("severity")) if sample.active else kept or labels.get("severity")
        if labels["severity"] is None:
            del labels["severity"]
    else:
        notes.setdefault("onset", notes.get("window_start"))
    alert = replace(alert, labels=labels, last_eval_at=now)
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
        if not sample.resolves:
            # Clear, but not for long enough (or its traffic only just moved): one episode, still firing.
            clearing = sample.annotations.get("clearing") or "clear, not settled"
            held = {"held_end": sample.annotations["held_end"]} if sample.annotations.get("held_end") else {}
            return replace(alert, annotations={**alert.annotations, "clearing": clearing, **held}), \
                f"{clearing}: still firing"
        # keep_firing_for counts from the first evaluation that found the condition clear (Prometheus).
        since = alert.keep_firing_since or now
        if now - since < sample.keep_firing_for:
            return replace(alert, keep_firing_since=since), \
                f"cleared {now - since} ago, keep_firing_for {sample.keep_firing_for}: still firing"
        resolution = sample.annotations.get("resolution") or "the condition cleared"
        notes = {k: v for k, v in alert.annotations.items() if k not in ("clearing", "held_end")}
        return replace(alert, state="resolved", resolved_at=now, active_since=None, keep_firing_since=None,
                       annotations={**notes, "resolution": resolution}), f"resolved: {resolution}"
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

@dataclass(frozen=True)
class Window:
    """One stored verdict of a version, as the lifecycle reads it: its window, verdict and requests."""

    start: datetime
    end: datetime
    verdict: str
    rows: int = 0


def onset_of(history: Sequence[Window], family: Sequence[str], fired: tuple[datetime, datetime], *,
             resolve_after: int = 1, back: Callable[[Window, Window], bool] | None = None) -> datetime:
    """The start of the first breaching window of the run that led to the window `fired` (start, end), as
    live evaluation would have kept one episode open. On the shortest window length whose last window
    within `fired` is in `family` (a longer one only when no shorter one breached: finer windows date the
    onset better), walk back over the version's stored verdicts through the verdicts in `family`:
    - `insufficient_data` is crossed (too few requests to tell: an alert holds its state there too);
    - clear windows between two breaching ones are crossed unless `resolve_after` of them in a row are
      back within the earlier breaching window's baseline (`back(clear, earlier)`; without it, every
      decided clear window is back): live, the episode would not have resolved there;
    - `no_data`, a window with no stored verdict, or more than MAX_GAP clear windows end the run.
    `fired`'s start when no stored window breached."""
    by_length: dict[timedelta, dict[datetime, Window]] = defaultdict(dict)
    for w in history:
        by_length[w.end - w.start][w.end] = w
    start, end = fired
    for length in sorted(by_length):
        by_end = by_length[length]
        at = max((e for e in by_end if e <= end and by_end[e].start >= start), default=None)
        if at is None or by_end[at].verdict not in family:
            continue
        onset, gap = start, []
        while at in by_end and len(gap) <= MAX_GAP:
            w = by_end[at]
            if w.verdict in family:
                run = longest = 0
                for g in reversed(gap):  # oldest first, as live evaluation met them
                    if g.verdict != "insufficient_data":
                        run = run + 1 if back is None or back(g, w) else 0
                        longest = max(longest, run)
                if longest >= resolve_after:
                    break  # live, the earlier episode resolved in this gap
                onset, gap = min(onset, w.start), []
            elif w.verdict == "no_data":
                break
            else:
                gap.append(w)
            at = w.start
        return onset
    return start


def superseded(history: Sequence[Window], window: tuple[datetime, datetime], family: Sequence[str], *,
               shortest: timedelta, resolve_after: int, end: datetime) -> bool:
    """Whether the breach of a window longer than `shortest` (start, end) is an episode the shortest windows
    saw end by `end`: one of them inside it breached (in `family`), and `resolve_after` decided clear ones
    came after the last such breach. Such a breach says nothing about now (a 12-hour slowdown breaches
    its day long after the hourly windows are back): it neither holds an alert nor dates an onset. A
    longer window whose shortest windows never breached stands on its own (only it had the power)."""
    start, stop = window
    if stop - start <= shortest:
        return False
    finer = [w for w in history if w.end - w.start == shortest and w.end <= end]
    if not any(w.verdict in family and start <= w.start and w.end <= stop for w in finer):
        return False
    last = max(w.end for w in finer if w.verdict in family)
    clear = sum(1 for w in finer if w.start >= last and w.verdict not in ("insufficient_data", "no_data"))
    return clear >= resolve_after


def held_signals(before: Mapping[datetime, tuple[Window, set[tuple]]], start: datetime, length: timedelta,
                 resolve_after: int) -> set[tuple]:
    """The estimated-quality signals (verdict.episode_signals) that the episode open when the window at
    `start` begins holds on. `before` maps window starts to one version's verdicts of `length` and their
    episode signals. The walk goes back from `start` through consecutive windows to the last harmful one,
    and takes its signals. It finds none when `resolve_after` decided clear windows come first (the episode
    resolved), or `no_data` or a missing window does, or MAX_GAP windows pass."""
    clear, at = 0, start - length
    for _ in range(MAX_GAP + resolve_after + 1):
        if at not in before:
            break
        w, signals = before[at]
        if w.verdict in HARMFUL:
            return set(signals)
        if w.verdict == "no_data":
            break
        if w.verdict != "insufficient_data":
            clear += 1
            if clear >= resolve_after:
                break
        at -= length
    return set()


def lifecycle(version: str, current: Verdict | None, history: Sequence[Window], family: Sequence[str], *, end: datetime,
              shortest: timedelta, serving: Sequence[str], resolve_after: int,
              last_active_end: datetime | None = None, not_back: Sequence[str] = (),
              onset: datetime | None = None) -> tuple[bool | None, bool, dict[str, Any]]:
    """Whether the verdict alert of `family` of `version` is active at the window ending `end`, whether a clear
    sample may resolve it, and why: (active, resolves, {onset | clearing | resolution}).

    `current`: the version's verdict on its last windows (None: no row in them); `history`: its stored
    verdicts, every length; `serving`: the versions with requests in the last window of the shortest
    length. Clear windows are counted in windows of `shortest` since the version's last breaching window
    ended (stored, or `last_active_end`), once its verdict is decided and clear: event time, so a backlog,
    a restart or ticks more frequent than windows count the same. A clear verdict whose episode signals
    are `not_back` within their pre-incident baseline (a baseline that learnt the regression) is held:
    it neither counts nor resolves."""
    def hm(t: datetime) -> str:
        return f"{t:%H:%M}" if end - t < timedelta(days=1) else f"{t:%Y-%m-%d %H:%M}"

    if current is not None and current.verdict in family:
        onset = onset or onset_of(history, family, (current.window_start, current.window_end),
                                  resolve_after=resolve_after)
        return True, True, {"onset": onset.isoformat()}
    if current is not None and current.verdict == "insufficient_data":
        return None, True, {}
    breaches = [w.end for w in history if w.verdict in family and w.end <= end
                and not superseded(history, (w.start, w.end), family, shortest=shortest,
                                   resolve_after=resolve_after, end=end)]
    last = max([*breaches, *([last_active_end] if last_active_end else [])], default=None)
    if current is None or current.verdict == "no_data":
        # When the traffic went: the last shortest window with requests (a longer window ending later may
        # hold only requests from before it); the longer ones only when no shortest window had any.
        seen = [w.end for w in history if w.rows > 0 and w.end <= end and w.end - w.start == shortest] or \
            [w.end for w in history if w.rows > 0 and w.end <= end]
        gone = max(seen, default=None)
        since = f" since {hm(gone)}" if gone else ""
        # Windows without the version's traffic count as clear like its healthy ones: both since the last
        # breaching window (a version healthy for an hour, then rolled back, is not held for two more).
        clear = None if gone is None else max((end - (last or gone)) // shortest, 0)
        if clear is not None and clear < resolve_after:
            return False, False, {"clearing": f"no traffic{since}, {clear} of {resolve_after} windows"}
        if serving:
            return False, True, {"resolution": f"rolled back: {version} has no traffic{since}, "
                                               f"{', '.join(serving)} serve{'s' if len(serving) == 1 else ''}"}
        return False, True, {"resolution": f"no traffic: no predictions{since}, from this or any other version "
                                           "(not confirmed fixed)"}
    if not_back:
        return False, False, {"clearing": "not back within the pre-incident baseline: " + "; ".join(not_back[:3]),
                              "held_end": end.isoformat()}
    clear = resolve_after if last is None else max((end - last) // shortest, 0)
    if clear < resolve_after:
        return False, False, {"clearing": f"clear for {clear} of {resolve_after} windows"}
    return False, True, {"resolution": f"fixed: healthy for {clear} window{'s' if clear != 1 else ''} "
                                       "against the pre-incident baseline"}


def pre_incident(evidence: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The pre-incident baseline of each service signal an episode breached on (total latency, failure
    rates, cache), from its verdicts' evidence (earliest first: the first baseline of a signal wins):
    {key: {check, labels, baseline, value}}. Those are compared with the service's own recent history, a
    baseline that can learn a regression; quality and input checks compare with the reference or the
    accepted version, and their verdict says when they are back."""
    out: dict[str, dict[str, Any]] = {}
    for items in evidence:
        for e in items:
            labels = dict(e.get("labels") or {})
            service = e["check"] in SERVING_CHECKS or e["check"] == "latency" and is_service_regression(
                {"labels": labels})
            if e.get("status") != "breach" or e.get("baseline") is None or e.get("value") is None or not service:
                continue
            out.setdefault(dumps([e["check"], labels]), {"check": e["check"], "labels": labels,
                                                         "baseline": e["baseline"], "value": e["value"]})
    return out


def not_back(pre: Mapping[str, Mapping[str, Any]], found: Sequence[Mapping[str, Any]],
             settings: VerdictAlerts) -> list[str]:
    """The episode's signals whose value in `found` (a window's findings) is not back within their
    pre-incident baseline: still shifted the way the breach went by at least `min_effect_ratio` of the
    baseline (latency quantiles: or `min_effect_ms`, whichever is smaller), with the baseline outside the
    value's 95% interval. A signal without a decided finding does not hold the episode."""
    by_key = {dumps([f["check"], dict(f.get("labels") or {})]): f for f in found if f["status"] in ("ok", "breach")}
    out = []
    for key, p in pre.items():
        f = by_key.get(key)
        if f is None or f.get("value") is None:
            continue
        base, value = float(p["baseline"]), float(f["value"])
        shift = (value - base) * (1 if float(p["value"]) >= base else -1)
        tolerance = settings.min_effect_ratio * abs(base)
        if p["check"] == "latency" and "quantile" in p["labels"]:
            tolerance = min(tolerance, settings.min_effect_ms)
        low, high = f.get("interval_low"), f.get("interval_high")
        if shift < tolerance or (low is not None and high is not None and low <= base <= high):
            continue
        labels = ",".join(f"{k}={v}" for k, v in sorted(p["labels"].items()))
        out.append(f"{p['check']}{' ' + labels if labels else ''} {value:.3g} vs {base:.3g}")
    return out


def effect_severity(v: Verdict, settings: VerdictAlerts) -> str:
    """The severity of a ModelRegression on verdict `v`: each part the verdict rests on says how loud it
    may be, the loudest part wins, never above `regression_severity`. An SLO rule's breach (the user's
    own threshold), a failure / timeout / reject rate, a total latency rise of at least `min_effect_ms` or
    `min_effect_ratio`, and any quality harm (worse, both) may page; a smaller latency rise is `info`; a
    serving signal (cache hit rate, stale cache) with total latency flat is `serving_severity`."""
    top = settings.regression_severity
    if v.verdict != "slower":
        return top
    parts = []
    for e in v.evidence:
        if e.check.startswith("slo:") or e.check == "latency" and "rate" in e.labels:
            parts.append(top)
        elif e.check == "latency" and e.status == "breach" and is_service_regression({"labels": e.labels}):
            parts.append(top if _matters(e, settings) else "info")
        elif e.check in SERVING_CHECKS and e.status == "breach":
            parts.append(settings.serving_severity)
    if not parts:
        return top  # nothing the severity can rest on (evidence cut short): the configured one
    rank = lambda s: SEVERITY_RANK.get(s, 3)  # noqa: E731
    return max(min(parts, key=rank), top, key=rank)  # the loudest part, no louder than `top`


def _matters(e: Evidence, settings: VerdictAlerts) -> bool:
    """Whether a latency finding rose by at least the absolute or the relative floor (unknown: it does)."""
    if e.value is None or e.baseline is None:
        return True
    rise = float(e.value) - float(e.baseline)
    return rise >= settings.min_effect_ms or (float(e.baseline) > 0 and rise / float(e.baseline) >= settings.min_effect_ratio)


def verdict_samples(service: Service, current: Mapping[str, Verdict | None], history: Mapping[str, list[Window]],
                    settings: Alerts, *, end: datetime, shortest: timedelta, serving: Sequence[str],
                    last_active_end: Mapping[tuple[str, str], datetime] | None = None,
                    held: Mapping[tuple[str, str], list[str]] | None = None,
                    onsets: Mapping[str, tuple[datetime, list]] | None = None) -> list[Sample]:
    """ModelRegression (slower / worse / both) and InputDrift (drift) of each model version in `current`
    (its verdict, or None when it had no requests in the last windows but has an active alert).
    `held`: per (alertname, version), the signals not back within their pre-incident baseline;
    `onsets`: per version whose verdict breaches, its episode's onset and the stored evidence of its
    first window (else walked here without checking clear windows' signals)."""
    out = []
    for version, v in current.items():
        notes = verdict_annotations(v) if v is not None else {"digest": "no traffic"}
        onset = None
        if v is not None:
            onset, first = (onsets or {}).get(version, (None, []))
            notes["pre_incident"] = pre_incident([*first, notes["evidence"]])
        for name, severity in ((REGRESSION, effect_severity(v, settings.verdict) if v is not None
                                else settings.verdict.regression_severity),
                               (DRIFT, settings.verdict.drift_severity)):
            active, resolves, why = lifecycle(
                version, v, history.get(version, []), FAMILY[name], end=end, shortest=shortest,
                serving=[s for s in serving if s != version], resolve_after=settings.verdict.resolve_after,
                last_active_end=(last_active_end or {}).get((name, version)),
                not_back=(held or {}).get((name, version), ()), onset=onset)
            out.append(Sample({"alertname": name, "service": service.name, "model_version": version,
                               "severity": severity}, active, settings.verdict.for_, timedelta(0),
                              {**notes, **why}, resolves))
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


def matured_quality(service: Service, store: Store, now: datetime,
                    lengths: Sequence[tuple[datetime, datetime]]) -> list[tuple[tuple[datetime, datetime], list[dict]]]:
    """Per quality window length, the newest window whose labels matured (its label coverage says so) that
    ended within `maturity_horizon` before `now` and before the length's last complete window, with its
    confirmed quality findings (labelled quality, acceptance, version comparison): labels days late leave
    the last windows unjudged, and what they confirm about an older window still reaches the alerts."""
    q = service.quality
    if q is None or not q.windows:
        return []
    last = {b - a: b for a, b in lengths}
    out = []
    with store.transaction() as session:
        coverage = store.load_findings(session, service.name, since=now - q.maturity_horizon - max(q.windows),
                                       until=now, check="label_coverage")
        for size in sorted(set(q.windows)):
            newest = max((f["window_end"] for f in coverage if f["window_end"] - f["window_start"] == size
                          and (f["labels"] or {}) == {"class": "all"} and (f["detail"] or {}).get("matured")
                          and now - q.maturity_horizon <= f["window_end"] < last.get(size, now)), default=None)
            if newest is None:
                continue
            found = store.load_findings(session, service.name, since=newest - size,
                                        until=newest - size + timedelta(microseconds=1))
            out.append(((newest - size, newest), [f for f in found if f["window_end"] == newest
                                                  and f["check"] in CONFIRMED_QUALITY]))
    return out


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
            cursor = session.get(AlertCursor, service.name)
            if cursor is not None:  # the window after the one its last evaluation saw
                first = floor_to(utc(cursor.updated_at) - lateness, size) + size
            else:
                # The first window of the shortest length scored: a longer one may start before any data.
                scored = [s for _, s, e in store.scored_since(session, service.name, 0, now)[0] if e - s == size]
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
        # Versions whose verdict alert is pending or firing: each gets a sample, with traffic or without.
        active = {(r.alertname, (r.labels or {}).get("model_version")): r for r in session.scalars(
            select(AlertState).where(AlertState.service == name, AlertState.alertname.in_((REGRESSION, DRIFT)),
                                     AlertState.state.in_(ACTIVE_STATES)))}
        # The newest window each active alert breached on or was held in (not back within its baseline).
        last_active_end = {key: max(datetime.fromisoformat(r.annotations[k]) for k in ("window_end", "held_end")
                                    if r.annotations.get(k))
                           for key, r in active.items() if r.annotations and r.annotations.get("window_end")}
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
    episodes = _episode_windows(store, name, wanted, settings.verdict.resolve_after)
    held_at: dict[tuple[str, datetime, datetime], set[tuple]] = {}
    for version, w_start, w_end in wanted:  # oldest first: a window holds on what the ones before it breached
        if w_start not in by_start:
            with store.transaction() as session:
                by_start[w_start] = store.load_findings(session, name, since=w_start,
                                                        until=w_start + timedelta(microseconds=1))
        found = [f for f in by_start[w_start] if f["window_end"] == w_end and f["model_version"] == version]
        # An SLO breach is service-wide: it counts for a version only when that version had the window alone.
        rules_here = rule_evidence if (w_start, w_end) == (start, end) and len(eval_versions) == 1 else []
        before = episodes[(version, w_end - w_start)]
        held = held_at[(version, w_start, w_end)] = held_signals(before, w_start, w_end - w_start,
                                                                   settings.verdict.resolve_after)
        v = verdicts[(version, w_start, w_end)] = decide(
            found, service=name, model_version=version, window_start=w_start, window_end=w_end, now=now,
            versions=versions, accepted_versions=accepted, rule_breaches=rules_here, held=held)
        before[w_start] = (Window(w_start, w_end, v.verdict, v.rows), _signals(v.verdict, v.evidence))
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
    matured = matured_quality(service, store, now, lengths)
    history = _history(store, name, sorted({*sampled, *(v for _, v in active if v)}), end)

    def current_findings(version: str, window: tuple[datetime, datetime], found: list[dict]) -> list[dict]:
        """`found` of `version`, none when the window's breach is over by the shortest windows' account."""
        mine = history.get(version, [])
        verdict = next((w.verdict for w in mine if (w.start, w.end) == window), None)
        family = next((f for f in FAMILY.values() if verdict in f), None)
        if family and superseded(mine, window, family, shortest=end - start,
                                 resolve_after=settings.verdict.resolve_after, end=end):
            return []
        return [f for f in found if f["model_version"] == version]

    current = [fitted_verdict([*(current_findings(v, window, found) for window, found in zip(lengths, by_length,
                                                                                          strict=True)),
                               *([f for f in found if f["model_version"] == v] for _, found in matured)],
                              [*lengths, *(window for window, _ in matured)],
                              service=name, model_version=v, now=now, versions=versions,
                              accepted_versions=accepted,
                              rule_breaches=rule_evidence if eval_versions == [v] else [],
                              held=set().union(*(held_at.get((v, a, b), set()) for a, b in lengths)))
               for v in sampled]
    by_version: dict[str, Verdict | None] = {v.model_version: v for v in current}
    by_version |= {version: None for _, version in active if version and version not in by_version}
    # Who serves the last window of the shortest length: the version(s) a rolled-back one gave way to.
    serving = sorted(v for v in eval_versions if (v, start, end) in verdicts and verdicts[(v, start, end)].rows > 0)
    held = {}
    for (alertname, version), row in active.items():
        pre = (row.annotations or {}).get("pre_incident")
        if pre and by_version.get(version) is not None:
            found = fit_windows([[f for f in found if f["model_version"] == version] for found in by_length])
            held[(alertname, version)] = not_back(pre, found, settings.verdict)
    samples = verdict_samples(service, by_version, history, settings, end=end, shortest=end - start,
                              serving=serving, last_active_end=last_active_end, held=held,
                              onsets=_onsets(store, name, by_version, history, active, settings.verdict))
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


def _signals(verdict: str, evidence: Sequence[Any]) -> set[tuple]:
    """A stored or new verdict's episode signals (none unless it is harmful)."""
    if verdict not in HARMFUL:
        return set()
    return episode_signals([e.as_dict() if isinstance(e, Evidence) else e for e in evidence or ()])


_Episodes = dict[tuple[str, timedelta], dict[datetime, tuple[Window, set[tuple]]]]


def _episode_windows(store: Store, service: str, wanted: Sequence[tuple[str, datetime, datetime]],
                     resolve_after: int) -> _Episodes:
    """Per (model version, window length) of the windows `wanted`, the stored verdicts held_signals walks
    back over from them, by window start, with their episode signals: the windows of that length from as
    far back as the walk goes before the first wanted one."""
    out: _Episodes = defaultdict(dict)
    spans: dict[tuple[str, timedelta], tuple[datetime, datetime]] = {}
    for version, start, end in wanted:
        key = (version, end - start)
        first, last = spans.get(key, (start, end))
        spans[key] = (min(first, start), max(last, end))
    for (version, length), (first, last) in spans.items():
        out[(version, length)] = {}
        ends, at = [], first - (MAX_GAP + resolve_after + 1) * length
        while at < last:  # every window of this length, by its end: exact matches whatever the database
            ends.append(at + length)
            at += length
        rows = []
        with store.transaction() as session:
            for i in range(0, len(ends), 500):  # a long backfill step: bounded bound parameters per query
                rows += session.execute(select(
                    VerdictRow.window_start, VerdictRow.window_end, VerdictRow.verdict, VerdictRow.rows,
                    VerdictRow.evidence).where(VerdictRow.service == service, VerdictRow.model_version == version,
                                               VerdictRow.window_end.in_(ends[i:i + 500]))).all()
        for w_start, w_end, verdict, n, evidence in rows:
            w_start, w_end = utc(w_start), utc(w_end)
            if w_end - w_start == length:
                out[(version, length)][w_start] = (Window(w_start, w_end, verdict, int(n or 0)),
                                                   _signals(verdict, evidence))
    return out


def _history(store: Store, service: str, versions: Sequence[str], until: datetime) -> dict[str, list[Window]]:
    """The stored verdicts of `versions` (every window length) that ended in the ONSET_LOOKBACK before
    `until`, per version, oldest first: the windows the lifecycle walks."""
    if not versions:
        return {}
    out: dict[str, list[Window]] = defaultdict(list)
    with store.transaction() as session:
        found = session.execute(select(VerdictRow.model_version, VerdictRow.window_start, VerdictRow.window_end,
                                      VerdictRow.verdict, VerdictRow.rows).where(
            VerdictRow.service == service, VerdictRow.model_version.in_(list(versions)),
            VerdictRow.window_end > until - ONSET_LOOKBACK, VerdictRow.window_end <= until)
            .order_by(VerdictRow.window_end, VerdictRow.window_start))
        for version, start, end, verdict, rows in found:
            out[version].append(Window(utc(start), utc(end), verdict, int(rows or 0)))
    return out


def _onsets(store: Store, service: str, current: Mapping[str, Verdict | None], history: Mapping[str, list[Window]],
            active: Mapping[tuple[str, str], AlertState], settings: VerdictAlerts
            ) -> dict[str, tuple[datetime, list[list[dict[str, Any]]]]]:
    """Per version whose verdict breaches, its episode's onset (onset_of, each clear window in a gap
    checked against the earlier breaching window's stored evidence, as live evaluation would have held it)
    and the stored evidence of that first window (shortest length first): its pre-incident baselines."""
    out: dict[str, tuple[datetime, list[list[dict[str, Any]]]]] = {}

    def evidence(version: str, window: Window, family: Sequence[str]) -> list[list[dict[str, Any]]]:
        with store.transaction() as session:
            rows = session.execute(select(VerdictRow.evidence).where(
                VerdictRow.service == service, VerdictRow.model_version == version,
                VerdictRow.window_start == window.start, VerdictRow.verdict.in_(family))
                .order_by(VerdictRow.window_end)).all()
        return [list(e or []) for (e,) in rows]

    for version, v in current.items():
        name = next((n for n, family in FAMILY.items() if v is not None and v.verdict in family), None)
        if v is None or name is None:
            continue

        def back(clear: Window, earlier: Window, version: str = version, family=FAMILY[name]) -> bool:
            with store.transaction() as session:
                found = [f for f in store.load_findings(session, service, since=clear.start,
                                                        until=clear.start + timedelta(microseconds=1))
                         if f["model_version"] == version and f["window_end"] == clear.end]
            return not not_back(pre_incident(evidence(version, earlier, family)), found, settings)

        onset = onset_of(history.get(version, []), FAMILY[name], (v.window_start, v.window_end),
                         resolve_after=settings.resolve_after, back=back)
        row = active.get((name, version))
        if row is not None and (row.annotations or {}).get("onset"):
            onset = min(onset, datetime.fromisoformat(row.annotations["onset"]))
        out[version] = (onset, evidence(version, Window(onset, onset, ""), FAMILY[name]))
    return out


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
            new, why = transition(alert, Sample(alert.labels, False, annotations={
                "resolution": "no longer evaluated (its rule was removed, or its labels changed)"}), now)
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
        if incident is not None:
            _span(incident, members)  # a backfill may have moved the onset while nothing is sent
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
    if incident is None:
        incident = Incident(service=labels.get("service") or (head.labels.get("service", "") if head else ""),
                            model_version=labels.get("model_version"), verdict=verdict, status="open",
                            opened_at=min(a.fired_at or now for a in members if a.state == "firing"),
                            fingerprint=group_fp, group_labels=labels, revision=0, updated_at=now)
        session.add(incident)
    incident.revision += 1
    if decision.action != "resolve":
        incident.verdict = verdict
    _span(incident, members)
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
               "since": incident.first_window_start.isoformat() if incident.first_window_start else None,
               "alerts": [{"labels": a.labels, "state": a.state, "muted": muted.get(a.fingerprint),
                           "fired_at": a.fired_at.isoformat() if a.fired_at else None,
                           "annotations": {k: v for k, v in a.annotations.items() if k != "digest"}}
                          for a in sorted(members, key=lambda a: a.fingerprint)]}
    if decision.action == "resolve":
        # Why it resolved, from the alert the message leads with: fixed, rolled back, or no traffic.
        summary["resolution"] = (head.annotations.get("resolution") if head else None) or "every alert resolved"
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


def _span(incident: Incident, members: Sequence[Alert]) -> None:
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
    cols = [c.key for c in Incident.__table__.columns]
    return {c: getattr(incident, c) for c in cols}
