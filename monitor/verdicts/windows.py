"""Windows: which windows a tick scores, each merged from its stored buckets, against a trailing baseline.

A window of length W covers [start, start + W) with start a multiple of W since the epoch (UTC). A tick
scores the last closed window of each configured length, and again every closed window its new rows
fell into (late data re-scores). Work per tick is bounded by the windows it scores, not by history.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from checks.base import Finding, Trailing, trailing
from checks.catalog import names
from checks.evaluate import DATA_CHECKS, evaluate
from checks.latency import RATES
from checks.stats import dispersion
from monitor.aggregate import keys
from monitor.aggregate.partial import ALL, Partial, merge_all
from monitor.aggregate.profile import Profile
from storage.store import Store

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BASELINE = timedelta(hours=24)  # trailing history that latency, cache and signal checks compare with
BASELINES = ("trailing_24h", "same_hour_7d")  # config `baseline`: the 24 h before, or this hour on 7 days
SAME_HOUR_DAYS = 7
HISTOGRAM_CHECKS = names("drift", "predictions", "lengths")  # PSI of histograms on the reference's bins
WINDOW_CHECKS = names(kind="window")
# Judged against the reference, not the serving history: a field drifting from the training data says
# nothing about the history latency, cache and predictions are compared with, so its breaches never hold
# that history back (one drifting field would otherwise take the baseline away from every window).
REFERENCE_CHECKS = names("completeness", "ranges", "drift", "lengths", "vocabulary")
HOLDING_CHECKS = tuple(c for c in WINDOW_CHECKS if c not in REFERENCE_CHECKS)
# Latency, failures, queueing and replica load grow with load: those checks (LOAD_CHECKS) compare a window
# with the trailing buckets whose stretch of the window's length carried at least LOAD_MATCH of its requests
# (all traffic), when those hold LOAD_MATCH_WINDOWS times its rows; else with the whole trailing day. The
# afternoon peak is then judged against the busy hours, not a day that averages in the night, and a window
# no busier than the day keeps all of it. Hit rates, inputs and predictions keep the whole day.
LOAD_CHECKS = names("latency", "signals", "routing")
LOAD_MATCH = 0.8
LOAD_MATCH_WINDOWS = 4
MAX_RESCORED = 12  # closed windows per length re-scored for late rows in one tick; older ones wait for backfill
RUN_LOOKBACK = timedelta(days=7)  # how far back a run of breaching windows scored by earlier ticks is read


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


def baseline_ranges(start: datetime, end: datetime, kind: str = "trailing_24h",
                    lag: timedelta = timedelta(0)) -> list[tuple[datetime, datetime]]:
    """The bucket ranges [a, b) the trailing baseline of window [start, end) merges, ending `lag` before
    it: the BASELINE before (`trailing_24h`), or the same hours of day on each of the SAME_HOUR_DAYS days
    before (`same_hour_7d`: traffic and latency that follow the clock are compared with their own hour)."""
    return _before(start, end, kind, start - lag)


def _before(start: datetime, end: datetime, kind: str, until: datetime) -> list[tuple[datetime, datetime]]:
    """baseline_ranges of window [start, end) ending by `until` (at most `start`): the BASELINE before
    `until`, or the same hours on the SAME_HOUR_DAYS days before it (the last one cut at `until`)."""
    if kind == "trailing_24h":
        return [(until - BASELINE, until)]
    if kind == "same_hour_7d":
        day = timedelta(days=1)
        first = (start - until) // day + 1  # the first day back whose same hours begin before `until`
        return [(start - d * day, min(end - d * day, until)) for d in range(first + SAME_HOUR_DAYS - 1, first - 1, -1)]
    raise ValueError(f"unknown baseline {kind!r}; one of {BASELINES}")


@dataclass(frozen=True)
class Anchors:
    """What holds baselines in place, loaded by the caller (monitor.verdicts.stage.load_anchors): a baseline never
    contains the regression it judges. A window of version v is compared with the history before its
    anchor (anchors_of: the earliest with history before it); with none, with its trailing history
    (baseline_ranges, `lag` before it)."""

    accepted: frozenset[str] = frozenset()  # version values accepted (config accepted_versions, `tailwatch accept`)
    sightings: tuple[tuple[str, str, datetime], ...] = ()  # (kind, value, first_seen) of every version value
    incidents: tuple[tuple[str | None, datetime], ...] = ()  # open incidents: (model version, None: all; onset)
    soak: timedelta | None = None  # a value is accepted this long after its first sighting with no open incident
    lag: timedelta = timedelta(0)  # the trailing baseline ends this long before the window

    def accepts(self, value: str, first_seen: datetime, at: datetime, version: str) -> bool:
        """Whether `value` (first seen at `first_seen`) is accepted for a window of `version` starting `at`:
        listed, or soaked with no incident open on `version` (or on every version) since it appeared."""
        if value in self.accepted:
            return True
        if self.soak is None or first_seen + self.soak > at:
            return False
        return not any((m is None or m == version) and onset >= first_seen for m, onset in self.incidents)

    def anchors_of(self, version: str, start: datetime, size: timedelta) -> list[datetime]:
        """Where the baseline of a window of `version` at [start, start + size) may end, earliest first:
        the latest first sighting (floored to the window length) of a value not accepted -- `version`
        itself, or any preprocess_version or config_hash -- and the earliest onset of an incident open on
        `version` or on every version, each at or before `start`. Empty: no anchor (trailing history)."""
        latest = None
        for kind, value, seen in self.sightings:
            if kind == "model_version" and value != version:
                continue
            at = floor_to(seen, size)
            if at <= start and (latest is None or at > latest) and not self.accepts(value, at, start, version):
                latest = at
        onsets = [onset for m, onset in self.incidents if (m is None or m == version) and onset <= start]
        return sorted({e for e in (latest, min(onsets, default=None)) if e is not None})

    def accepted_versions(self, at: datetime) -> frozenset[str]:
        """The model versions accepted at `at` (listed, or soaked)."""
        return frozenset(v for kind, v, seen in self.sightings
                         if kind == "model_version" and self.accepts(v, seen, at, v)) | self.accepted


def score(store: Store, service: str, profile: Profile | None, windows: list[tuple[datetime, datetime]],
          params=None, baseline_kind: str = "trailing_24h",
          accepted: tuple[datetime, datetime] | None = None, anchors: Anchors | None = None) -> list[Scored]:
    """Score each window per model version and segment against its baseline (`baseline_kind`, see
    baseline_ranges; held at `anchors`, see Anchors); `params`: check name -> thresholds
    (Service.check_params()). `accepted`: a period of serving history whose merged partials the data
    checks' serving-history comparisons use instead of the trailing baseline. The windows are scored,
    and returned, in order of start (they share what they read).

    A regression holds its own ground too: once a version's window of all traffic or of one segment
    breaches, its later windows of that length and segment are compared with the history before that
    window, until one comes back clean (a regression never becomes its own baseline before an incident
    holds it), whether the windows are scored in one call (a backlog) or by successive ticks (the run is
    read from the stored findings)."""
    anchors = anchors or Anchors()
    out: list[Scored] = []
    held, blocks, frozen = _Held(store, service), _Blocks(), _Frozen(store, service)
    served = accepted_history(store, service, accepted) if accepted is not None else None
    breached: dict[tuple[str, timedelta, str], datetime] = {}  # (version, length, segment) -> first breach
    if not windows:
        return out
    regressions = _Regressions(store, service, min(baseline_ranges(s, e, baseline_kind, anchors.lag)[0][0]
                                                  for s, e in windows) - RUN_LOOKBACK, max(windows)[0])
    for start, end in sorted(windows):
        ranges = baseline_ranges(start, end, baseline_kind, anchors.lag)
        blocks.forget(ranges[0][0])  # windows come in order of start: no later one reaches back past this
        if baseline_kind == "trailing_24h":  # one range: held with the window (and the lag between)
            rows = held.between(ranges[0][0], end)
        else:
            rows = [r for a, b in [*ranges, (start, end)] for r in _load(store, service, a, b)]
        window: dict[tuple[str, str], list[_Row]] = defaultdict(list)
        baseline: dict[tuple[str, str], list[_Row]] = defaultdict(list)
        load: dict[datetime, int] = defaultdict(int)  # all traffic's requests per stretch of the window's length
        for row in rows:
            if row[2] == ALL:
                load[floor_to(row[0], end - start)] += row[3].rows
            if row[0] >= start:
                window[(row[1], row[2])].append(row)
            elif any(a <= row[0] < b for a, b in ranges) and not regressions.holds(row, end - start):
                baseline[(row[1], row[2])].append(row)
        busy = load.get(start, 0)
        clean: dict[tuple[str, str], bool] = {}
        for (version, segment), parts in sorted(window.items()):
            merged = _clumps(parts, blocks.merge(parts, [(start, end)]))
            ends = anchors.anchors_of(version, start, end - start)
            key = (version, end - start, segment)
            if key not in breached and (run := regressions.first(version, start, end - start, segment)) is not None:
                breached[key] = run
            provisional = breached.get(key)
            if provisional is not None:
                ends = sorted({*ends, provisional})
            base, loaded, good = None, None, anchors.accepted_versions(start) if ends else frozenset()
            for anchor in ends:  # the earliest with history before it: a value there from the start has none
                base = frozen.baseline(_before(start, end, baseline_kind, anchor), version if version in good
                                       else None, good, segment, merged.rows, blocks, regressions, end - start)
                if base is not None:
                    break
            if base is None:
                history = baseline.get((version, segment), [])
                if sum(r[3].rows for r in history) < merged.rows:
                    # A version too new to have its own history is compared with what the service did before it.
                    history = [r for (v, seg), rs in baseline.items() if seg == segment for r in rs]
                base = trailing([r[3] for r in history], tuple(RATES.values()), blocks.merge(history, ranges))
                # The same hours of day (same_hour_7d) already carry the same load.
                busiest = _as_busy(history, load, busy, merged.rows, end - start) if baseline_kind == "trailing_24h" else history
                if busiest is not history:
                    loaded = trailing([r[3] for r in busiest], tuple(RATES.values()), blocks.merge(busiest, ranges))
            if segment == ALL and served is not None:
                findings = [f for f in _evaluate(merged, profile, base, loaded, params) if f.check not in DATA_CHECKS]
                findings += evaluate(merged, profile, served, params, only=DATA_CHECKS)
            elif segment == ALL:
                findings = _evaluate(merged, profile, base, loaded, params)
            else:
                # The reference describes all traffic, not one segment's share of it: a segment is compared
                # with its own trailing history, or "Contract=Two year" would always drift from the mix. Its
                # histograms too, on the reference's bins: "predictions changed for this segment".
                findings = _evaluate(merged, None, base, loaded, params)
                own = history_profile(profile, base)
                if own is not None:
                    findings += evaluate(merged, own, base, params, only=HISTOGRAM_CHECKS)
                findings = [_with_segment(f, segment) for f in findings]
            if segment == ALL:
                findings = _shifted_from_history(findings, merged, profile, base, params)
            clean[(version, segment)] = not any(f.status == "breach" and f.check in HOLDING_CHECKS for f in findings)
            out.append(Scored(start, end, version, segment, merged.rows, findings))
        for (version, segment), ok in clean.items():
            regressions.scored(version, start, end, segment, breach=not ok)
            if ok:
                breached.pop((version, end - start, segment), None)
            else:
                breached.setdefault((version, end - start, segment), start)
    return out


_Row = tuple[datetime, str, str, Partial]  # bucket start, model version, segment, the decoded partial


def _evaluate(window: Partial, profile: Profile | None, base: Partial | None, loaded: Partial | None,
              params) -> list[Finding]:
    """evaluate() of every window check against `base`, those of LOAD_CHECKS against `loaded` when set (the
    trailing buckets as busy as the window), in registration order."""
    if loaded is None:
        return evaluate(window, profile, base, params)
    out: list[Finding] = []
    for name in WINDOW_CHECKS:
        out += evaluate(window, profile, loaded if name in LOAD_CHECKS else base, params, only=(name,))
    return out


def _as_busy(history: list[_Row], load: dict[datetime, int], busy: int, rows: int, size: timedelta) -> list[_Row]:
    """The buckets of `history` whose block (of the window's length `size`) carried at least LOAD_MATCH x
    `busy` (the window's requests), when they hold LOAD_MATCH_WINDOWS x `rows` (the window's, of its
    version and segment); else all of `history`."""
    kept = [r for r in history if load.get(floor_to(r[0], size), 0) >= LOAD_MATCH * busy]
    if len(kept) == len(history) or sum(r[3].rows for r in kept) < LOAD_MATCH_WINDOWS * rows:
        return history
    return kept


class _Regressions:
    """The windows that breached, per version, length and segment (ALL: all traffic): stored by earlier
    ticks in [since, until), then as this score() call scores them. A run of them that earlier ticks
    scored holds the baseline at its first (`first`); their buckets are no baseline of their segment
    (`holds`): once a fault ends, the history it left behind would make the traffic that came back look
    like a regression (a rollback's healthy predictions drifting from a day that held the fault's), and
    one segment's slowdown would become its own baseline within the day."""

    def __init__(self, store: Store, service: str, since: datetime, until: datetime) -> None:
        with store.transaction() as session:
            found = store.findings.load(session, service, since=since, until=until, status="breach")
        self.starts: dict[tuple[str, timedelta, str], set[datetime]] = defaultdict(set)
        for f in found:
            if f["check"] in HOLDING_CHECKS:
                segment = str((f["labels"] or {}).get("segment", ALL))
                self.starts[(f["model_version"], f["window_end"] - f["window_start"], segment)].add(f["window_start"])
        self.asked: set[tuple[str, timedelta, str]] = set()

    def first(self, version: str, start: datetime, size: timedelta, segment: str = ALL) -> datetime | None:
        """The first window of the unbroken run of stored breaching windows of `version`, length `size` and
        `segment` that ends at `start` (RUN_LOOKBACK back at most); None when the window before `start` did
        not breach, or on a later call for the same version, length and segment (the call's own windows
        carry the run on from there)."""
        if (version, size, segment) in self.asked:
            return None
        self.asked.add((version, size, segment))
        # Asked at the version's first window of that length, before this call scored any of them: only
        # earlier ticks' breaches are in `starts` before `start`.
        starts, limit, first = self.starts.get((version, size, segment), set()), start - RUN_LOOKBACK, None
        while start - size >= limit and start - size in starts:
            first = start = start - size
        return first

    def scored(self, version: str, start: datetime, end: datetime, segment: str, *, breach: bool) -> None:
        """Record this call's score of `version`'s window [start, end) of `segment` (a re-score replaces a
        stored one)."""
        starts = self.starts[(version, end - start, segment)]
        if breach:
            starts.add(start)
        else:
            starts.discard(start)

    def holds(self, row: _Row, size: timedelta) -> bool:
        """Whether the bucket `row` lies in a breaching window of length `size` of its version and segment."""
        starts = self.starts.get((row[1], size, row[2]))
        return bool(starts) and floor_to(row[0], size) in starts


def _clumps(parts: list[_Row], merged: Partial) -> Trailing:
    """The window `merged` with the dispersion of its rates (RATES) between its buckets `parts`: failures
    that come in one clump (a burst) are fewer independent events than their count."""
    return Trailing(merged.counts, merged.hists, merged.sketches, merged.unseen, merged.profile,
                    {key: dispersion([(r[3].counts[key], r[3].rows) for r in parts]) for key in RATES.values()})


def accepted_history(store: Store, service: str, period: tuple[datetime, datetime]) -> Partial | None:
    """The merged all-traffic partials of the accepted serving `period` [start, end), every version, with
    the dispersion of its rates and histograms; None when nothing is stored in it."""
    rows = [r for r in _load(store, service, *period) if r[2] == ALL]
    return trailing([r[3] for r in rows], tuple(RATES.values()))


def _load(store: Store, service: str, since: datetime, until: datetime) -> list[_Row]:
    """The stored partials with bucket_start in [since, until), oldest first, decoded."""
    with store.transaction() as session:
        rows = store.partials.load(session, service, since, until)
    return [(r.bucket_start, r.model_version, r.segment, Partial.from_bytes(r.payload)) for r in rows]


class _Held:
    """The stored partials of the windows of one score() call, read and decoded once. Windows come in
    order of start, and a window's trailing day is nearly all of the next one's: each call reads only
    the buckets not held yet and lets go of those before the earliest still asked for (at most the
    baseline's span and a window held)."""

    def __init__(self, store: Store, service: str) -> None:
        self.store, self.service = store, service
        self.rows: list[_Row] = []  # oldest first
        self.span: tuple[datetime, datetime] | None = None  # rows held for bucket starts in [since, until)

    def between(self, since: datetime, until: datetime) -> list[_Row]:
        """The partials with bucket_start in [since, until); `since` must not go back between calls."""
        if self.span is None or since >= self.span[1] or until <= self.span[0]:
            self.rows, self.span = _load(self.store, self.service, since, until), (since, until)
        else:
            if since < self.span[0]:
                self.rows[:0] = _load(self.store, self.service, since, self.span[0])
            if until > self.span[1]:
                self.rows += _load(self.store, self.service, self.span[1], until)
            lo = bisect_left(self.rows, since, key=_start)
            # Let go of what no later window reaches back to.
            self.rows, self.span = self.rows[lo:], (since, max(until, self.span[1]))
        return self.rows[:bisect_left(self.rows, until, key=_start)]


def _start(row: _Row) -> datetime:
    return row[0]


class _Frozen:
    """The baselines held at anchors in one score() call: each anchored range read once, and each merge
    of it (per version choice and segment) made once, however many windows compare with it."""

    KEEP = 4  # anchored ranges held at once (most calls see one or two)

    def __init__(self, store: Store, service: str) -> None:
        self.store, self.service = store, service
        self.rows: dict[tuple, list[_Row]] = {}
        self.merged: dict[tuple, tuple[int, Partial | None]] = {}

    def baseline(self, ranges: list[tuple[datetime, datetime]], version: str | None, accepted: frozenset[str],
                 segment: str, needed: int, blocks: _Blocks, regressions: _Regressions,
                 size: timedelta) -> Partial | None:
        """The merged history of `segment` in `ranges`, without the buckets of `regressions`' windows of
        length `size`: of
        `version` (accepted: its own history), else of the `accepted` versions, else of every version --
        the first with at least `needed` rows, else the first with at least half as many; None when none
        has (the caller falls back to the trailing baseline)."""
        key = (tuple(ranges), size)
        if key not in self.rows:
            if len(self.rows) >= self.KEEP:  # the oldest range, and its merges (a long backfill sees many)
                gone = next(iter(self.rows))
                del self.rows[gone]
                self.merged = {k: v for k, v in self.merged.items() if k[0] != gone}
            # Read when first asked for, before the anchor: every breach in the range is known by then.
            self.rows[key] = [r for a, b in ranges for r in _load(self.store, self.service, a, b)
                              if not regressions.holds(r, size)]
        fallback = None
        for versions in ([version] if version is not None else sorted(accepted), None):
            choice = (key, segment, None if versions is None else tuple(versions))
            if choice not in self.merged:
                history = [r for r in self.rows[key] if r[2] == segment and (versions is None or r[1] in versions)]
                n = sum(r[3].rows for r in history)
                self.merged[choice] = (n, trailing([r[3] for r in history], tuple(RATES.values()),
                                                   blocks.merge(history, ranges)) if n else None)
            n, base = self.merged[choice]
            if n >= needed and n:
                return base
            if fallback is None and n and 2 * n >= needed:
                fallback = base
        # A window as long as the history it is held at (a day's window, a day's baseline) has about as
        # many rows as it, one day fewer: the held history still beats a trailing one holding the regression.
        return fallback


BLOCK = timedelta(hours=1)


class _Blocks:
    """Merges of each version and segment's buckets per hour (BLOCK), made once per score() call: the
    windows scored together merge nearly the same hours of baseline, and a day's window its 24 hours."""

    def __init__(self) -> None:
        self.merged: dict[tuple[str, str, datetime, tuple[datetime, ...]], Partial] = {}

    def forget(self, before: datetime) -> None:
        """Let go of the hours before `before` (a long scan would otherwise hold every hour it scored)."""
        if any(hour < before for _, _, hour, _ in self.merged):
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
                # Keyed by the buckets too: a baseline may leave out some of an hour's (a regression's).
                key = (version, segment, hour, tuple(r[0] for r in rows[i:j]))
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
              if (fp := own(ref, keys.length(f) if ref.kind == "text" else f)) is not None}
    scores = {c: fp for c, ref in profile.scores.items() if (fp := own(ref, keys.score(c))) is not None}
    return Profile(rows=base.rows, fields=fields, prediction=own(profile.prediction, "prediction"),
                   scores=scores)


def _shifted_from_history(findings: list[Finding], window: Partial, profile: Profile | None,
                          base: Partial | None, params) -> list[Finding]:
    """All traffic's prediction drift findings (against the reference) with `detail.shifted` kept only where
    the window's predictions also moved from the baseline history (held at its anchor): a shift from the
    training data that the traffic before already had is not a fault an episode can hold on. Unchanged
    without a history on the reference's bins."""
    own = history_profile(profile, base)
    if own is None or not any(f.check == "prediction_drift" and f.detail.get("shifted") for f in findings):
        return findings
    moved = {tuple(sorted(f.labels.items())): bool(f.detail.get("shifted"))
             for f in evaluate(window, own, base, params, only=("prediction_drift",))}
    return [replace(f, detail={**f.detail, "shifted": moved.get(tuple(sorted(f.labels.items())), True)})
            if f.check == "prediction_drift" and f.detail.get("shifted") else f for f in findings]


def _with_segment(finding: Finding, segment: str) -> Finding:
    return replace(finding, labels={**finding.labels, "segment": segment})


def store_scored(store: Store, service: str, scored: list[Scored], tick_id: int | None) -> int:
    """Write the findings (idempotent upsert on check, window, version and labels); returns how many."""
    rows = [f.to_row(service, s.model_version, s.start, s.end, tick_id) for s in scored for f in s.findings]
    with store.transaction() as session:
        store.findings.upsert(session, rows)
    return len(rows)
