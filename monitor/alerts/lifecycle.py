"""The alert lifecycle: an alert's next state (inactive -> pending -> firing -> resolved, Prometheus rule
semantics), and for verdict alerts the walk over stored windows that dates an episode's onset and says
when it resolves (clear windows, traffic gone, signals back within their pre-incident baseline)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from monitor.alerts.alert import ACTIVE_STATES, FAMILY, Alert, Sample, louder
from monitor.config import VerdictAlerts
from monitor.verdicts.evidence import rule_text
from monitor.verdicts.verdict import (
    HARMFUL,
    SERVING_CHECKS,
    Evidence,
    Verdict,
    episode_signals,
    is_service_regression,
)
from storage.alerts import AlertState
from storage.database import utc
from storage.jsontext import dumps
from storage.store import Store

# How far back the onset walk reads stored verdicts: an episode older than this is dated to its limit.
ONSET_LOOKBACK = timedelta(days=7)
QUALITY_RULE = "acceptance"  # the check of the acceptance rules: a quality episode holds on them
# The most clear windows the onset walk crosses between two breaching ones (each is checked against the
# earlier one's baseline): a longer quiet stretch is taken as the end of an earlier episode.
MAX_GAP = 8


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
    baseline that can learn a regression. Each acceptance rule it breached on too: that one
    compares with the reference or the accepted version, and is back only when a window decides it clear
    again, not when a window is too small to tell."""
    out: dict[str, dict[str, Any]] = {}
    for items in evidence:
        for e in items:
            labels = dict(e.get("labels") or {})
            service = e["check"] in SERVING_CHECKS or e["check"] == "latency" and is_service_regression(
                {"labels": labels})
            if e.get("status") != "breach" or e.get("value") is None:
                continue
            if e["check"] == QUALITY_RULE:
                out.setdefault(dumps([e["check"], labels]), {"check": e["check"], "labels": labels,
                                                             "baseline": e.get("baseline"), "value": e["value"]})
            elif service and e.get("baseline") is not None:
                out.setdefault(dumps([e["check"], labels]), {"check": e["check"], "labels": labels,
                                                             "baseline": e["baseline"], "value": e["value"]})
    return out


def _rule_not_back(p: Mapping[str, Any], found: Sequence[Mapping[str, Any]]) -> str | None:
    """Why an acceptance rule an episode breached on is not back in `found` (a window's findings, the
    shortest first), or None when a window decides it clear or none scored it. Labelled findings speak
    first: an estimate does not clear what labels can judge."""
    mine = [f for f in found if f["check"] == p["check"] and dict(f.get("labels") or {}) == p["labels"]]
    labelled = [f for f in mine if not (f.get("detail") or {}).get("estimated")]
    mine = labelled or mine
    decided = next((f for f in mine if f["status"] in ("ok", "breach")), None)
    f = decided or next(iter(mine), None)
    if f is None or f["status"] == "ok":
        return None
    labels = ",".join(f"{k}={v}" for k, v in sorted(p["labels"].items()) if k != "rule")
    what = f"rule {p['labels'].get('rule')} ({labels})"
    if f["status"] == "insufficient":
        return f"{what}: too few labels to tell (n={f.get('n') or 0})"
    return f"{what} still breaching: {rule_text(f)}"


def not_back(pre: Mapping[str, Mapping[str, Any]], found: Sequence[Mapping[str, Any]],
             settings: VerdictAlerts) -> list[str]:
    """The episode's signals whose value in `found` (a window's findings) is not back within their
    pre-incident baseline: still shifted the way the breach went by at least `min_effect_ratio` of the
    baseline (latency quantiles: or `min_effect_ms`, whichever is smaller), with the baseline outside the
    value's 95% interval. A signal without a decided finding does not hold the episode."""
    by_key = {dumps([f["check"], dict(f.get("labels") or {})]): f for f in found if f["status"] in ("ok", "breach")}
    out = []
    for key, p in pre.items():
        if p["check"] == QUALITY_RULE:
            if (why := _rule_not_back(p, found)) is not None:
                out.append(why)
            continue
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


def stored_signals(verdict: str, evidence: Sequence[Any]) -> set[tuple]:
    """A stored or new verdict's episode signals (none unless it is harmful)."""
    if verdict not in HARMFUL:
        return set()
    return episode_signals([e.as_dict() if isinstance(e, Evidence) else e for e in evidence or ()])


_Episodes = dict[tuple[str, timedelta], dict[datetime, tuple[Window, set[tuple]]]]


def load_episodes(store: Store, service: str, wanted: Sequence[tuple[str, datetime, datetime]],
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
        with store.transaction() as session:
            rows = store.verdicts.ending_at(session, service, version, ends)
        for w_start, w_end, verdict, n, evidence in rows:
            w_start, w_end = utc(w_start), utc(w_end)
            if w_end - w_start == length:
                out[(version, length)][w_start] = (Window(w_start, w_end, verdict, int(n or 0)),
                                                   stored_signals(verdict, evidence))
    return out


def load_history(store: Store, service: str, versions: Sequence[str], until: datetime) -> dict[str, list[Window]]:
    """The stored verdicts of `versions` (every window length) that ended in the ONSET_LOOKBACK before
    `until`, per version, oldest first: the windows the lifecycle walks."""
    if not versions:
        return {}
    out: dict[str, list[Window]] = defaultdict(list)
    with store.transaction() as session:
        found = store.verdicts.windows(session, service, list(versions), until - ONSET_LOOKBACK, until)
        for version, start, end, verdict, rows in found:
            out[version].append(Window(utc(start), utc(end), verdict, int(rows or 0)))
    return out


def load_onsets(store: Store, service: str, current: Mapping[str, Verdict | None], history: Mapping[str, list[Window]],
                active: Mapping[tuple[str, str], AlertState], settings: VerdictAlerts
                ) -> dict[str, tuple[datetime, list[list[dict[str, Any]]]]]:
    """Per version whose verdict breaches, its episode's onset (onset_of, each clear window in a gap
    checked against the earlier breaching window's stored evidence, as live evaluation would have held it)
    and the stored evidence of that first window (shortest length first): its pre-incident baselines."""
    out: dict[str, tuple[datetime, list[list[dict[str, Any]]]]] = {}

    def evidence(version: str, window: Window, family: Sequence[str]) -> list[list[dict[str, Any]]]:
        with store.transaction() as session:
            rows = store.verdicts.evidence(session, service, version, window.start, tuple(family))
        return [list(e or []) for e in rows]

    for version, v in current.items():
        name = next((n for n, family in FAMILY.items() if v is not None and v.verdict in family), None)
        if v is None or name is None:
            continue

        def back(clear: Window, earlier: Window, version: str = version, family=FAMILY[name]) -> bool:
            with store.transaction() as session:
                found = [f for f in store.findings.load(session, service, since=clear.start,
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
