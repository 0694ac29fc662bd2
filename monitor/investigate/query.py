"""Read-only queries over stored results, as pandas DataFrames (for notebooks; the CLI prints them).

Every filter is a bound parameter or a SQLAlchemy expression: no SQL text is built from user input.
Times are UTC-aware; a range [since, until) selects by window start (findings, verdicts), bucket start
(metrics), the tick's clock (ticks), the quarantine time, or the incident's opening.
"""

from __future__ import annotations

import math
import re
import sqlite3
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

import numpy as np
import pandas as pd
from sqlalchemy import func, select

from checks.latency import QUANTILES
from monitor.aggregate import codec, keys
from monitor.aggregate.keys import LATENCY, STAGE_PREFIX
from monitor.aggregate.partial import ALL, Partial, merge_all
from monitor.aggregate.sketch import Sketch
from storage import models
from storage.models import BucketPartial, FindingRow, Incident, QuarantineRow, Tick, VerdictRow, dumps
from storage.store import SQL_READER_ROLE, Store, StoreError, utc

SIGNAL_PREFIX = keys.signal("")
FINDING_COLUMNS = ("id", "check", "status", "window_start", "window_end", "model_version", "labels", "value",
                   "baseline", "effect", "n", "interval_low", "interval_high", "p_value", "detail")
SQL_MAX_ROWS = 10_000
SQL_TIMEOUT_S = 30
SQLITE_PROGRESS_STEPS = 10_000  # SQLite VM instructions between two looks at the clock: well under 1 ms
# First words of the statements `sql` accepts; the read-only connection is what enforces it.
READ_ONLY_VERBS = ("select", "with", "values", "explain", "table", "show")


class QueryError(ValueError):
    """A query that cannot run as asked; the message says what to change."""


# -- helpers --------------------------------------------------------------------------------------

def _range(column, since: datetime | None, until: datetime | None) -> list:
    out = []
    if since is not None:
        out.append(column >= utc(since))
    if until is not None:
        out.append(column < utc(until))
    return out


def _label_filters(column, labels: dict[str, Any] | None) -> list:
    """LIKE filters on the canonical labels JSON (`"key":"value"`, escaped); exact match is re-checked."""
    return [column.contains(dumps({k: v})[1:-1], autoescape=True) for k, v in (labels or {}).items()]


def _has_labels(row_labels: dict | None, wanted: dict[str, Any] | None) -> bool:
    row_labels = row_labels or {}
    return all(k in row_labels and str(row_labels[k]) == str(v) for k, v in (wanted or {}).items())


def _segment_ok(row_labels: dict | None, segment: str | None) -> bool:
    """segment None: any; '' or 'all': all traffic only (no segment label); else that segment."""
    if segment is None:
        return True
    own = (row_labels or {}).get("segment")
    return own is None if segment in ("", "all") else own == segment


# -- findings -------------------------------------------------------------------------------------

def findings(store: Store, service: str, *, since: datetime | None = None, until: datetime | None = None,
             model_version: str | None = None, check: str | None = None, status: str | None = None,
             labels: dict[str, Any] | None = None, segment: str | None = None,
             window: timedelta | None = None, detail: bool = False) -> pd.DataFrame:
    """Stored findings with window_start in [since, until), oldest first; columns FINDING_COLUMNS.

    `labels`: every key must hold that value; `segment`: '' / 'all' for all traffic, a segment label
    such as 'Contract=Two year', or None for both; `window`: only windows of that length; `detail`: also
    read each finding's detail document (histograms and the like: the costly part), else it is None."""
    names = [n for n in FINDING_COLUMNS if n != "detail" or detail]
    # Columns, not ORM objects: a month of findings is a million rows and the detail JSON is the bulk.
    query = select(*(getattr(FindingRow, n) for n in names)).where(
        FindingRow.service == service, *_range(FindingRow.window_start, since, until),
        *_label_filters(FindingRow.labels_key, labels))
    if model_version is not None:
        query = query.where(FindingRow.model_version == model_version)
    if check is not None:
        query = query.where(FindingRow.check == check)
    if status is not None:
        query = query.where(FindingRow.status == status)
    query = query.order_by(FindingRow.window_start, FindingRow.window_end, FindingRow.check,
                           FindingRow.model_version, FindingRow.labels_key)
    rows = []
    with store.transaction() as session:
        for values in session.execute(query):
            row = dict(zip(names, values, strict=True))
            if not _has_labels(row["labels"], labels) or not _segment_ok(row["labels"], segment):
                continue
            if window is not None and row["window_end"] - row["window_start"] != window:
                continue
            rows.append(row)
    frame = pd.DataFrame(rows, columns=names)
    if not detail:
        frame["detail"] = None
    return _utc_columns(frame[list(FINDING_COLUMNS)], ("window_start", "window_end"))


def group_findings(frame: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Findings counted per group: `by` names finding columns or label keys (`stage`, `segment`...).

    Columns: the group keys, windows, breaches, insufficient, first_window, last_window, max_value."""
    if frame.empty:
        return pd.DataFrame(columns=[*by, "windows", "breaches", "insufficient", "first_window",
                                     "last_window", "max_value"])
    keyed = frame.copy()
    for key in by:
        if key not in keyed.columns:
            keyed[key] = [str((lab or {}).get(key, "")) for lab in keyed["labels"]]
        elif key == "labels":
            keyed[key] = [",".join(f"{k}={v}" for k, v in sorted((lab or {}).items())) for lab in keyed[key]]
    grouped = keyed.groupby(list(by), dropna=False, sort=True)
    out = grouped.agg(windows=("status", "size"),
                      breaches=("status", lambda s: int((s == "breach").sum())),
                      insufficient=("status", lambda s: int((s == "insufficient").sum())),
                      first_window=("window_start", "min"), last_window=("window_start", "max"),
                      max_value=("value", "max"))
    return out.reset_index().sort_values(["breaches", "windows"], ascending=False, kind="stable",
                                         ignore_index=True)


# -- metrics from the bucket partials ---------------------------------------------------------------

def metrics(store: Store, service: str, *, since: datetime, until: datetime, model_version: str | None = None,
            segment: str = ALL, every: timedelta | None = None,
            group_by: Sequence[str] = ("model_version",), bucket_seconds: int | None = None) -> pd.DataFrame:
    """Per period of `every` (None: the whole range) and group, the merged bucket partials as columns:
    period_start, period_end (longer than `every` where compacted buckets span several periods), requests, status counts and rates, latency quantiles in ms (total and per stage), cache hit rate,
    mean and p95 of each service signal. `segment`: '' (or 'all') all traffic, a segment label, or '*'
    every segment but all traffic; `group_by` picks among model_version and segment."""
    unknown = set(group_by) - {"model_version", "segment"}
    if unknown:
        raise QueryError(f"metrics group by: unknown {sorted(unknown)}; use model_version and/or segment")
    groups = merged_partials(store, service, since=since, until=until, model_version=model_version,
                             segment=segment, every=every, group_by=group_by, bucket_seconds=bucket_seconds,
                             health_only=True)
    rows = [{**key, **partial_metrics(part)} for key, part in groups]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=["period_start", "period_end", *group_by, "requests"])
    return _utc_columns(frame, ("period_start", "period_end"))


def merged_partials(store: Store, service: str, *, since: datetime, until: datetime,
                    model_version: str | None = None, segment: str | None = ALL,
                    every: timedelta | None = None, group_by: Sequence[str] = ("model_version",),
                    bucket_seconds: int | None = None, health_only: bool = False
                    ) -> list[tuple[dict[str, Any], Partial]]:
    """The stored partials with bucket_start in [since, until) merged per (period of `every`, group); keys
    hold period_start (since when `every` is None), period_end and the `group_by` columns. Sorted by key.

    Buckets of several sizes (history compacted by retention) are read together: where a coarse bucket
    spans several periods of `every`, those periods are read as one (period_end says how far it reaches),
    so nothing is split or counted twice. `health_only`: only the counts and sketches (what
    partial_metrics reads), decoded without the histograms: several times faster."""
    since, until = utc(since), utc(until)
    step = every.total_seconds() if every is not None else None
    if step is not None and step <= 0:
        raise QueryError(f"every must be positive, got {every}")
    query = select(BucketPartial.model_version, BucketPartial.bucket_start, BucketPartial.bucket_seconds,
                   BucketPartial.segment, BucketPartial.payload).where(
        BucketPartial.service == service, *_range(BucketPartial.bucket_start, since, until))
    if model_version is not None:
        query = query.where(BucketPartial.model_version == model_version)
    if segment == "*":
        query = query.where(BucketPartial.segment != ALL)
    elif segment is not None:
        query = query.where(BucketPartial.segment == (ALL if segment == "all" else segment))
    if bucket_seconds is not None:
        query = query.where(BucketPartial.bucket_seconds == bucket_seconds)
    with store.transaction() as session:
        rows = [(version, utc(start), int(size), seg, payload)
                for version, start, size, seg, payload in session.execute(query)]
    periods = _periods(since, until, step, [(start, size) for _, start, size, _, _ in rows])
    parts: dict[tuple, Any] = defaultdict(_HealthSum if health_only else list)
    for version, start, size, seg, payload in rows:
        key = (periods[(start, size)],) + tuple(version if g == "model_version" else seg for g in group_by)
        if health_only:
            parts[key].add(payload)
        else:
            parts[key].append(Partial.from_bytes(payload))
    out = []
    for key in sorted(parts):
        (first, last) = key[0]
        named = {"period_start": first, "period_end": last, **dict(zip(group_by, key[1:], strict=True))}
        out.append((named, parts[key].partial() if health_only else merge_all(parts[key])))
    return out


def _periods(since: datetime, until: datetime, step: float | None, buckets: Sequence[tuple[datetime, int]]
             ) -> dict[tuple[datetime, int], tuple[datetime, datetime]]:
    """(bucket start, bucket seconds) -> the (start, end) of the period it is read in: the periods of `step`
    seconds from `since` (one period from `since` when None), joined wherever a bucket runs over a period's
    end. A period ends at the next period's start or, the last one, at `until` or its last bucket's end."""
    if not buckets:
        return {}

    def reach(start: datetime, size: int) -> datetime:
        return start + timedelta(seconds=size)

    if step is None:
        end = max(until, *(reach(*b) for b in buckets))
        return dict.fromkeys(buckets, (since, end))
    spans = []
    for start, size in set(buckets):
        offset = (start - since).total_seconds()
        first = int(offset // step)
        spans.append((first, max(first, math.ceil((offset + size) / step) - 1), start, size))
    spans.sort()
    runs: list[list] = []  # [first index, last index, latest bucket end, buckets]
    for first, last, start, size in spans:
        if not runs or first > runs[-1][1]:
            runs.append([first, last, reach(start, size), []])
        run = runs[-1]
        run[1], run[2] = max(run[1], last), max(run[2], reach(start, size))
        run[3].append((start, size))
    out = {}
    for first, last, latest, members in runs:
        period = (since + timedelta(seconds=first * step),
                  min(since + timedelta(seconds=(last + 1) * step), max(until, latest)))
        out.update(dict.fromkeys(members, period))
    return out


# Sketches and counts partial_metrics reads; the others (latency by length or replica, arrival times) are
# left unmerged by metrics: their bins are most of a partial.
BINCOUNT_SPAN = 1 << 16  # key ranges up to this wide are summed with bincount
HEALTH_COUNTS = (keys.ROWS, keys.STAGE_ROWS, keys.OK, keys.TIMEOUT, keys.REJECTED, keys.ERROR,
                 keys.cache_hit(), keys.cache_miss())


def _health_sketch(name: str) -> bool:
    return name == LATENCY or name.startswith((STAGE_PREFIX, SIGNAL_PREFIX))


class _HealthSum:
    """merge_all of what partial_metrics reads (HEALTH_COUNTS and the latency, stage and signal sketches),
    straight from serialized partials: histograms are skipped unread, and the sketch bins of every partial
    are gathered and added with numpy once at the end (decoding each partial whole took 0.4 ms)."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.values: list[np.ndarray] = []  # per partial: its sketch bins, as stored
        self.size = 0  # values held so far
        # name -> flat rows of (start in the concatenated values, npos, nneg, zero, count) and of
        # (sum, sumsq, min, max): one pair of lists per sketch, turned into arrays at the end
        self.ints: dict[str, list[int]] = defaultdict(list)
        self.floats: dict[str, list[float]] = defaultdict(list)
        self.wanted: dict[str, bool] = {}

    def add(self, payload: bytes) -> None:
        layout = codec.read_binary(payload)
        if layout is None:  # a JSON payload, stored before the binary form or past int64
            self._add_partial(Partial.from_bytes(payload))
            return
        head = layout.head
        values = layout.ints[sum(bins for _, bins in head["hists"]):]
        counts, own = head["counts"], self.counts
        for key in HEALTH_COUNTS:
            if key in counts:
                own[key] += counts[key]
        i, base, wanted = 0, self.size, self.wanted
        for j, row in enumerate(head["sketches"]):
            name, npos, nneg = row[0], row[1], row[2]
            keep = wanted.get(name)
            if keep is None:
                keep = wanted[name] = _health_sketch(name)
            if keep and row[4]:
                self.ints[name].extend((base + i, npos, nneg, row[3], row[4]))
                self.floats[name].extend(layout.sketch_floats(j))
            i += 2 * (npos + nneg)
        self.values.append(values)
        self.size += len(values)

    def _add_partial(self, part: Partial) -> None:
        for key in HEALTH_COUNTS:
            self.counts[key] += part.counts[key]
        for name, s in part.sketches.items():
            if _health_sketch(name) and s.count:
                bins = [_ints(m) for m in (s.pos, s.pos.values(), s.neg, s.neg.values())]
                self.ints[name].extend((self.size, len(s.pos), len(s.neg), s.zero, s.count))
                self.floats[name].extend((s.sum, s.sumsq, s.min, s.max))
                self.values.append(np.concatenate(bins))
                self.size += len(self.values[-1])

    def partial(self) -> Partial:
        """The merged Partial: HEALTH_COUNTS and the health sketches (no histograms or unseen values)."""
        values = np.concatenate(self.values) if self.values else np.zeros(0, "int64")
        sketches = {}
        for name, ints in self.ints.items():
            start, npos, nneg, zero, count = np.array(ints, dtype="int64").reshape(-1, 5).T
            total, squares, lo, hi = np.array(self.floats[name], dtype="float64").reshape(-1, 4).T
            pos = _add_bins(values, start, npos, start + npos)
            neg = _add_bins(values, start + 2 * npos, nneg, start + 2 * npos + nneg)
            # cumsum adds in order, as merge_all's running sum does: the float sums are the same to the bit.
            sketches[name] = Sketch(pos, neg, int(zero.sum()), int(count.sum()), float(np.cumsum(total)[-1]),
                                    float(np.cumsum(squares)[-1]), float(lo.min()), float(hi.max()))
        return Partial(Counter({k: v for k, v in self.counts.items() if v > 0}), {}, sketches)


def _ints(values: Iterable[int]) -> np.ndarray:
    """Integers as an int64 array, or an object array when one is past int64 (JSON payloads hold those)."""
    out = np.array(list(values))
    return out if out.size else np.zeros(0, "int64")


def _add_bins(values: np.ndarray, keys_at: np.ndarray, lengths: np.ndarray, counts_at: np.ndarray
              ) -> dict[int, int]:
    """The key-wise sum of the bin maps whose keys are values[keys_at[i]:keys_at[i] + lengths[i]] and
    counts as long from counts_at[i]; exact (Python ints past int64's reach)."""
    total = int(lengths.sum())
    if not total:
        return {}
    # Every position of every range at once: its range's start plus its rank inside the range.
    within = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    k = values[np.repeat(keys_at, lengths) + within]
    c = values[np.repeat(counts_at, lengths) + within]
    if values.dtype == object or int(c.max()) >= 2**52 // total:  # past int64, or float64's exact integers
        out: dict[int, int] = {}
        for key, n in zip(k.tolist(), c.tolist(), strict=True):
            out[key] = out.get(key, 0) + n
        return out
    k, c = k.astype("int64"), c.astype("int64")
    low, high = int(k.min()), int(k.max())
    if high - low < BINCOUNT_SPAN:  # sketch keys are a few hundred apart: a dense sum beats a sort
        sums = np.bincount(k - low, weights=c, minlength=high - low + 1)  # exact: every sum below 2**52
        hit = np.flatnonzero(np.bincount(k - low, minlength=high - low + 1))
        return dict(zip((hit + low).tolist(), sums[hit].astype("int64").tolist(), strict=True))
    order = np.argsort(k, kind="stable")
    k, c = k[order], c[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    return dict(zip(k[starts].tolist(), np.add.reduceat(c, starts).tolist(), strict=True))


def partial_metrics(part: Partial) -> dict[str, Any]:
    """What a merged partial says about service health: counts, rates (0..1), quantiles (ms), signals."""
    c = part.counts
    n = part.rows
    out: dict[str, Any] = {"requests": n}
    for status in ("ok", "timeout", "rejected", "error"):
        out[status] = c[keys.status(status)]
    for name, key in (("error_rate", keys.ERROR), ("timeout_rate", keys.TIMEOUT),
                      ("reject_rate", keys.REJECTED)):
        out[name] = c[key] / n if n else None
    lookups = c[keys.cache_hit()] + c[keys.cache_miss()]
    out["cache_hit_rate"] = c[keys.cache_hit()] / lookups if lookups else None
    for key in sorted(part.sketches):
        sketch = part.sketches[key]
        if key == LATENCY or key.startswith(STAGE_PREFIX):
            stage = "total" if key == LATENCY else key.removeprefix(STAGE_PREFIX)
            for label, q in QUANTILES.items():
                out[f"{stage}_{label}_ms"] = sketch.quantile(q)
        elif key.startswith(SIGNAL_PREFIX):
            name = key.removeprefix(SIGNAL_PREFIX)
            out[f"{name}_mean"] = sketch.mean
            out[f"{name}_p95"] = sketch.quantile(0.95)
    return out


# -- ticks and quarantine -------------------------------------------------------------------------

TICK_COLUMNS = ("id", "now", "started_at", "finished_at", "status", "rows_read", "accepted", "quarantined",
                "joined", "unmatched", "duplicates", "findings", "seconds", "error")


def ticks(store: Store, service: str, *, since: datetime | None = None, until: datetime | None = None,
          status: str | None = None, limit: int | None = None) -> pd.DataFrame:
    """Ticks whose clock (`now`) is in [since, until), oldest first (the newest `limit` when given)."""
    query = select(Tick).where(Tick.service == service, *_range(Tick.now, since, until))
    if status is not None:
        query = query.where(Tick.status == status)
    query = query.order_by(Tick.id.desc())
    if limit is not None:
        query = query.limit(limit)
    rows = []
    with store.transaction() as session:
        for t in session.scalars(query):
            summary = t.summary if isinstance(t.summary, dict) else {}
            rows.append({"id": t.id, "now": t.now, "started_at": t.started_at, "finished_at": t.finished_at,
                         "status": t.status, "rows_read": t.rows_read, "accepted": t.accepted,
                         "quarantined": t.quarantined, "joined": t.joined, "unmatched": t.unmatched,
                         "duplicates": t.duplicates, "findings": summary.get("findings"),
                         "seconds": summary.get("seconds"), "error": summary.get("error")})
    frame = pd.DataFrame(rows[::-1], columns=list(TICK_COLUMNS))
    return _utc_columns(frame, ("now", "started_at", "finished_at"))


QUARANTINE_COLUMNS = ("id", "tick_id", "created_at", "kind", "source", "position", "reason", "excerpt")


def quarantine(store: Store, service: str, *, since: datetime | None = None, until: datetime | None = None,
               reason: str | None = None, kind: str | None = None, group_by: Sequence[str] = (),
               limit: int | None = None) -> pd.DataFrame:
    """Quarantined rows quarantined in [since, until), oldest first; with `group_by` (reason, kind,
    source, tick_id) the row count per group instead, largest first."""
    filters = [QuarantineRow.service == service, *_range(QuarantineRow.created_at, since, until)]
    if reason is not None:
        filters.append(QuarantineRow.reason == reason)
    if kind is not None:
        filters.append(QuarantineRow.kind == kind)
    if group_by:
        allowed = {"reason", "kind", "source", "tick_id"}
        if set(group_by) - allowed:
            raise QueryError(f"quarantine group by: unknown {sorted(set(group_by) - allowed)}; "
                             f"use {sorted(allowed)}")
        cols = [getattr(QuarantineRow, g) for g in group_by]
        query = (select(*cols, func.count().label("rows"), func.min(QuarantineRow.created_at),
                        func.max(QuarantineRow.created_at))
                 .where(*filters).group_by(*cols).order_by(func.count().desc()))
        with store.transaction() as session:
            data = [(*r[:-2], models.UTCDateTime().process_result_value(r[-2], None),
                     models.UTCDateTime().process_result_value(r[-1], None))
                    for r in session.execute(query).all()]
        frame = pd.DataFrame(data, columns=[*group_by, "rows", "first", "last"])
        return _utc_columns(frame, ("first", "last"))
    query = select(QuarantineRow).where(*filters).order_by(QuarantineRow.id)
    if limit is not None:
        query = query.limit(limit)
    with store.transaction() as session:
        rows = [{c: getattr(q, c) for c in QUARANTINE_COLUMNS} for q in session.scalars(query)]
    return _utc_columns(pd.DataFrame(rows, columns=list(QUARANTINE_COLUMNS)), ("created_at",))


# -- verdicts and incidents -----------------------------------------------------

VERDICT_COLUMNS = ("id", "verdict", "window_start", "window_end", "model_version", "estimated", "rows",
                   "evidence", "attribution", "what_changed", "next_steps", "rollback_to", "summary",
                   "incident_id", "created_at")
INCIDENT_COLUMNS = ("id", "verdict", "status", "model_version", "opened_at", "resolved_at",
                    "first_window_start", "last_window_end", "fingerprint", "summary")


def verdicts(store: Store, service: str, *, since: datetime | None = None, until: datetime | None = None,
             model_version: str | None = None, verdict: str | None = None,
             incident_id: int | None = None) -> pd.DataFrame:
    """Stored verdicts with window_start in [since, until), oldest first; columns VERDICT_COLUMNS."""
    model = VerdictRow
    query = select(model).where(model.service == service, *_range(model.window_start, since, until))
    if model_version is not None:
        query = query.where(model.model_version == model_version)
    if verdict is not None:
        query = query.where(model.verdict == verdict)
    if incident_id is not None:
        query = query.where(model.incident_id == incident_id)
    query = query.order_by(model.window_start, model.window_end, model.model_version, model.id)
    with store.transaction() as session:
        rows = [{c: getattr(v, c, None) for c in VERDICT_COLUMNS} for v in session.scalars(query)]
    frame = pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))
    return _utc_columns(frame, ("window_start", "window_end", "created_at"))


def incidents(store: Store, service: str, *, since: datetime | None = None, until: datetime | None = None,
              model_version: str | None = None, status: str | None = None,
              incident_id: int | None = None) -> pd.DataFrame:
    """Stored incidents opened in [since, until), oldest first; columns INCIDENT_COLUMNS."""
    model = Incident
    query = select(model).where(model.service == service, *_range(model.opened_at, since, until))
    if model_version is not None:
        query = query.where(model.model_version == model_version)
    if status is not None:
        query = query.where(model.status == status)
    if incident_id is not None:
        query = query.where(model.id == incident_id)
    with store.transaction() as session:
        rows = [{c: getattr(i, c, None) for c in INCIDENT_COLUMNS}
                for i in session.scalars(query.order_by(model.opened_at, model.id))]
    frame = pd.DataFrame(rows, columns=list(INCIDENT_COLUMNS))
    return _utc_columns(frame, ("opened_at", "resolved_at", "first_window_start", "last_window_end"))


# -- read-only SQL ---------------------------------------------------------------------------------

# The only things a statement may do on SQLite: read tables and call functions (sqlite3 authorizer).
_SQLITE_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                   getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
_LEADING_COMMENTS = re.compile(r"^\s*(?:(?:--[^\n]*\n)|(?:/\*.*?\*/)|\s)*", re.S)


def sql(store: Store, statement: str, *, max_rows: int = SQL_MAX_ROWS, role: str = SQL_READER_ROLE,
        password: str | None = None, timeout: float | None = None) -> pd.DataFrame:
    """Run one read-only SQL statement and return its rows (at most `max_rows`, else QueryError); one
    that runs longer than `timeout` seconds (default SQL_TIMEOUT_S) is stopped (QueryError).

    SQLite: a separate `mode=ro` connection with `PRAGMA query_only`, an authorizer that allows reads
    only, and a progress handler that interrupts the statement at the time limit. PostgreSQL: a new
    connection as `role` (with `password`), refused when that role is a superuser, can run server
    functions or signal other backends, or can write tailwatch's tables; then a `READ ONLY` transaction
    with `statement_timeout`, always rolled back, the statement prepared server-side (which refuses
    several statements in one string). Writes, DDL and multi-statement strings raise QueryError;
    nothing is changed."""
    text = statement.strip()
    body = _LEADING_COMMENTS.sub("", text)
    verb = body.split(None, 1)[0].lower() if body else ""
    if verb not in READ_ONLY_VERBS:
        raise QueryError(f"only read statements run here ({', '.join(READ_ONLY_VERBS).upper()}); "
                         f"got {verb.upper() or 'nothing'}")
    backend = store.url.get_backend_name()
    timeout = SQL_TIMEOUT_S if timeout is None else timeout
    if backend == "sqlite":
        columns, rows = _sqlite_read(store, text, max_rows, timeout)
    elif backend == "postgresql":
        columns, rows = _postgres_read(store, text, max_rows, role, password, timeout)
    else:
        raise QueryError(f"read-only SQL is supported on SQLite and PostgreSQL, not {backend}")
    return pd.DataFrame(rows, columns=columns)


def _stopped(timeout: float) -> QueryError:
    return QueryError(f"stopped at the time limit of {timeout:g} s (storage.query_sql.timeout); "
                      "add a LIMIT, a narrower WHERE or a bound on the recursion")


def _sqlite_read(store: Store, text: str, max_rows: int, timeout: float = SQL_TIMEOUT_S,
                 ) -> tuple[list[str], list[tuple]]:
    database = store.url.database or ""
    if not database or database == ":memory:" or database.startswith("file:"):
        raise QueryError("read-only SQL needs a SQLite database file")
    conn = sqlite3.connect(f"file:{quote(database)}?mode=ro", uri=True, timeout=timeout)
    try:
        conn.execute("PRAGMA query_only = ON")

        def authorize(action: int, *_args: Any) -> int:
            return sqlite3.SQLITE_OK if action in _SQLITE_ALLOWED else sqlite3.SQLITE_DENY

        conn.set_authorizer(authorize)
        deadline = time.monotonic() + timeout
        expired = []

        def progress() -> int:
            # A non-zero return interrupts the running statement (the busy timeout bounds only lock waits).
            if time.monotonic() < deadline:
                return 0
            expired.append(True)
            return 1

        conn.set_progress_handler(progress, SQLITE_PROGRESS_STEPS)
        try:
            cursor = conn.execute(text)
            rows = cursor.fetchmany(max_rows + 1)
        except (sqlite3.Error, sqlite3.Warning) as exc:  # one statement at a time is a Warning before 3.12
            if expired:
                raise _stopped(timeout) from None
            raise QueryError(f"refused or failed: {exc}") from None
        columns = [d[0] for d in cursor.description or ()]
    finally:
        conn.close()
    return columns, _capped(rows, max_rows)


# Roles whose members can read or write server files, run programs or signal other backends (kill the
# daemon's connections); a role that is a member of a superuser or of another login role can signal its
# backends too.
_POWER_ROLES = ["pg_signal_backend", "pg_read_server_files", "pg_write_server_files", "pg_execute_server_program"]
# What the connected role may do beyond reading: a superuser or CREATEROLE; roles it is a member of; the
# functions it may execute whose ACL denies PUBLIC (pg_read_file, pg_ls_dir, lo_import, pg_reload_conf, ...:
# server functions), and the tailwatch tables it may change.
_PRIVILEGES = """
SELECT r.rolsuper, r.rolcreaterole,
  ARRAY(SELECT g.rolname::text FROM pg_roles g WHERE g.oid <> r.oid AND pg_has_role(r.oid, g.oid, 'MEMBER')
        AND (g.rolsuper OR g.rolcanlogin OR g.rolname = ANY(%(roles)s)) ORDER BY g.rolname),
  ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p
        WHERE p.proacl IS NOT NULL AND has_function_privilege(r.oid, p.oid, 'EXECUTE')
          AND NOT EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')
        ORDER BY 1),
  ARRAY(SELECT t FROM unnest(%(tables)s::text[]) t WHERE to_regclass(t) IS NOT NULL
          AND has_table_privilege(r.oid, to_regclass(t), 'INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER'))
FROM pg_roles r WHERE r.rolname = current_user
"""


def _refuse_privileged(raw: Any, role: str) -> None:
    """QueryError naming what `role` may do beyond SELECT on tailwatch's tables; nothing when it may not."""
    with raw.cursor() as cursor:
        cursor.execute(_PRIVILEGES, {"roles": _POWER_ROLES, "tables": [t.name for t in models.Base.metadata.sorted_tables]})
        superuser, createrole, member_of, functions, writable = cursor.fetchone()
    why = []
    if superuser:
        why.append("it is a superuser")
    if createrole:
        why.append("it may create roles")
    if member_of:
        why.append(f"it is a member of {', '.join(member_of)}")
    if functions:
        shown = ", ".join(functions[:6]) + (f" and {len(functions) - 6} more" if len(functions) > 6 else "")
        why.append(f"it can execute server functions: {shown}")
    if writable:
        why.append(f"it can change tailwatch's tables: {', '.join(writable[:6])}")
    if why:
        raise QueryError(f"refused to run as role {role}: {'; '.join(why)}. `query sql` needs a role with SELECT "
                         "on tailwatch's tables only (storage.query_sql.role; see docs/operations.md)")


def _postgres_read(store: Store, text: str, max_rows: int, role: str = SQL_READER_ROLE,
                   password: str | None = None, timeout: float = SQL_TIMEOUT_S) -> tuple[list[str], list[tuple]]:
    import psycopg

    error = None
    try:
        with store.reader_connection(role, password) as raw:
            raw.autocommit = True  # the check below opens no transaction; the statement's is explicit
            _refuse_privileged(raw, role)
            try:
                with raw.transaction(force_rollback=True), raw.cursor() as cursor:
                    cursor.execute("SET TRANSACTION READ ONLY")
                    cursor.execute(f"SET LOCAL statement_timeout = {max(int(timeout * 1000), 1)}")
                    # prepare=True: the extended protocol runs exactly one statement ("SELECT 1; COMMIT; ..."
                    # is refused instead of committing out of the read-only transaction).
                    cursor.execute(text, prepare=True)
                    rows = cursor.fetchmany(max_rows + 1) if cursor.description else []
                    columns = [d.name for d in cursor.description or ()]
            except psycopg.errors.QueryCanceled:
                error = _stopped(timeout)
            except psycopg.Error as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                error = QueryError(f"refused or failed: {first}")
    except StoreError as exc:
        raise QueryError(f"{exc}; `query sql` connects as role {role} (storage.query_sql.role), which "
                         "`tailwatch db upgrade` creates (see docs/operations.md)") from None
    if error is not None:
        raise error
    return columns, _capped(rows, max_rows)


def _capped(rows: list[tuple], max_rows: int) -> list[tuple]:
    if len(rows) > max_rows:
        raise QueryError(f"more than {max_rows} rows; add a LIMIT or a narrower WHERE")
    return rows


# -- output ----------------------------------------------------------------------------------------

def _utc_columns(frame: pd.DataFrame, names: Iterable[str]) -> pd.DataFrame:
    for name in names:
        if name in frame.columns:
            frame[name] = pd.to_datetime(frame[name], utc=True)
    return frame


def jsonable(value: Any) -> Any:
    """A DataFrame cell as JSON: timestamps as RFC 3339 UTC, NaN / NaT as null, numpy as Python."""
    if value is None:
        return None
    if isinstance(value, pd.Timestamp | datetime):
        if pd.isna(value):
            return None
        return pd.Timestamp(value).tz_convert("UTC").isoformat().replace("+00:00", "Z")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is pd.NaT:
        return None
    return value


def finding_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Findings in the stable JSON shape (docs/investigate.md)."""
    out = []
    for row in frame.to_dict("records"):
        low, high = jsonable(row["interval_low"]), jsonable(row["interval_high"])
        out.append({
            "check": row["check"], "status": row["status"],
            "window_start": jsonable(row["window_start"]), "window_end": jsonable(row["window_end"]),
            "model_version": row["model_version"], "labels": jsonable(row["labels"] or {}),
            "value": jsonable(row["value"]), "baseline": jsonable(row["baseline"]), "n": jsonable(row["n"]),
            "interval": None if low is None and high is None else [low, high],
            "effect": jsonable(row["effect"]), "p_value": jsonable(row["p_value"]), "id": jsonable(row["id"]),
        })
    return out


def verdict_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Verdicts in the stable JSON shape (docs/investigate.md)."""
    return [{"verdict": row["verdict"], "window_start": jsonable(row["window_start"]),
             "window_end": jsonable(row["window_end"]), "model_version": row["model_version"],
             "evidence": jsonable(row["evidence"] or []), "estimated": jsonable(row["estimated"]),
             "attribution": jsonable(row["attribution"]), "what_changed": jsonable(row["what_changed"]),
             "next_steps": jsonable(row["next_steps"]), "rollback_to": row["rollback_to"],
             "summary": row["summary"],
             "incident_id": jsonable(row["incident_id"]), "id": jsonable(row["id"])}
            for row in frame.to_dict("records")]


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Any query's rows as JSON objects (column -> value)."""
    return [{str(k): jsonable(v) for k, v in row.items()} for row in frame.to_dict("records")]
