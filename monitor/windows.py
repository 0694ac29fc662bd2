"""Windows: which windows a tick scores, each merged from its stored buckets, against a trailing baseline.

A window of length W covers [start, start + W) with start a multiple of W since the epoch (UTC). A tick
scores the last closed window of each configured length, and again every closed window its new rows
fell into (late data re-scores). Work per tick is bounded by the windows it scores, not by history.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from checks.base import Finding, trailing
from checks.evaluate import DATA_CHECKS, evaluate
from checks.latency import RATES
from monitor.partials import ALL, Partial, merge_all
from monitor.profile import Profile
from storage.store import Store

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BASELINE = timedelta(hours=24)  # trailing history that latency, cache and signal checks compare with
BASELINES = ("trailing_24h", "same_hour_7d")  # config `baseline`: the 24 h before, or this hour on 7 days
SAME_HOUR_DAYS = 7
HISTOGRAM_CHECKS = ("drift", "prediction_drift", "length_distribution")
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


def baseline_ranges(start: datetime, end: datetime, kind: str = "trailing_24h") -> list[tuple[datetime, datetime]]:
    """The bucket ranges [a, b) the baseline of window [start, end) merges: the BASELINE before it
    (`trailing_24h`), or the same hours of day on each of the SAME_HOUR_DAYS days before (`same_hour_7d`:
    traffic and latency that follow the clock are compared with their own hour)."""
    if kind == "trailing_24h":
        return [(start - BASELINE, start)]
    if kind == "same_hour_7d":
        day = timedelta(days=1)
        return [(start - d * day, min(end - d * day, start)) for d in range(SAME_HOUR_DAYS, 0, -1)]
    raise ValueError(f"unknown baseline {kind!r}; one of {BASELINES}")


def score(store: Store, service: str, profile: Profile | None, windows: list[tuple[datetime, datetime]],
          params=None, baseline_kind: str = "trailing_24h",
          accepted: tuple[datetime, datetime] | None = None) -> list[Scored]:
    """Score each window per model version and segment against its baseline (`baseline_kind`, see
    baseline_ranges); `params`: check name -> thresholds (Service.check_params()). `accepted`: a period of
    serving history whose merged partials the data checks' serving-history comparisons use instead of
    the trailing baseline. The windows are scored, and returned, in order of start (they share what
    they read)."""
    out: list[Scored] = []
    held, blocks = _Held(store, service), _Blocks()
    served = accepted_history(store, service, accepted) if accepted is not None else None
    for start, end in sorted(windows):
        ranges = baseline_ranges(start, end, baseline_kind)
        blocks.forget(ranges[0][0])  # windows come in order of start: no later one reaches back past this
        if baseline_kind == "trailing_24h":  # one range: the baseline runs into the window
            rows = held.between(start - BASELINE, end)
        else:
            rows = [r for a, b in [*ranges, (start, end)] for r in _load(store, service, a, b)]
        window: dict[tuple[str, str], list[_Row]] = defaultdict(list)
        baseline: dict[tuple[str, str], list[_Row]] = defaultdict(list)
        for row in rows:
            target = window if row[0] >= start else baseline
            target[(row[1], row[2])].append(row)
        for (version, segment), parts in sorted(window.items()):
            merged = blocks.merge(parts, [(start, end)])
            history = baseline.get((version, segment), [])
            if sum(r[3].rows for r in history) < merged.rows:
                # A version too new to have its own history is compared with what the service did before it.
                history = [r for (v, seg), rs in baseline.items() if seg == segment for r in rs]
            base = trailing([r[3] for r in history], tuple(RATES.values()), blocks.merge(history, ranges))
            if segment == ALL and served is not None:
                findings = [f for f in evaluate(merged, profile, base, params) if f.check not in DATA_CHECKS]
                findings += evaluate(merged, profile, served, params, only=DATA_CHECKS)
            elif segment == ALL:
                findings = evaluate(merged, profile, base, params)
            else:
                # The reference describes all traffic, not one segment's share of it: a segment is compared
                # with its own trailing history, or "Contract=Two year" would always drift from the mix. Its
                # histograms too, on the reference's bins: "predictions changed for this segment".
                findings = evaluate(merged, None, base, params)
                own = history_profile(profile, base)
                if own is not None:
                    findings += evaluate(merged, own, base, params, only=HISTOGRAM_CHECKS)
                findings = [_with_segment(f, segment) for f in findings]
            out.append(Scored(start, end, version, segment, merged.rows, findings))
    return out


_Row = tuple[datetime, str, str, Partial]  # bucket start, model version, segment, the decoded partial


def accepted_history(store: Store, service: str, period: tuple[datetime, datetime]) -> Partial | None:
    """The merged all-traffic partials of the accepted serving `period` [start, end), every version, with
    the dispersion of its rates and histograms; None when nothing is stored in it."""
    rows = [r for r in _load(store, service, *period) if r[2] == ALL]
    return trailing([r[3] for r in rows], tuple(RATES.values()))


def _load(store: Store, service: str, since: datetime, until: datetime) -> list[_Row]:
    """The stored partials with bucket_start in [since, until), oldest first, decoded."""
    with store.transaction() as session:
        rows = store.load_partials(session, service, since, until)
    return [(r.bucket_start, r.model_version, r.segment, Partial.from_bytes(r.payload)) for r in rows]


class _Held:
    """The stored partials of the windows of one score() call, read and decoded once. Windows come in
    order of start, and a window's trailing day is nearly all of the next one's: each call reads only
    the buckets not held yet and lets go of those before the baseline (at most a day and a window held)."""

    def __init__(self, store: Store, service: str) -> None:
        self.store, self.service = store, service
        self.rows: deque[_Row] = deque()  # oldest first
        self.until: datetime | None = None  # rows held for bucket starts up to here (exclusive)

    def between(self, since: datetime, until: datetime) -> list[_Row]:
        """The partials with bucket_start in [since, until); `since` must not go back between calls."""
        while self.rows and self.rows[0][0] < since:
            self.rows.popleft()
        lo = since if self.until is None else max(since, self.until)
        if until > lo:
            self.rows.extend(_load(self.store, self.service, lo, until))
            self.until = until
        return [r for r in self.rows if r[0] < until]


BLOCK = timedelta(hours=1)


class _Blocks:
    """Merges of each version and segment's buckets per hour (BLOCK), made once per score() call: the
    windows scored together merge nearly the same hours of baseline, and a day's window its 24 hours."""

    def __init__(self) -> None:
        self.merged: dict[tuple[str, str, datetime], Partial] = {}

    def forget(self, before: datetime) -> None:
        """Let go of the hours before `before` (a long scan would otherwise hold every hour it scored)."""
        if any(hour < before for _, _, hour in self.merged):
            self.merged = {k: v for k, v in self.merged.items() if k[2] >= before}

    def merge(self, rows: list[_Row], ranges: list[tuple[datetime, datetime]]) -> Partial:
        """merge_all of `rows` (every stored bucket of their versions and segments in `ranges`, in load
        order), an hour at a time where an hour lies whole in a range. The hours are merged in the same
        order whichever windows are scored together, so a window scores the same alone."""
        pieces: list[Partial] = []
        i = 0
        while i < len(rows):
            hour = floor_to(rows[i][0], BLOCK)
            version, segment = rows[i][1], rows[i][2]
            j = i + 1
            while j < len(rows) and rows[j][1:3] == (version, segment) and floor_to(rows[j][0], BLOCK) == hour:
                j += 1
            if j - i > 1 and any(a <= hour and hour + BLOCK <= b for a, b in ranges):
                key = (version, segment, hour)
                if key not in self.merged:
                    self.merged[key] = merge_all(r[3] for r in rows[i:j])
                pieces.append(self.merged[key])
            else:
                pieces.extend(r[3] for r in rows[i:j])
            i = j
        return merge_all(pieces)


def history_profile(profile: Profile | None, base: Partial | None) -> Profile | None:
    """The reference's bins holding `base`'s histograms instead of the reference's: what a segment's
    histograms are compared with. None without a profile or a baseline with histograms on its bins."""
    if profile is None or base is None or not base.hists or base.profile != profile.fingerprint:
        return None

    def own(ref, key):
        hist = base.hists.get(key)
        if ref is None or hist is None or len(hist) != ref.bins:
            return None
        return replace(ref, counts=tuple(hist), n=sum(hist), missing=0)

    fields = {f: fp for f, ref in profile.fields.items()
              if (fp := own(ref, f"len:{f}" if ref.kind == "text" else f)) is not None}
    scores = {c: fp for c, ref in profile.scores.items() if (fp := own(ref, f"score:{c}")) is not None}
    return Profile(rows=base.rows, fields=fields, prediction=own(profile.prediction, "prediction"),
                   scores=scores)


def _with_segment(finding: Finding, segment: str) -> Finding:
    return replace(finding, labels={**finding.labels, "segment": segment})


def store_scored(store: Store, service: str, scored: list[Scored], tick_id: int | None) -> int:
    """Write the findings (idempotent upsert on check, window, version and labels); returns how many."""
    rows = [f.to_row(service, s.model_version, s.start, s.end, tick_id) for s in scored for f in s.findings]
    with store.transaction() as session:
        store.upsert_findings(session, rows)
    return len(rows)
