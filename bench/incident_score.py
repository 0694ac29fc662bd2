"""How bench/incidents.py scores one replay against the simulator's ground truth: the right verdict of each
window, the incidents about the fault, onset error, first alert, resolves, false pages, and the targets a
replay misses. Pure functions of stored incidents and verdicts (dicts as the store loads them)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

WINDOW = timedelta(minutes=15)  # the harness's evaluation window (its only window length)
REGRESSIONS = ("slower", "worse", "both", "drift")
COLUMNS = ("slower", "worse", "both", "drift", "healthy", "insufficient_data", "no_data")
OPPOSITE = {"slower": "worse", "worse": "slower"}
SEVERITY_RANK = {"page": 0, "warn": 1, "info": 2}
RESOLVE_WITHIN = 3  # windows after the fault's end
RIGHT_SHARE = 0.95


@dataclass(frozen=True)
class Truth:
    """What happened in a run: the right verdict, when the fault was on, which versions served."""

    verdict: str
    start: datetime
    end: datetime
    onset: datetime | None
    fault_end: datetime | None  # None: the fault lasts to the end of the run
    before_version: str
    after_version: str
    deploys: tuple[datetime, ...] = ()  # equivalent deploys (healthy runs): they must not alert
    events: tuple[datetime, ...] = ()  # every listed event's time, deploys included
    labels_until: datetime | None = None  # a quality fault: windows ending later had no labels by the end
    segment: str | None = None  # a fault in one segment only (`lang=de`): its incident must name it

    @classmethod
    def of(cls, gt) -> Truth:
        """From a simulator GroundTruth."""
        at = _parse
        return cls(gt.verdict, at(gt.start), at(gt.end), at(gt.onset), at(gt.fault_end),
                   gt.model_versions["before"], gt.model_versions["after"],
                   tuple(at(e["at"]) for e in gt.events if e["kind"] == "deploy"),
                   tuple(sorted(at(e["at"]) for e in gt.events)), segment=gt.segment)

    def after_deploy(self, when: datetime) -> bool:
        """Whether `when` falls between an equivalent deploy and the next listed event (or the end)."""
        for deploy in self.deploys:
            following = [e for e in self.events if e > deploy]
            if deploy <= when < (min(following) if following else self.end + WINDOW):
                return True
        return False

    @property
    def faulty(self) -> bool:
        return self.verdict != "healthy" and self.onset is not None


def _parse(s: str | None) -> datetime | None:
    return None if s is None else datetime.fromisoformat(s.replace("Z", "+00:00"))


def window_truth(truth: Truth, model_version: str, start: datetime, end: datetime,
                 window: timedelta = WINDOW) -> str | None:
    """The right verdict of one version's window; None when the window straddles the onset or the fault
    end (neither answer is wrong there). A version-change fault leaves the old version healthy."""
    if not truth.faulty:
        return "healthy"
    fault_end = truth.fault_end or truth.end + window
    if end <= truth.onset or start >= fault_end:
        return "healthy"
    if start < truth.onset or end > fault_end:
        return None
    if truth.before_version != truth.after_version and model_version == truth.before_version:
        return "healthy"
    if truth.labels_until is not None and end > truth.labels_until:
        return None  # its labels came after the run: no monitor could have called it worse yet
    return truth.verdict


def confusion(truth: Truth, verdicts: list[dict], window: timedelta = WINDOW) -> Counter:
    """(right verdict, stored verdict) -> number of windows, over the stored verdicts of length `window`."""
    out: Counter = Counter()
    for v in verdicts:
        if v["window_end"] - v["window_start"] != window:
            continue
        right = window_truth(truth, v["model_version"], v["window_start"], v["window_end"], window)
        if right is not None:
            out[(right, v["verdict"])] += 1
    return out


def severity(incident: dict) -> str:
    """The loudest severity an incident notified with: its summary's, or any of its alerts that fired."""
    summary = incident.get("summary") or {}
    found = [summary.get("severity", "info")]
    found += [a["labels"].get("severity", "info") for a in summary.get("alerts", []) if a.get("fired_at")]
    return min(found, key=lambda s: SEVERITY_RANK.get(s, 3))


@dataclass(frozen=True)
class Score:
    """One replay's figures; minutes are signed (negative: before the truth), None when not measurable."""

    verdict: str  # the first regression incident's verdict about the fault, or "healthy"
    onset_error_min: float | None  # its `since` (first window start) minus the true onset
    first_alert_min: float | None  # its first message (opening, or the daemon's first tick) minus the onset
    resolve_delay_min: float | None  # its last resolve minus the fault end; None: still open, or no end
    premature_resolves: int  # resolves of incidents about the fault before the fault ended
    false_pages: int  # page incidents not about the fault
    false_pages_per_day: float
    deploy_alerts: int  # warn or page incidents on the deployed version, starting before the next event
    incident_windows: int
    right_windows: int
    opposite_windows: int
    confusion: Counter = field(default_factory=Counter)
    segment_named: bool | None = None  # a segment fault: whether its first incident names the segment

    @property
    def right_share(self) -> float | None:
        return self.right_windows / self.incident_windows if self.incident_windows else None


def incidents_about(truth: Truth, incidents: list[dict], window: timedelta = WINDOW) -> list[dict]:
    """The incidents about the fault, oldest first: regressions opened between the onset and RESOLVE_WITHIN
    windows after the fault's end."""
    if not truth.faulty:
        return []
    until = (truth.fault_end or truth.end + window) + RESOLVE_WITHIN * window
    return sorted((i for i in incidents if i["verdict"] in REGRESSIONS and truth.onset <= i["opened_at"] <= until),
                  key=lambda i: i["opened_at"])


def score(truth: Truth, incidents: list[dict], verdicts: list[dict], window: timedelta = WINDOW,
          first_tick: datetime | None = None) -> Score:
    """Score a replay's stored incidents and verdicts against `truth`. An incident is about the fault when
    it is a regression opened between the onset and RESOLVE_WITHIN windows after the fault's end. A backlog's
    catch-up dates an incident's opening to when it would have opened live, but its first message leaves at
    the daemon's `first_tick`: the first alert is the later of the two."""
    fault_end = truth.fault_end
    about = incidents_about(truth, incidents, window)
    first = about[0] if about else None

    def minutes(d: timedelta) -> float:
        return d.total_seconds() / 60

    premature = sum(1 for i in about if i["resolved_at"] is not None
                    and (fault_end is None or i["resolved_at"] < fault_end))
    delay = None
    if about and fault_end is not None and all(i["resolved_at"] is not None for i in about):
        delay = minutes(max(i["resolved_at"] for i in about) - fault_end)
    ids = {i["id"] for i in about}
    pages = sum(1 for i in incidents if i["id"] not in ids and severity(i) == "page")
    deploy_alerts = sum(1 for i in incidents if truth.deploys and i.get("model_version") == truth.after_version
                        and truth.after_deploy(i["first_window_start"] or i["opened_at"])
                        and SEVERITY_RANK.get(severity(i), 3) <= SEVERITY_RANK["warn"])
    table = confusion(truth, verdicts, window)
    faulty = {k: n for k, n in table.items() if k[0] != "healthy"}
    days = (truth.end - truth.start) / timedelta(days=1)
    return Score(
        verdict=first["verdict"] if first else "healthy",
        onset_error_min=minutes(first["first_window_start"] - truth.onset)
        if first and first["first_window_start"] else None,
        first_alert_min=minutes(max(first["opened_at"], first_tick or first["opened_at"]) - truth.onset)
        if first else None,
        resolve_delay_min=delay, premature_resolves=premature, false_pages=pages,
        false_pages_per_day=pages / days if days > 0 else 0.0, deploy_alerts=deploy_alerts,
        incident_windows=sum(faulty.values()),
        right_windows=sum(n for (t, p), n in faulty.items() if t == p),
        opposite_windows=sum(n for (t, p), n in faulty.items() if OPPOSITE.get(t) == p),
        confusion=table, segment_named=names(first, truth.segment) if first and truth.segment else None)


def names(incident: dict, segment: str) -> bool:
    """Whether the incident's stored summary (headline, evidence, alerts) names `segment` (`lang=de`)."""
    return segment in json.dumps(incident.get("summary") or {}, default=str)


def misses(truth: Truth, s: Score, window: timedelta = WINDOW) -> list[str]:
    """The targets this replay misses, each as a short phrase; empty when it meets them all."""
    out = []
    w = window.total_seconds() / 60
    if not truth.faulty:
        if s.false_pages:
            out.append(f"{s.false_pages} page(s)")
        if s.deploy_alerts:
            out.append(f"{s.deploy_alerts} alert(s) on the equivalent deploy")
        return out
    if s.first_alert_min is None:
        return [f"no {truth.verdict} incident"]
    if s.verdict != truth.verdict:
        out.append(f"incident says {s.verdict}")
    if truth.segment and not s.segment_named:
        out.append(f"segment {truth.segment} not named")
    if s.onset_error_min is None or abs(s.onset_error_min) > w:
        out.append("onset error > 1 window")
    if s.premature_resolves:
        out.append(f"{s.premature_resolves} premature resolve(s)")
    if truth.fault_end is not None:
        if s.resolve_delay_min is None:
            out.append("never resolved")
        elif s.resolve_delay_min > RESOLVE_WITHIN * w:
            out.append(f"resolved > {RESOLVE_WITHIN} windows after the fault end")
    if s.right_share is None or s.right_share < RIGHT_SHARE:
        out.append(f"right verdict < {RIGHT_SHARE:.0%} of fault windows")
    if s.opposite_windows:
        out.append(f"{s.opposite_windows} window(s) of the opposite kind")
    return out
