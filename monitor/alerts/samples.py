"""Alert samples: verdicts of each version's last windows (fitted across window lengths, with matured
quality), SLO rules, no_data and pipeline errors become the Samples an evaluation hands the lifecycle."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from checks.rules import RuleResult, evaluate, partial_loader
from monitor.alerts.alert import (
    ACTIVE_STATES,
    DRIFT,
    ERROR,
    FAMILY,
    NO_DATA,
    REGRESSION,
    SEVERITY_RANK,
    AlertsReport,
    Sample,
)
from monitor.alerts.lifecycle import (
    Window,
    held_signals,
    lifecycle,
    load_episodes,
    load_history,
    load_onsets,
    not_back,
    pre_incident,
    stored_signals,
    superseded,
)
from monitor.config import Alerts, Service, VerdictAlerts
from monitor.ingest.quarantine import QUARANTINED
from monitor.verdicts.verdict import (
    CONFIRMED_QUALITY,
    SERVING_CHECKS,
    Evidence,
    Verdict,
    decide,
    is_service_regression,
)
from monitor.verdicts.windows import floor_to
from storage.jsontext import dumps
from storage.operations import TickRecord
from storage.store import Store


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
    """A verdict's alert annotations; `digest` is what the message says (verdict, stage, segment, changes):
    a firing alert whose digest changed is updated in place."""
    digest = [v.verdict, v.estimated, v.rollback_to, v.attribution.get("top_stage"),
              sorted(c["value"] for c in v.what_changed)]
    if v.attribution.get("segment"):  # a slowdown that moves to another segment is another message
        digest.append(v.attribution["segment"])
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
        coverage = store.findings.load(session, service.name, since=now - q.maturity_horizon - max(q.windows),
                                       until=now, check="label_coverage")
        for size in sorted(set(q.windows)):
            newest = max((f["window_end"] for f in coverage if f["window_end"] - f["window_start"] == size
                          and (f["labels"] or {}) == {"class": "all"} and (f["detail"] or {}).get("matured")
                          and now - q.maturity_horizon <= f["window_end"] < last.get(size, now)), default=None)
            if newest is None:
                continue
            found = store.findings.load(session, service.name, since=newest - size,
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


def service_samples(service: Service, store: Store, now: datetime, settings: Alerts,
                    report: AlertsReport) -> list[Sample]:
    name = service.name
    lengths = eval_windows(service, now)
    start, end = lengths[0]
    load = partial_loader(store, name)
    rule_results = [(rule, evaluate(rule, load, end, end - start)) for rule in service.rules]
    with store.transaction() as session:
        versions = store.versions.load(session, name)
        cursor = store.alerts.cursor(session, name)
        windows, last_tick = store.findings.scored_since(session, name, cursor.last_tick_id if cursor else 0, now)
        by_length = [[f for f in store.findings.load(session, name, since=a, until=a + timedelta(microseconds=1))
                      if f["window_end"] == b] for a, b in lengths]
        ticks = store.ticks.last(session, name, limit=settings.source_error_ticks + 1)
        last_read = store.ticks.last_read(session, name, now)
        # The daemon's job errors and missed runs (process-wide) during the evaluated window.
        job_events = store.job_events.load(session, start, now + timedelta(microseconds=1))
        # Versions whose verdict alert is pending or firing: each gets a sample, with traffic or without.
        active = {(r.alertname, (r.labels or {}).get("model_version")): r for r in store.alerts.load(
            session, name, alertnames=(REGRESSION, DRIFT), states=ACTIVE_STATES)}
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
    episodes = load_episodes(store, name, wanted, settings.verdict.resolve_after)
    held_at: dict[tuple[str, datetime, datetime], set[tuple]] = {}
    for version, w_start, w_end in wanted:  # oldest first: a window holds on what the ones before it breached
        if w_start not in by_start:
            with store.transaction() as session:
                by_start[w_start] = store.findings.load(session, name, since=w_start,
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
        before[w_start] = (Window(w_start, w_end, v.verdict, v.rows), stored_signals(v.verdict, v.evidence))
    with store.transaction() as session:
        store.verdicts.upsert(session, [v.to_row() for v in verdicts.values()])
        store.alerts.save_cursor(session, name, last_tick, now)
    report.verdicts += [{"service": name, "model_version": v.model_version, "window_start": v.window_start.isoformat(),
                         "window_end": v.window_end.isoformat(), "verdict": v.verdict, "summary": v.summary}
                        for v in verdicts.values()]

    # One verdict per version for its alerts, whichever window lengths decided it: one alert identity per
    # version and verdict, so an incident is not paged once per window length.
    matured = matured_quality(service, store, now, lengths)
    history = load_history(store, name, sorted({*sampled, *(v for _, v in active if v)}), end)

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
            # The matured quality windows' acceptance rules too: a rule is judged where its labels are.
            found += [f for _, rules in matured for f in rules
                      if f["model_version"] == version and f["check"] == "acceptance"]
            held[(alertname, version)] = not_back(pre, found, settings.verdict)
    samples = verdict_samples(service, by_version, history, settings, end=end, shortest=end - start,
                              serving=serving, last_active_end=last_active_end, held=held,
                              onsets=load_onsets(store, name, by_version, history, active, settings.verdict))
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
    # Logs the contract cannot read (a renamed field, a new timestamp format) look like no traffic to every
    # window check: said as no_data, naming the reasons and fields, while the newest tick that read any rows
    # quarantined most of them (a tick with no new lines says nothing new about their shape).
    warned = [w for w in ((last_read.summary or {}).get("warnings") or [] if last_read is not None else [])
              if w.startswith(QUARANTINED)]
    samples.append(Sample({"alertname": NO_DATA, "service": name, "severity": settings.no_data.severity,
                           "source": "quarantine"}, bool(warned), settings.no_data.for_, timedelta(0),
                          {"summary": f"{name}'s logs are mostly quarantined: "
                                      + (warned[0] if warned else "no longer"),
                           "window_start": start.isoformat(), "window_end": end.isoformat(),
                           "digest": "quarantine"}))
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
        rows = store.findings.load(session, service.name, since=horizon - timedelta(days=7), until=horizon,
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
