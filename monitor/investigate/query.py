"""Read-only queries over stored results, as pandas DataFrames (for notebooks; the CLI prints them).

Every filter is a bound parameter of a repository query: no SQL text is built from user input.
Times are UTC-aware; a range [since, until) selects by window start (findings, verdicts), the tick's clock
(ticks), the quarantine time, or the incident's opening. Metrics over time are in
monitor.investigate.history, read-only SQL in monitor.investigate.sql.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import pandas as pd

from monitor.ingest.quarantine import printable
from storage.store import Store

FINDING_COLUMNS = ("id", "check", "status", "window_start", "window_end", "model_version", "labels", "value",
                   "baseline", "effect", "n", "interval_low", "interval_high", "p_value", "detail")
# Most severe first: how tables order findings by status and verdicts by verdict.
STATUS_RANK = {"breach": 0, "insufficient": 1, "ok": 2}
VERDICT_RANK = {"both": 0, "slower": 1, "worse": 1, "drift": 2, "no_data": 3, "insufficient_data": 4, "healthy": 5}


class QueryError(ValueError):
    """A query that cannot run as asked; the message says what to change."""


# -- helpers --------------------------------------------------------------------------------------

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
    rows = []
    with store.transaction() as session:
        found = store.findings.load(session, service, since, until, check=check, model_version=model_version,
                                    status=status, labels=labels, detail=detail, segment=segment)
    for found_row in found:
        row = {n: found_row[n] for n in names}
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


# -- ticks and quarantine -------------------------------------------------------------------------

TICK_COLUMNS = ("id", "now", "started_at", "finished_at", "status", "rows_read", "accepted", "quarantined",
                "joined", "unmatched", "duplicates", "findings", "seconds", "error", "warnings")


def ticks(store: Store, service: str, *, since: datetime | None = None, until: datetime | None = None,
          status: str | None = None, limit: int | None = None) -> pd.DataFrame:
    """Ticks whose clock (`now`) is in [since, until), oldest first (the newest `limit` when given)."""
    rows = []
    with store.transaction() as session:
        for t in store.ticks.search(session, service, since, until, status=status, limit=limit):
            summary = t.summary if isinstance(t.summary, dict) else {}
            rows.append({"id": t.id, "now": t.now, "started_at": t.started_at, "finished_at": t.finished_at,
                         "status": t.status, **t.counts, "findings": summary.get("findings"),
                         "seconds": summary.get("seconds"), "error": summary.get("error"),
                         "warnings": summary.get("warnings") or []})
    frame = pd.DataFrame(rows[::-1], columns=list(TICK_COLUMNS))
    return _utc_columns(frame, ("now", "started_at", "finished_at"))


QUARANTINE_COLUMNS = ("id", "tick_id", "created_at", "kind", "source", "position", "reason", "field", "excerpt",
                      "line")


def quarantine(store: Store, service: str, *, since: datetime | None = None, until: datetime | None = None,
               reason: str | None = None, kind: str | None = None, group_by: Sequence[str] = (),
               limit: int | None = None) -> pd.DataFrame:
    """Quarantined rows quarantined in [since, until), oldest first; with `group_by` (reason, field, kind,
    source, tick_id) the row count per group instead, largest first."""
    if group_by:
        allowed = {"reason", "field", "kind", "source", "tick_id"}
        if set(group_by) - allowed:
            raise QueryError(f"quarantine group by: unknown {sorted(set(group_by) - allowed)}; "
                             f"use {sorted(allowed)}")
        with store.transaction() as session:
            data = store.quarantine.grouped(session, service, list(group_by), since, until, reason=reason, kind=kind)
        frame = pd.DataFrame(data, columns=[*group_by, "rows", "first", "last"])
        return _utc_columns(frame, ("first", "last"))
    with store.transaction() as session:
        # `line`: the line as written; both it and `excerpt` safe for a terminal (control bytes as escapes)
        rows = [{c: q[c] for c in QUARANTINE_COLUMNS[:-2]}
                | {"excerpt": printable(q["excerpt"]), "line": None if q["raw"] is None else printable(q["raw"])}
                for q in store.quarantine.search(session, service, since, until, reason=reason, kind=kind, limit=limit)]
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
    with store.transaction() as session:
        rows = [{c: v.get(c) for c in VERDICT_COLUMNS}
                for v in store.verdicts.search(session, service, since, until, model_version=model_version,
                                               verdict=verdict, incident_id=incident_id)]
    frame = pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))
    return _utc_columns(frame, ("window_start", "window_end", "created_at"))


def incidents(store: Store, service: str, *, since: datetime | None = None, until: datetime | None = None,
              model_version: str | None = None, status: str | None = None,
              incident_id: int | None = None) -> pd.DataFrame:
    """Stored incidents opened in [since, until), oldest first; columns INCIDENT_COLUMNS."""
    with store.transaction() as session:
        rows = [{c: i.get(c) for c in INCIDENT_COLUMNS}
                for i in store.incidents.search(session, service, since, until, model_version=model_version,
                                                status=status, incident_id=incident_id)]
    frame = pd.DataFrame(rows, columns=list(INCIDENT_COLUMNS))
    return _utc_columns(frame, ("opened_at", "resolved_at", "first_window_start", "last_window_end"))


def why(inc: dict[str, Any]) -> str:
    """The one line that says what incident `inc` (a row of `incidents`) is, or for a resolved one why it
    resolved."""
    summary = inc.get("summary") if isinstance(inc.get("summary"), dict) else {}
    notes = [a.get("annotations") or {} for a in summary.get("alerts") or []]
    if inc.get("status") == "resolved":
        reasons = [n["resolution"] for n in notes if n.get("resolution")]
        if reasons:
            return "; ".join(dict.fromkeys(str(r) for r in reasons))
    texts = [n.get("summary") or n.get("text") for n in notes]
    return next((str(t) for t in texts if t), str(inc.get("verdict")))


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
