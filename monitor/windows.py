"""Windows: which windows a tick scores, each merged from its stored buckets, against a trailing baseline.

A window of length W covers [start, start + W) with start a multiple of W since the epoch (UTC). A tick
scores the last closed window of each configured length, and again every closed window its new rows
fell into (late data re-scores). Work per tick is bounded by the windows it scores, not by history.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from checks.base import Finding
from checks.evaluate import evaluate
from monitor.partials import ALL, Partial, merge_all
from monitor.profile import Profile
from storage.store import Store

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BASELINE = timedelta(hours=24)  # trailing history that latency, cache and signal checks compare with
MAX_RESCORED = 12  # closed windows per length re-scored for late rows in one tick; older ones wait for backfill


@dataclass(frozen=True)
class Scored:
    """The findings of one window, for one model version and segment."""

    start: datetime
    end: datetime
    model_version: str
    segment: str
    rows: int
    findings: list[Finding]


def floor_to(ts: datetime, size: timedelta) -> datetime:
    """The start of the window of length `size` holding `ts`."""
    return ts - (ts - EPOCH) % size


def windows_for(now: datetime, size: timedelta, touched: tuple[datetime, datetime] | None) -> list[tuple[datetime, datetime]]:
    """Closed windows to score at `now`: the last one, and those holding rows read this tick."""
    last_end = floor_to(now, size)
    starts = {last_end - size}
    if touched is not None:
        start = floor_to(touched[0], size)
        while start + size <= last_end and start <= touched[1]:
            starts.add(start)
            start += size
    return [(s, s + size) for s in sorted(starts)[-MAX_RESCORED:]]


def score(store: Store, service: str, profile: Profile | None, windows: list[tuple[datetime, datetime]],
          params=None) -> list[Scored]:
    """Score each window per model version and segment against the BASELINE before it."""
    out: list[Scored] = []
    for start, end in windows:
        with store.transaction() as session:
            rows = store.load_partials(session, service, start - BASELINE, end)
        window: dict[tuple[str, str], list[Partial]] = defaultdict(list)
        baseline: dict[tuple[str, str], list[Partial]] = defaultdict(list)
        for row in rows:
            target = window if row.bucket_start >= start else baseline
            target[(row.model_version, row.segment)].append(Partial.from_bytes(row.payload))
        for (version, segment), parts in sorted(window.items()):
            merged = merge_all(parts)
            base = merge_all(baseline.get((version, segment), []))
            if base.rows < merged.rows:
                # A version too new to have its own history is compared with what the service did before it.
                base = merge_all(p for (v, seg), ps in baseline.items() if seg == segment for p in ps)
            base = base if base.rows else None
            # The reference describes all traffic, not one segment's share of it: a segment is compared
            # with its own trailing history only, or "Contract=Two year" would always drift from the mix.
            findings = evaluate(merged, profile if segment == ALL else None, base, params)
            if segment != ALL:
                findings = [_with_segment(f, segment) for f in findings]
            out.append(Scored(start, end, version, segment, merged.rows, findings))
    return out


def _with_segment(finding: Finding, segment: str) -> Finding:
    from dataclasses import replace

    return replace(finding, labels={**finding.labels, "segment": segment})


def store_scored(store: Store, service: str, scored: list[Scored], tick_id: int | None) -> int:
    """Write the findings (idempotent upsert on check, window, version and labels); returns how many."""
    rows = [f.to_row(service, s.model_version, s.start, s.end, tick_id) for s in scored for f in s.findings]
    with store.transaction() as session:
        store.upsert_findings(session, rows)
    return len(rows)
