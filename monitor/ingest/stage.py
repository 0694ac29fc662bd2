"""The ingest stage: read new rows, enforce the contract, join, fold into bucket partials, store.

Each step (one chunk of predictions and one of timings) commits its quarantine rows, partials, join
buffer and source offsets in one transaction: a crash at any point loses and repeats nothing. A step's
commit does not wait for the disk (`Store.transaction(durable=False)`): an OS crash or power cut may undo
the last steps, offsets included, and they are read again.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
from pandas._libs import hashtable

from monitor.aggregate.cardinality import OTHER, VERSION, Cardinality, Kept
from monitor.aggregate.fold import fold
from monitor.aggregate.partial import merge_bytes
from monitor.aggregate.profile import Profile
from monitor.config import Config, Service
from monitor.contract import Reason, RecordKind, Reject, excerpt
from monitor.ingest.accept import Intake, Rejected, quarantine_rows
from monitor.ingest.frame import (
    ARRIVED,
    Joined,
    combined_hashes,
    concat_remembered,
    forget,
    from_blobs,
    join,
    to_blob,
)
from monitor.ingest.labels import scored_rows
from monitor.ingest.sources import open_source
from monitor.ingest.sources.batch import Batch, Observer
from monitor.ingest.sources.files import DirectorySource
from monitor.ingest.sources.sql import SqlTableSource
from storage.store import Store


@dataclass
class Ingested(Intake):
    """What the ingest stage read, joined and folded in one tick; counts are rows."""

    joined: int = 0  # predictions folded with at least one stage timing
    unmatched: int = 0  # predictions folded without timings (lateness passed)
    orphan_timings: int = 0
    orphans_read_before: int = 0  # of those, timings read by an earlier tick (they waited in the join buffer)
    duplicates: int = 0
    duplicate_timings: int = 0
    pending_predictions: int = 0  # still waiting for timings after this tick
    pending_timings: int = 0
    folded: int = 0  # predictions folded into bucket partials
    buckets: int = 0  # partial rows written (bucket x model_version x segment)
    first_ts: str | None = None  # the earliest and latest event time folded, ISO 8601
    last_ts: str | None = None
    capped: Counter = field(default_factory=Counter)  # rows folded into `<other>`, per capped field
    warnings: list[str] = field(default_factory=list)

    @property
    def span(self) -> tuple[datetime, datetime] | None:
        """The event times folded, earliest and latest; None when nothing was."""
        if self.first_ts is None:
            return None
        return datetime.fromisoformat(self.first_ts), datetime.fromisoformat(self.last_ts)


def ingest(config: Config, service: Service, store: Store, now: datetime, tick_id: int, profile: Profile | None,
           counts: Ingested | None = None, observe: Observer | None = None) -> Ingested:
    """Read `service`'s new predictions and timings, validate, join and fold them on `profile`'s bins, and store
    each step with its offsets. `counts` (returned) is filled as steps commit: a caller still has the counts
    of the steps stored when a later one raises. `observe` is told the rows read of both sources and the
    rows in all (estimated, then exact at the end), from the reading threads."""
    counts = Ingested() if counts is None else counts
    name = service.name
    pred_source = open_source(f"{name}/predictions", service.sources.predictions, config.limits)
    time_source = (open_source(f"{name}/timings", service.sources.timings, config.limits)
                   if service.sources.timings is not None else None)
    with store.transaction() as session:
        pred_offsets = store.offsets.load(session, pred_source.name)
        time_offsets = store.offsets.load(session, time_source.name) if time_source else {}
        pending_p = from_blobs(store.pending.load(session, name, RecordKind.predictions.value))
        pending_t = from_blobs(store.pending.load(session, name, RecordKind.timings.value))
        folded = (_Remembered(store.pending.load_each(session, name, FOLDED), now, service.join.lateness)
                  if time_source else None)
        # The versions and segment values of the partials the longest window reaches keep their own name.
        limits = config.limits
        caps = Cardinality(limits.max_versions, limits.max_stages, limits.max_segment_values,
                           store.partials.keys_since(session, name, now - max(service.buckets.windows)))

    reads = _Sum(observe, 2 if time_source else 1) if observe is not None else None
    pred_batches = _read_ahead(pred_source, pred_offsets, reads and reads.part(0))
    time_batches = _read_ahead(time_source, time_offsets, reads and reads.part(1)) if time_source else iter(())
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
            rejects: list[Rejected] = []
            new_p = counts.accept(pb, RecordKind.predictions, service, config, now, rejects)
            new_t = counts.accept(tb, RecordKind.timings, service, config, now, rejects) if timed else None
            # A row repeating one read earlier in this tick (another file, another chunk) is a duplicate as
            # one repeating a waiting row is: the first wins. Rows that left the buffer are not in it.
            new_p, dropped = seen_p.drop_seen(new_p)
            counts.duplicates += dropped
            if timed:
                new_t, dropped = seen_t.drop_seen(new_t)
                counts.duplicate_timings += dropped
            joined = join(_concat(pending_p, new_p), _concat(pending_t, new_t) if timed else None, now,
                          service.join.lateness, expire=final, folded=folded.rows if folded else None,
                          segments=tuple(service.schema_.segments))
            pending_p, pending_t = joined.pending_predictions, joined.pending_timings
            if folded is not None:
                folded.add(joined.remember)
            for _, row in joined.orphans.iterrows():
                rejects.append((RecordKind.timings, row.get("_source", ""), _orphan(row)))
            for _, row in joined.late_timings.iterrows():
                rejects.append((RecordKind.timings, row.get("_source", ""), _orphan(row, Reason.late_timing)))
            # Admitted here, step by step in order, so which values keep their own name does not depend on
            # which fold worker runs first.
            segments = service.schema_.segments
            kept = caps.admit(joined.ready, segments), caps.admit(joined.late, segments, count=False)
            step = _Step(pb, tb, rejects, joined, new_p, final,
                         folder.submit(_fold_step, joined.ready, joined.late, service, timed, profile, kept))
            if previous is not None:
                _commit(previous, service, store, now, tick_id, counts, pred_source, time_source, folded)
            previous = step
        _commit(previous, service, store, now, tick_id, counts, pred_source, time_source, folded)
    finally:
        folder.shutdown(wait=True, cancel_futures=True)
    counts.pending_predictions, counts.pending_timings = len(pending_p), len(pending_t)
    counts.capped.update(caps.other)
    if said := caps.warning():
        counts.warnings.append(said)
    return counts


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
FOLDED = "folded"  # the join buffer kind of the requests folded with timings (frame.join's `folded`)


class _Remembered:
    """The requests folded with timings that a later timing may still join (frame.join's `folded`), and the
    stored blobs holding them: each step keeps its new rows in a blob of its own (a step writes what it read,
    not the whole memory), and the last step of a tick removes the blobs whose every row is forgotten."""

    def __init__(self, blobs: list[tuple[int, bytes]], now: datetime, lateness: timedelta) -> None:
        self.now, self.lateness = now, lateness
        self.blobs: list[tuple[int, pd.Timestamp | None]] = []  # (id, the latest arrival it holds)
        frames = []
        for blob_id, blob in blobs:
            rows = from_blobs([blob])
            self.blobs.append((blob_id, rows[ARRIVED].max() if len(rows) else None))
            frames.append(forget(rows, now, lateness))
        self.rows = concat_remembered(frames)

    def add(self, rows: pd.DataFrame) -> None:
        if len(rows):
            self.rows = concat_remembered([self.rows, rows])

    def save(self, session, store: Store, service: str, rows: pd.DataFrame, final: bool) -> None:
        """Store one step's new rows (those a later tick can still use); on the last step, remove the
        blobs a later tick has no use for."""
        kept = forget(rows, self.now, self.lateness)
        if len(kept):
            self.blobs.append((store.pending.add(session, service, FOLDED, to_blob(kept), len(kept)),
                               kept[ARRIVED].max()))
        if final:
            cutoff = pd.Timestamp(self.now) - 2 * self.lateness
            gone = {i for i, latest in self.blobs if latest is None or latest <= cutoff}
            store.pending.remove(session, gone)
            self.blobs = [(i, latest) for i, latest in self.blobs if i not in gone]


@dataclass
class _Step:
    """One step of a tick: what it read, its rejects and join, and its fold (running on a worker)."""

    pb: Batch | None
    tb: Batch | None
    rejects: list[Rejected]
    joined: Joined
    new_p: pd.DataFrame
    final: bool  # the tick's last step
    folded: Future  # (partials, first sightings)


def _fold_step(ready: pd.DataFrame, late: pd.DataFrame, service: Service, timed: bool,
               profile: Profile | None, kept: tuple[Kept, Kept]) -> tuple[list, dict]:
    partials = fold(ready, service.buckets.size, service.schema_.segments, timed=timed, schema=service.schema_,
                    profile=profile, deadline_ms=service.deadline_ms, kept=kept[0])
    # Timings that joined a request folded before: its bucket's partials take them, not the request again.
    partials += fold(late, service.buckets.size, service.schema_.segments, timed=timed, only_stages=True,
                     kept=kept[1])
    sightings = first_sightings(ready)
    if kept[0].versions is not None and VERSION in sightings:  # the versions folded, `<other>` for the rest
        seen = sightings[VERSION]
        other = [t for v, t in seen.items() if v not in kept[0].versions]
        sightings[VERSION] = {v: t for v, t in seen.items() if v in kept[0].versions}
        if other:
            sightings[VERSION][OTHER] = min(other)
    return partials, sightings


def _commit(step: _Step, service: Service, store: Store, now: datetime, tick_id: int, counts: Ingested,
            pred_source, time_source, folded: _Remembered | None) -> None:
    """Store one step's quarantine, partials, waiting rows and offsets in one transaction; count it."""
    name, joined, ready = service.name, step.joined, step.joined.ready
    partials, sightings = step.folded.result()
    # Not durable: waiting for the disk at every step was the largest fixed cost of a small tick. An OS
    # crash can only undo whole steps, offsets with their results, which are then read again; the
    # durable commit of `ticks.finish` syncs the steps before it.
    with store.transaction(durable=False) as session:
        store.quarantine.add(session, quarantine_rows(step.rejects, tick_id, name, now))
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
        if folded is not None:
            folded.save(session, store, name, joined.remember, step.final)
        if step.pb is not None:
            store.offsets.save(session, pred_source.name, step.pb.offsets)
        if step.tb is not None:
            store.offsets.save(session, time_source.name, step.tb.offsets)

    counts.count(step.rejects)
    counts.orphan_timings += len(joined.orphans)
    for let_go in (joined.orphans, joined.late_timings):
        if len(let_go):
            counts.orphans_read_before += int((let_go[ARRIVED] < pd.Timestamp(now)).sum())
    counts.duplicates += joined.duplicates
    counts.duplicate_timings += joined.duplicate_timings
    counts.folded += len(ready)
    counts.buckets += len(partials)
    if len(ready) and time_source:
        counts.joined += int(ready["joined"].sum())
        counts.unmatched += int((~ready["joined"]).sum())
    # The buckets late timings changed are touched too: their windows are scored again.
    touched = [f["ts"] for f in (ready, joined.late) if len(f)]
    if touched:
        lo, hi = min(t.min() for t in touched).isoformat(), max(t.max() for t in touched).isoformat()
        counts.first_ts = min(counts.first_ts or lo, lo)
        counts.last_ts = max(counts.last_ts or hi, hi)


class _Sum:
    """Several reads' observers as one: their rows read summed, and their rows in all once each knows its own."""

    def __init__(self, observe: Observer, parts: int):
        self.observe, self.lock = observe, threading.Lock()
        self.done: list[int] = [0] * parts
        self.total: list[int | None] = [None] * parts

    def part(self, i: int) -> Observer:
        def told(done: int, total: int | None) -> None:
            with self.lock:  # the reads run on threads of their own; the sums go out in order
                self.done[i], self.total[i] = done, total
                self.observe(sum(self.done), None if None in self.total else sum(self.total))
        return told


def _read_ahead(source: DirectorySource | SqlTableSource, offsets: dict,
                observe: Observer | None = None) -> Iterator[Batch]:
    """`source.read(offsets)`; for files, the next batch is parsed on a worker thread while the caller
    validates, folds and commits this one (pyarrow releases the GIL while it parses), one batch ahead at most.

    Nothing is committed ahead: offsets still go with each batch's results, so a crash loses and repeats
    nothing. SQL tables are read in order on the caller's thread (their connection may share a database
    file with the store).
    """
    batches = source.read(offsets, observe)
    if not isinstance(source, DirectorySource):
        yield from batches
        return
    with ThreadPoolExecutor(1, thread_name_prefix="tailwatch-read") as pool:
        ahead = pool.submit(next, batches, None)
        while (batch := ahead.result()) is not None:
            ahead = pool.submit(next, batches, None)
            yield batch


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


def _orphan(row: pd.Series, reason: Reason = Reason.orphan_timing) -> Reject:
    """The reject of a timing no prediction took; a late one names `request_id`, whose request had closed."""
    text = f'{{"request_id": "{row["request_id"]}", "stage": "{row["stage"]}", "duration_ms": {row["duration_ms"]}}}'
    return Reject(f"{row.get('_source', '')}:{row.get('_line', '?')}", reason, excerpt(text),
                  "request_id" if reason == Reason.late_timing else None)
