"""The accepted version's own quality as a baseline: its labelled figures (and its pre-label estimates) over
the last windows of the same length before a window, pooled, each with its n and interval. A new version
that replaced the accepted one shares no window with it; this is what it is judged against, before the
reference (a small reference's interval hides a two-point drop that thousands of labels a day show)."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from checks.acceptance import wilson_figure
from checks.quality import Measure
from checks.stats import wilson
from storage.jsontext import dumps
from storage.store import Store

HISTORY_WINDOWS = 7  # windows of the accepted version pooled into its baseline, newest first
CHECKS = {"quality": False, "quality_estimate": True}  # stored check -> estimated


# (estimated, metric, class, group) -> the accepted version's figure before one window
Figures = dict[tuple[bool, str, str, str], tuple[Measure, str]]


class AcceptedHistory:
    """The `accepted` version's decided figures (status ok) stored for windows before `windows`, and those
    of the windows scored since (`add`): a backfill scores the accepted version's windows in the same call
    as the new version's that are judged against them."""

    def __init__(self, store: Store, service: str, accepted: str | None,
                 windows: list[tuple[datetime, datetime]]) -> None:
        self.accepted, self.rows = accepted, []
        if not accepted or not windows:
            return
        longest = max(e - s for s, e in windows)
        since = min(s for s, _ in windows) - HISTORY_WINDOWS * longest
        with store.transaction() as session:
            self.rows = [r for check in CHECKS
                         for r in store.findings.load(session, service, since, max(e for _, e in windows),
                                                      check=check, model_version=accepted, status="ok", segment="")]

    def add(self, rows: list[dict]) -> None:
        """Findings rows (Finding.to_row) of windows just scored: the accepted version's decided ones count."""
        self.rows += [r for r in rows if r["model_version"] == self.accepted and r["check"] in CHECKS
                      and r["status"] == "ok" and "segment" not in (r["labels"] or {})]

    def before(self, start: datetime, end: datetime) -> Figures:
        """The accepted version's figures pooled over its HISTORY_WINDOWS newest windows of the length of
        [start, end) that ended by `start`, with where they came from. Proportions (accuracy, a class's
        precision and recall) pool their counts into one Wilson figure; other figures are the newest
        window's. Empty without an accepted version or history."""
        size = end - start
        latest: dict[tuple, dict] = {}  # a window re-scored since it was stored: its newest figures
        for r in self.rows:
            if as_utc(r["window_end"]) <= start and as_utc(r["window_end"]) - as_utc(r["window_start"]) == size:
                latest[(r["check"], as_utc(r["window_start"]), dumps(r["labels"] or {}))] = r
        ends = sorted({as_utc(r["window_end"]) for r in latest.values()})[-HISTORY_WINDOWS:]
        pooled: dict[tuple[bool, str, str, str], list[dict]] = defaultdict(list)
        for r in latest.values():
            labels = r["labels"] or {}
            if as_utc(r["window_end"]) in ends and r["value"] is not None and r["interval_low"] is not None:
                pooled[(CHECKS[r["check"]], labels.get("metric"), labels.get("class"), labels.get("group"))].append(r)
        figures: Figures = {}
        for key, found in pooled.items():
            _, metric, cls, _ = key
            count = len({as_utc(r["window_end"]) for r in found})
            where = f"version {self.accepted}, its last {count} window{'s' if count != 1 else ''}"
            if wilson_figure(metric, cls):
                k, n = sum(float(r["value"]) * int(r["n"]) for r in found), sum(int(r["n"]) for r in found)
                if n:
                    figures[key] = (Measure(metric, cls, k / n, n, wilson(k, n)), where)
            else:
                newest = max(found, key=lambda r: as_utc(r["window_end"]))
                figures[key] = (Measure(metric, cls, float(newest["value"]), int(newest["n"]),
                                        (float(newest["interval_low"]), float(newest["interval_high"]))),
                                f"version {self.accepted}, its last window")
        return figures


def as_utc(t: datetime) -> datetime:
    """A stored time as an aware UTC datetime (SQLite hands them back naive, in UTC)."""
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)
