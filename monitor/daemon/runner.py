"""One tick: read new rows, enforce the contract, join, fold into bucket partials, store.

Each step (one chunk of predictions and one of timings) commits its quarantine rows, partials, join
buffer and source offsets in one transaction: a crash at any point loses and repeats nothing. A step's
commit does not wait for the disk (`Store.transaction(durable=False)`): an OS crash or power cut may undo
the last steps, offsets included, and they are read again.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
from pandas._libs import hashtable

from checks.evaluate import compare_with
from checks.judge import judge, summary
from monitor.aggregate.fold import fold
from monitor.aggregate.partial import merge_bytes
from monitor.aggregate.profile import Profile, stored_profile
from monitor.config import Config, Service
from monitor.contract import RecordKind, Reject
from monitor.ingest.accept import check_batch
from monitor.ingest.frame import ARRIVED, Joined, combined_hashes, from_blobs, join, to_blob
from monitor.ingest.labels import label_batch, orphan_reject, scored_rows
from monitor.ingest.quarantine import warning
from monitor.ingest.sources import open_source
from monitor.ingest.sources.batch import FILE, Batch
from monitor.ingest.sources.files import DirectorySource
from monitor.ingest.sources.sql import SqlTableSource
from monitor.memory import release_memory
from monitor.verdicts.quality import score_service, windows_holding
from monitor.verdicts.windows import Anchors, score, store_scored, windows_for
from storage.store import Store


@dataclass
class TickReport:
    """What one tick of one service read and did; counts are rows."""

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


def tick(config: Config, store: Store, now: datetime) -> list[TickReport]:
    """Run one tick for every configured service at clock `now` (UTC)."""
    # The objects alive before the tick (modules, config, the daemon's state: a few hundred thousand) are
    # kept out of the collector's full passes until it ends: each pass over them cost ~90 ms, and a tick
    # that allocates many objects set off a dozen. Unfrozen after, they are collected as before.
    gc.freeze()
    try:
        return [run_service(config, service, store, now) for service in config.services]
    finally:
        gc.unfreeze()
        release_memory()


def run_service(config: Config, service: Service, store: Store, now: datetime) -> TickReport:
    started = time.perf_counter()
    report = TickReport(service=service.name, now=now.isoformat())
    with store.transaction() as session:
        tick_id = store.ticks.start(session, service.name, now)
    try:
        # One profile for the tick: the bins partials are folded on are the bins windows are scored on.
        profile, note = stored_profile(store, service)
        if note:
            report.notes.append(note)
        if profile is not None and (concerns := summary(judge(profile, service.check_params()))):
            report.notes.append(concerns)
        _ingest(config, service, store, now, tick_id, report, profile)
        _score(service, store, now, tick_id, report, profile)
        if service.quality is not None:
            labelled_at = _ingest_labels(config, service, store, now, tick_id, report)
            _score_quality(config, service, store, now, tick_id, report, labelled_at)
        said = warning(sum(report.read.values()), report.quarantined, report.quarantined_fields,
                       config.limits.max_quarantine_share)
        report.warnings += [said] if said else []
    except Exception as exc:  # a tick never crashes the daemon; its row says what went wrong
        report.status, report.error = "error", f"{type(exc).__name__}: {exc}"
    report.seconds = round(time.perf_counter() - started, 3)
    if service.quality is not None:
        report.notes.append("quality: labelled failed, timed-out and rejected requests "
                            + ("count as misses" if service.quality.failed_as_miss else "are left out"))
    elif service.sources.labels is not None:
        report.notes.append("labels source configured without a `quality` section: labels are not read")
    with store.transaction() as session:
        store.ticks.finish(session, tick_id, report.status, _tick_counts(report), report.as_dict())
    return report


def _score(service: Service, store: Store, now: datetime, tick_id: int, report: TickReport,
           profile: Profile | None) -> None:
    """Score the closed windows this tick completed or added rows to, and store their findings."""
    touched = None
    if report.first_ts is not None:
        touched = (datetime.fromisoformat(report.first_ts), datetime.fromisoformat(report.last_ts))
    # Every length's windows in one call: they share the stored buckets it reads and decodes.
    windows = [w for size in service.buckets.windows for w in windows_for(now, size, touched)]
    ref = service.reference
    params = compare_with(service.check_params(), service.checks, ref.compare_with if ref else "reference")
    scored = score(store, service.name, profile, windows, params=params, baseline_kind=service.baseline,
                   accepted=ref.accepted if ref else None, anchors=load_anchors(service, store))
    report.findings = store_scored(store, service.name, scored, tick_id)
    report.breaches = [
        f"{s.start:%Y-%m-%d %H:%M}+{int((s.end - s.start).total_seconds() // 60)}m {s.model_version} "
        f"{f.check} {describe_labels(f.labels)}: {_num(f.value)} vs {_num(f.baseline)} (n={f.n})"
        for s in scored for f in s.findings if f.status == "breach"
    ]


def load_anchors(service: Service, store: Store) -> Anchors:
    """What holds `service`'s baselines (windows.Anchors): its accepted versions (config and `tailwatch
    accept`), every version value's first sighting, and the onsets of its open incidents."""
    with store.transaction() as session:
        accepted = store.versions.load_accepted(session, service.name)
        sightings = store.versions.load(session, service.name)
        incidents = store.incidents.load(session, service.name, status="open")
    listed = set(service.accepted_versions) | {a["value"] for a in accepted}
    if service.quality is not None and service.quality.accepted_version:
        listed.add(service.quality.accepted_version)
    return Anchors(accepted=frozenset(listed),
                   sightings=tuple((v["kind"], v["value"], v["first_seen"]) for v in sightings),
                   incidents=tuple((i["model_version"], i["first_window_start"]) for i in incidents
                                   if i["first_window_start"] is not None),
                   soak=service.soak, lag=service.baseline_lag)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def describe_labels(labels: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _tick_counts(report: TickReport) -> dict:
    return {
        "rows_read": sum(report.read.values()),
        "accepted": sum(report.accepted.values()),
        "quarantined": sum(report.quarantined.values()),
        "joined": report.joined,
        "unmatched": report.unmatched,
        "duplicates": report.duplicates,
    }


def _ingest(config: Config, service: Service, store: Store, now: datetime, tick_id: int, report: TickReport,
            profile: Profile | None) -> None:
    name = service.name
    pred_source = open_source(f"{name}/predictions", service.sources.predictions, config.limits)
    time_source = (open_source(f"{name}/timings", service.sources.timings, config.limits)
                   if service.sources.timings is not None else None)
    with store.transaction() as session:
        pred_offsets = store.offsets.load(session, pred_source.name)
        time_offsets = store.offsets.load(session, time_source.name) if time_source else {}
        pending_p = from_blobs(store.pending.load(session, name, RecordKind.predictions.value))
        pending_t = from_blobs(store.pending.load(session, name, RecordKind.timings.value))

    pred_batches = _read_ahead(pred_source, pred_offsets)
    time_batches = _read_ahead(time_source, time_offsets) if time_source else iter(())
    timed = time_source is not None
    seen_p, seen_t = _Seen(("request_id",)), _Seen(("request_id", "stage"))
    # A step's fold runs on a worker while this thread validates and joins the next step (numpy releases
    # the GIL for much of a fold); steps still commit one by one, in order, each with its offsets.
    folder = ThreadPoolExecutor(FOLD_WORKERS, thread_name_prefix="tailwatch-fold")
    try:
        previous: _Step | None = None
        final = False
        while not final:
            pb, tb = next(pred_batches, None), next(time_batches, None)
            # The last step reads nothing and lets waiting rows expire; it runs even when nothing new arrived.
            final = pb is None and tb is None
            rejects: list[tuple[RecordKind, str, Reject]] = []
            new_p = _accept(pb, RecordKind.predictions, service, config, now, report, rejects)
            new_t = _accept(tb, RecordKind.timings, service, config, now, report, rejects) if timed else None
            # A row repeating one read earlier in this tick (another file, another chunk) is a duplicate as
            # one repeating a waiting row is: the first wins. Rows that left the buffer are not in it.
            new_p, dropped = seen_p.drop_seen(new_p)
            report.duplicates += dropped
            if timed:
                new_t, dropped = seen_t.drop_seen(new_t)
                report.duplicate_timings += dropped
            joined = join(_concat(pending_p, new_p), _concat(pending_t, new_t) if timed else None, now,
                          service.join.lateness, expire=final)
            pending_p, pending_t = joined.pending_predictions, joined.pending_timings
            for _, row in joined.orphans.iterrows():
                rejects.append((RecordKind.timings, row.get("_source", ""), _orphan(row)))
            step = _Step(pb, tb, rejects, joined, new_p, folder.submit(_fold_step, joined.ready, service, timed, profile))
            if previous is not None:
                _commit(previous, service, store, now, tick_id, report, pred_source, time_source)
            previous = step
        _commit(previous, service, store, now, tick_id, report, pred_source, time_source)
    finally:
        folder.shutdown(wait=True, cancel_futures=True)
    report.pending_predictions, report.pending_timings = len(pending_p), len(pending_t)


class _Seen:
    """The keys of the rows accepted so far in one tick, as 64-bit hashes (frame.key_hashes); hashed only
    once a second step brings rows (most ticks read one)."""

    def __init__(self, columns: tuple[str, ...]):
        self.columns = columns
        self.first: pd.DataFrame | None = None
        # An incremental uint64 hash set: a tick's keys without a Python object each.
        self.keys: hashtable.UInt64HashTable | None = None

    def drop_seen(self, rows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
        """`rows` without those whose key was accepted earlier this tick, and how many were dropped."""
        if rows is None or not len(rows) or any(c not in rows for c in self.columns):
            return rows, 0
        if self.keys is None:
            if self.first is None:
                self.first = rows
                return rows, 0
            self.keys = hashtable.UInt64HashTable()
            self.keys.map_locations(combined_hashes([self.first[c] for c in self.columns]))
            self.first = None
        keys = combined_hashes([rows[c] for c in self.columns])
        repeated = self.keys.lookup(keys) >= 0
        self.keys.map_locations(keys)
        if not repeated.any():
            return rows, 0
        return rows[~repeated].reset_index(drop=True), int(repeated.sum())


FOLD_WORKERS = 2  # steps folded at once; each holds its rows' per-row arrays until it is committed


@dataclass
class _Step:
    """One step of a tick: what it read, its rejects and join, and its fold (running on a worker)."""

    pb: Batch | None
    tb: Batch | None
    rejects: list[tuple[RecordKind, str, Reject]]
    joined: Joined
    new_p: pd.DataFrame
    folded: Future  # (partials, first sightings)


def _fold_step(ready: pd.DataFrame, service: Service, timed: bool, profile: Profile | None) -> tuple[list, dict]:
    partials = fold(ready, service.buckets.size, service.schema_.segments, timed=timed, schema=service.schema_,
                    profile=profile)
    return partials, first_sightings(ready)


def _commit(step: _Step, service: Service, store: Store, now: datetime, tick_id: int, report: TickReport,
            pred_source, time_source) -> None:
    """Store one step's quarantine, partials, waiting rows and offsets in one transaction; count it."""
    name, joined, ready = service.name, step.joined, step.joined.ready
    partials, sightings = step.folded.result()
    # Not durable: waiting for the disk at every step was the largest fixed cost of a small tick. An OS
    # crash can only undo whole steps, offsets with their results, which are then read again; the
    # durable commit of `ticks.finish` syncs the steps before it.
    with store.transaction(durable=False) as session:
        store.quarantine.add(session, _quarantine_rows(step.rejects, tick_id, name, now))
        if partials:
            store.partials.upsert(session, name, partials, merge_bytes)
        for kind, first_seen in sightings.items():
            store.versions.record(session, name, kind, first_seen)
        if service.quality is not None:
            # Partials keep no rows; quality needs each prediction until its label lands.
            store.labels.add_predictions(session, name, scored_rows(step.new_p, service))
        store.pending.replace(session, name, RecordKind.predictions.value, to_blob(joined.pending_predictions),
                              len(joined.pending_predictions))
        if time_source:
            store.pending.replace(session, name, RecordKind.timings.value, to_blob(joined.pending_timings),
                                  len(joined.pending_timings))
        if step.pb is not None:
            store.offsets.save(session, pred_source.name, step.pb.offsets)
        if step.tb is not None:
            store.offsets.save(session, time_source.name, step.tb.offsets)

    _count_rejects(report, step.rejects)
    report.orphan_timings += len(joined.orphans)
    report.duplicates += joined.duplicates
    report.duplicate_timings += joined.duplicate_timings
    report.folded += len(ready)
    report.buckets += len(partials)
    if len(ready) and time_source:
        report.joined += int(ready["joined"].sum())
        report.unmatched += int((~ready["joined"]).sum())
    if len(ready):
        lo, hi = ready["ts"].min().isoformat(), ready["ts"].max().isoformat()
        report.first_ts = min(report.first_ts or lo, lo)
        report.last_ts = max(report.last_ts or hi, hi)


def _read_ahead(source: DirectorySource | SqlTableSource, offsets: dict) -> Iterator[Batch]:
    """`source.read(offsets)`; for files, the next batch is parsed on a worker thread while the caller
    validates, folds and commits this one (pyarrow releases the GIL while it parses), one batch ahead at most.

    Nothing is committed ahead: offsets still go with each batch's results, so a crash loses and repeats
    nothing. SQL tables are read in order on the caller's thread (their connection may share a database
    file with the store).
    """
    batches = source.read(offsets)
    if not isinstance(source, DirectorySource):
        yield from batches
        return
    with ThreadPoolExecutor(1, thread_name_prefix="tailwatch-read") as pool:
        ahead = pool.submit(next, batches, None)
        while (batch := ahead.result()) is not None:
            ahead = pool.submit(next, batches, None)
            yield batch


def _ingest_labels(config: Config, service: Service, store: Store, now: datetime, tick_id: int,
                   report: TickReport) -> list[datetime]:
    """Read new labels, store them (latest wins, changes counted), quarantine labels whose prediction did
    not arrive within quality.label_horizon; returns the prediction times of the requests (re)labelled."""
    name = service.name
    source = open_source(f"{name}/labels", service.sources.labels, config.limits)
    with store.transaction() as session:
        offsets = store.offsets.load(session, source.name)
    relabelled: list[str] = []
    for batch in source.read(offsets):
        rejects: list[tuple[RecordKind, str, Reject]] = []
        accepted = _accept(batch, RecordKind.labels, service, config, now, report, rejects)
        labels = label_batch(accepted, service)
        rejects += [(RecordKind.labels, batch.source, r) for r in labels.rejects]
        report.accepted[RecordKind.labels.value] -= len(labels.rejects)
        with store.transaction() as session:
            store.quarantine.add(session, _quarantine_rows(rejects, tick_id, name, now))
            fresh, changed, repeated = store.labels.upsert(session, name, labels.rows, now)
            store.offsets.save(session, source.name, batch.offsets)
        _count_rejects(report, rejects)
        report.labels_new += len(fresh)
        report.labels_changed += len(changed)
        report.labels_repeated += repeated
        relabelled += fresh + changed
    with store.transaction() as session:
        expired = store.labels.expire(session, name, now - service.quality.label_horizon)
        store.quarantine.add(session, _quarantine_rows(
            [(RecordKind.labels, source.name, orphan_reject(e)) for e in expired], tick_id, name, now))
        times = store.labels.prediction_times(session, name, relabelled)
    report.labels_expired += len(expired)
    report.quarantined["orphan_label"] += len(expired)
    if not report.quarantined["orphan_label"]:
        del report.quarantined["orphan_label"]
    return times


def _score_quality(config: Config, service: Service, store: Store, now: datetime, tick_id: int,
                   report: TickReport, labelled_at: list[datetime]) -> None:
    """Score quality for the windows that got labels or predictions this tick, and the last closed ones."""
    sizes = service.quality.windows
    times = list(labelled_at)
    if report.first_ts is not None:
        lo, hi = datetime.fromisoformat(report.first_ts), datetime.fromisoformat(report.last_ts)
        step = min(sizes)
        times += [lo + i * step for i in range(int((hi - lo) / step) + 1)] + [hi]
    windows = windows_holding(times, sizes, now, service.quality.tick_windows)
    scored = score_service(config, service, store, now, windows, tick_id)
    report.quality_windows = len(scored)
    report.quality_findings = sum(len(w.findings) for w in scored)
    report.quality_breaches = [
        f"{w.start:%Y-%m-%d %H:%M}+{_minutes(w.end - w.start)}m {w.model_version} {f.check} "
        f"{describe_labels(f.labels)}: {_num(f.value)} vs {_num(f.baseline)} (n={f.n})"
        for w in scored for f in w.findings if f.status == "breach"
    ]


def _minutes(span: timedelta) -> int:
    return int(span.total_seconds() // 60)


def _count_rejects(report: TickReport, rejects: list) -> None:
    for kind, _, r in rejects:
        report.quarantined[r.reason.value] += 1
        for name in r.field.split(", ") if r.field else ():
            report.quarantined_fields[f"{r.reason.value}:{kind.value}:{name}"] += 1


def _quarantine_rows(rejects: list, tick_id: int, service: str, now: datetime) -> list[dict]:
    return [{"tick_id": tick_id, "service": service, "kind": kind.value, "source": source, "position": r.position,
             "reason": r.reason.value, "excerpt": r.excerpt, "field": r.field, "raw": r.raw, "created_at": now}
            for kind, source, r in rejects]


def _accept(batch: Batch | None, kind: RecordKind, service: Service, config: Config, now: datetime,
            report: TickReport, rejects: list) -> pd.DataFrame:
    """Validate one batch; collect its rejects; return the accepted rows stamped with their arrival."""
    if batch is None:
        return pd.DataFrame()
    report.read[kind.value] += batch.rows_read
    report.events += [f"{batch.file}: {e}" for e in batch.events]
    accepted, bad = check_batch(batch, kind, service.schema_, config.limits, now, getattr(service.sources, kind.value))
    rejects += [(kind, batch.source, r) for r in bad]
    report.accepted[kind.value] += len(accepted)
    accepted[ARRIVED] = pd.Timestamp(now)
    # Small files read together name each row's file; any other batch is one file.
    accepted["_source"] = accepted.pop(FILE).astype(str) if FILE in accepted else batch.file
    return accepted


VERSION_FIELDS = ("model_version", "preprocess_version", "config_hash")


def first_sightings(rows: pd.DataFrame) -> dict[str, dict[str, datetime]]:
    """Per version field, each value's earliest event time in `rows`: what the verdict names as
    'what changed' when a value first appears near an incident's onset."""
    out: dict[str, dict[str, datetime]] = {}
    if not len(rows):
        return out
    ts = rows["ts"] if isinstance(rows["ts"].dtype, pd.DatetimeTZDtype) else pd.to_datetime(rows["ts"], utc=True)
    t = ts.array.asi8  # NaT as the smallest int64: left out below
    timed = ~ts.isna().to_numpy()
    for kind in VERSION_FIELDS:
        if kind in rows:
            # Codes, not a groupby: its copy of the two columns cost as much as the fold's every-row counts.
            column = rows[kind]
            if isinstance(column.dtype, pd.CategoricalDtype):
                codes, values = column.cat.codes.to_numpy(), column.cat.categories
            else:
                codes, values = pd.factorize(column)
            ok = timed & (codes >= 0)
            every = bool(ok.all())
            first = np.full(len(values), np.iinfo(np.int64).max)
            np.minimum.at(first, codes if every else codes[ok], t if every else t[ok])
            seen = np.flatnonzero(first < np.iinfo(np.int64).max)
            if len(seen):
                out[kind] = {str(values[i]): pd.Timestamp(int(first[i]), unit=ts.dtype.unit, tz="UTC").to_pydatetime()
                             for i in seen.tolist()}
    return out


def _concat(a: pd.DataFrame, b: pd.DataFrame | None) -> pd.DataFrame:
    parts = [f for f in (a, b) if f is not None and not f.empty]
    if not parts:
        return a if b is None else (b if a.empty else a)
    return parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)


def _orphan(row: pd.Series) -> Reject:
    from monitor.contract import Reason, excerpt

    text = f'{{"request_id": "{row["request_id"]}", "stage": "{row["stage"]}", "duration_ms": {row["duration_ms"]}}}'
    return Reject(f"{row.get('_source', '')}:{row.get('_line', '?')}", Reason.orphan_timing, excerpt(text))
