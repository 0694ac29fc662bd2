"""One tick: the stages in order for every service (ingest, score windows, ingest labels, score quality),
its `ticks` row started and finished, and what each stage did in one TickReport."""

from __future__ import annotations

import gc
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from datetime import datetime

from checks.judge import judge, summary
from monitor.aggregate.profile import read_reference, stored_profile
from monitor.config import Config, Service
from monitor.ingest.labels import Labelled, ingest_labels, unmatched
from monitor.ingest.quarantine import warning
from monitor.ingest.sources.batch import Chain, Observer
from monitor.ingest.stage import Ingested, ingest
from monitor.memory import release_memory
from monitor.verdicts.stage import QualityScored, WindowsScored, score_quality, score_windows
from storage.store import Store


@dataclass
class TickReport:
    """What one tick of one service read and did; counts are rows. A stage's counts are named as here."""

    service: str
    now: str
    status: str = "ok"
    error: str | None = None
    read: Counter = field(default_factory=Counter)  # per record kind
    accepted: Counter = field(default_factory=Counter)  # per record kind
    quarantined: Counter = field(default_factory=Counter)  # per reason code
    quarantined_fields: Counter = field(default_factory=Counter)  # per "reason:kind:field", rows naming a field
    joined: int = 0  # predictions folded with at least one stage timing
    unmatched: int = 0  # predictions folded without timings (lateness passed)
    orphan_timings: int = 0
    duplicates: int = 0
    duplicate_timings: int = 0
    pending_predictions: int = 0  # still waiting for timings after this tick
    pending_timings: int = 0
    folded: int = 0  # predictions folded into bucket partials
    buckets: int = 0  # partial rows written (bucket x model_version x segment)
    first_ts: str | None = None
    last_ts: str | None = None
    capped: Counter = field(default_factory=Counter)  # rows folded into `<other>` past a limits.max_* cap, per field
    events: list[str] = field(default_factory=list)
    findings: int = 0  # findings written for the windows scored this tick
    breaches: list[str] = field(default_factory=list)  # one line per breaching finding, worst windows last
    labels_new: int = 0  # requests labelled for the first time
    labels_changed: int = 0  # labels that said something else than the stored one (the latest wins)
    labels_repeated: int = 0  # labels repeating the stored one
    labels_expired: int = 0  # labels quarantined: no prediction within quality.label_horizon
    quality_windows: int = 0  # (window, model version) pairs quality was scored for
    quality_findings: int = 0
    quality_breaches: list[str] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # e.g. most rows quarantined

    def as_dict(self) -> dict:
        # Not dataclasses.asdict: it rebuilds a Counter from (key, value) pairs and so counts the pairs.
        return {f.name: (dict(v) if isinstance(v := getattr(self, f.name), Counter) else v) for f in fields(self)}

    def add(self, done: Stage) -> None:
        """Add what a stage returned: counts summed, lines appended, times set; its fields the report does
        not name are left out."""
        for f in fields(done):
            if f.name not in _REPORTED:
                continue
            value, mine = getattr(done, f.name), getattr(self, f.name)
            if isinstance(mine, Counter):
                mine.update(value)
            elif isinstance(mine, list):
                mine += value
            elif isinstance(mine, int):
                setattr(self, f.name, mine + value)
            elif value is not None:
                setattr(self, f.name, value)


Stage = Ingested | WindowsScored | Labelled | QualityScored  # what the stages of a tick return
_REPORTED = frozenset(f.name for f in fields(TickReport))


def tick(config: Config, store: Store, now: datetime, observe: Observer | None = None) -> list[TickReport]:
    """Run one tick for every configured service at clock `now` (UTC). `observe` is told the rows read so
    far and the rows in all when known, over the services one after another (see `ingest`)."""
    # The objects alive before the tick (modules, config, the daemon's state: a few hundred thousand) are
    # kept out of the collector's full passes until it ends: each pass over them cost ~90 ms, and a tick
    # that allocates many objects set off a dozen. Unfrozen after, they are collected as before.
    gc.freeze()
    try:
        chain = Chain(observe) if observe is not None else None
        reports = []
        for service in config.services:
            reports.append(run_service(config, service, store, now, chain))
            if chain is not None:
                chain.next()
        return reports
    finally:
        gc.unfreeze()
        release_memory()


def run_service(config: Config, service: Service, store: Store, now: datetime,
                observe: Observer | None = None) -> TickReport:
    """One service's tick: its stages in order, a failure stored in its `ticks` row rather than raised;
    `observe` is told the rows its ingest reads (see `ingest`)."""
    started = time.perf_counter()
    report = TickReport(service=service.name, now=now.isoformat())
    with store.transaction() as session:
        tick_id = store.ticks.start(session, service.name, now)
    # The source stages fill their counts as they commit: a failed tick still reports what it stored.
    ingested, labelled = Ingested(), Labelled()
    done: list[Stage] = [ingested]
    try:
        # One profile for the tick: the bins partials are folded on are the bins windows are scored on.
        profile, note = stored_profile(store, service)
        if note:
            report.notes.append(note)
            if service.reference is not None:  # the profile was just built: what the config names, checked once
                report.warnings += unmatched(read_reference(service.reference, service.schema_.fold_case), service, "the reference")
        if profile is not None and (concerns := summary(judge(profile, service.check_params()))):
            report.notes.append(concerns)
        ingest(config, service, store, now, tick_id, profile, ingested, observe)
        done.append(score_windows(service, store, now, tick_id, profile, ingested.span))
        if service.quality is not None:
            done.append(labelled)
            ingest_labels(config, service, store, now, tick_id, labelled)
            done.append(score_quality(config, service, store, now, tick_id, labelled.labelled_at, ingested.span))
    except Exception as exc:  # a tick never crashes the daemon; its row says what went wrong
        report.status, report.error = "error", f"{type(exc).__name__}: {exc}"
    for stage in done:
        report.add(stage)
    # The share's rows are those this tick decided on: read now, or read before and let go now.
    decided = sum(report.read.values()) + ingested.orphans_read_before + labelled.labels_expired
    if report.status == "ok" and (said := warning(decided, report.quarantined,
                                                   report.quarantined_fields, config.limits.max_quarantine_share)):
        report.warnings.append(said)
    report.seconds = round(time.perf_counter() - started, 3)
    if service.quality is not None:
        report.notes.append("quality: labelled failed, timed-out and rejected requests "
                            + ("count as misses" if service.quality.failed_as_miss else "are left out"))
    elif service.sources.labels is not None:
        report.notes.append("labels source configured without a `quality` section: labels are not read")
    with store.transaction() as session:
        store.ticks.finish(session, tick_id, report.status, _tick_counts(report), report.as_dict())
    return report


def _tick_counts(report: TickReport) -> dict:
    return {
        "rows_read": sum(report.read.values()),
        "accepted": sum(report.accepted.values()),
        "quarantined": sum(report.quarantined.values()),
        "joined": report.joined,
        "unmatched": report.unmatched,
        "duplicates": report.duplicates,
    }
