"""Findings and the verdicts decided from them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from storage.database import Repository, as_dict, between, given, utc
from storage.jsontext import dumps, labels_key
from storage.models import FindingRow, Tick, VerdictRow, finite_or_none

FINDING_REQUIRED = ("service", "check", "model_version", "window_start", "window_end", "status")
FINDING_OPTIONAL = (
    "tick_id", "labels", "labels_key", "value", "baseline", "effect", "interval_low", "interval_high",
    "p_value", "n", "detail", "created_at",
)
FINDING_FLOATS = ("value", "baseline", "effect", "interval_low", "interval_high", "p_value")
VERDICT_FIELDS = (
    "verdict", "estimated", "rows", "evidence", "attribution", "what_changed", "next_steps", "rollback_to",
    "summary", "incident_id",
)


class Findings(Repository):
    """Findings per check, model version, window and labels."""

    def upsert(self, session: Session, rows: list[dict[str, Any]]) -> None:
        """Insert findings, or overwrite the stored one with the same service, check, model version,
        window and labels (created_at of the first write is kept). NaN floats are stored as NULL."""
        batch: dict[tuple[str, str, str, datetime, datetime, str], dict[str, Any]] = {}
        for raw in rows:
            missing = [k for k in FINDING_REQUIRED if raw.get(k) is None]
            unknown = set(raw) - set(FINDING_REQUIRED) - set(FINDING_OPTIONAL) - {"id"}
            if missing or unknown:
                raise ValueError(f"finding with missing fields {missing} / unknown fields {sorted(unknown)}")
            row = {k: raw.get(k) for k in FINDING_REQUIRED + FINDING_OPTIONAL}
            row["window_start"], row["window_end"] = utc(row["window_start"]), utc(row["window_end"])
            if row["labels"] is not None or row["labels_key"] is None:
                row["labels_key"] = labels_key(row["labels"])
            for name in FINDING_FLOATS:
                row[name] = finite_or_none(row[name])
            row["n"] = int(row["n"] or 0)
            key = (
                row["service"], row["check"], row["model_version"], row["window_start"], row["window_end"],
                row["labels_key"],
            )
            batch[key] = row  # within one call, the last write of a key wins
        if not batch:
            return
        # The windows written, not the span between them: a tick writing an hour and its day would read
        # every finding of the day's other hours.
        stored = session.execute(
            select(
                FindingRow.id, FindingRow.service, FindingRow.check, FindingRow.model_version,
                FindingRow.window_start, FindingRow.window_end, FindingRow.labels_key,
            ).where(
                FindingRow.service.in_({k[0] for k in batch}),
                FindingRow.check.in_({k[1] for k in batch}),
                FindingRow.window_start.in_({k[3] for k in batch}),
            )
        ).all()
        ids = {(r[1], r[2], r[3], utc(r[4]), utc(r[5]), r[6]): r[0] for r in stored}
        now = self.clock()
        updates, inserts = [], []
        for key, row in batch.items():
            if key in ids:
                updates.append({**{k: v for k, v in row.items() if k != "created_at"}, "id": ids[key]})
            else:
                inserts.append({**row, "created_at": row["created_at"] or now})
        if updates:
            session.execute(update(FindingRow), updates)
        if inserts:
            session.execute(insert(FindingRow), inserts)

    def load(
        self,
        session: Session,
        service: str,
        since: datetime | None = None,
        until: datetime | None = None,
        check: str | None = None,
        model_version: str | None = None,
        status: str | None = None,
        labels: dict[str, Any] | None = None,
        detail: bool = True,
        segment: str | None = None,
    ) -> list[dict[str, Any]]:
        """Findings of `service` with window_start in [since, until) (and `status`, when given), oldest
        first, as dicts with the keys `upsert` takes plus id; empty if none. `labels`: only label sets that
        may hold those values (a LIKE on the canonical JSON: the caller checks the match exactly);
        `segment` '' or 'all': only label sets without a segment (exact: `"segment":` is a key, never
        inside a JSON string), another value: that segment's (a LIKE, as labels); `detail` False: without
        the detail document (the costly part)."""
        fields = ("id",) + tuple(f for f in FINDING_REQUIRED + FINDING_OPTIONAL if detail or f != "detail")
        # Columns, not ORM objects: a tick reads thousands of findings and only needs their values.
        query = select(*(getattr(FindingRow, name) for name in fields)).where(FindingRow.service == service)
        if since is not None:
            query = query.where(FindingRow.window_start >= since)
        if until is not None:
            query = query.where(FindingRow.window_start < until)
        query = query.where(*given((FindingRow.check, check),
                                   (FindingRow.model_version, model_version),
                                   (FindingRow.status, status)))
        all_traffic = segment in ("", "all")
        if segment is not None and not all_traffic:
            labels = {**(labels or {}), "segment": segment}
        for key, value in (labels or {}).items():
            query = query.where(FindingRow.labels_key.contains(dumps({key: value})[1:-1], autoescape=True))
        if all_traffic:
            # A page of all traffic reads a fraction of the rows when segments are configured.
            query = query.where(~FindingRow.labels_key.contains('"segment":', autoescape=True))
        query = query.order_by(
            FindingRow.window_start, FindingRow.window_end, FindingRow.check, FindingRow.model_version,
            FindingRow.labels_key,
        )
        return [dict(zip(fields, row, strict=True)) for row in session.execute(query)]

    def scored_since(self, session: Session, service: str, after_tick: int, until: datetime) -> tuple[
            list[tuple[str, datetime, datetime]], int]:
        """Windows (model_version, start, end) whose findings ticks after `after_tick` with clock <= until
        wrote, and the newest such tick id (after_tick when none)."""
        ticks = select(Tick.id).where(Tick.service == service, Tick.id > after_tick, Tick.now <= until)
        last = session.scalar(select(func.max(Tick.id)).where(Tick.id.in_(ticks)))
        query = (select(FindingRow.model_version, FindingRow.window_start, FindingRow.window_end)
                 .where(FindingRow.service == service, FindingRow.tick_id.in_(ticks)).distinct())
        windows = sorted((v, utc(s), utc(e)) for v, s, e in session.execute(query))
        return windows, int(last) if last is not None else after_tick


class Verdicts(Repository):
    """One verdict per service, model version and window."""

    def upsert(self, session: Session, rows: list[dict[str, Any]]) -> list[int]:
        """Insert verdicts, or overwrite the stored one of the same service, model version and window
        (created_at and incident_id of the first write are kept unless given). Returns their ids."""
        ids = []
        now = self.clock()
        for raw in rows:
            key = (raw["service"], raw["model_version"], utc(raw["window_start"]), utc(raw["window_end"]))
            row = session.scalars(select(VerdictRow).where(
                VerdictRow.service == key[0], VerdictRow.model_version == key[1],
                VerdictRow.window_start == key[2], VerdictRow.window_end == key[3])).one_or_none()
            if row is None:
                row = VerdictRow(service=key[0], model_version=key[1], window_start=key[2], window_end=key[3],
                                 created_at=raw.get("created_at") or now)
                session.add(row)
            for name in VERDICT_FIELDS:
                if name in raw and not (name == "incident_id" and raw[name] is None):
                    setattr(row, name, raw[name])
            row.updated_at = now
            session.flush()
            ids.append(row.id)
        return ids

    def load(
        self,
        session: Session,
        service: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        model_version: str | None = None,
        incident_id: int | None = None,
    ) -> list[dict[str, Any]]:
        """Verdicts with window_end in (since, until], oldest first, as dicts of every column."""
        query = select(VerdictRow)
        query = query.where(*given((VerdictRow.service, service)))
        if since is not None:
            query = query.where(VerdictRow.window_end > since)
        if until is not None:
            query = query.where(VerdictRow.window_end <= until)
        query = query.where(*given((VerdictRow.model_version, model_version),
                                   (VerdictRow.incident_id, incident_id)))
        query = query.order_by(VerdictRow.window_end, VerdictRow.window_start, VerdictRow.model_version)
        cols = [c.key for c in VerdictRow.__table__.columns]
        return [{c: getattr(v, c) for c in cols} for v in session.scalars(query)]

    def search(self, session: Session, service: str, since: datetime | None = None, until: datetime | None = None,
               model_version: str | None = None, verdict: str | None = None, incident_id: int | None = None,
               ) -> list[dict[str, Any]]:
        """Verdicts of `service` with window_start in [since, until), oldest first, as dicts of every column."""
        query = select(VerdictRow).where(VerdictRow.service == service, *between(VerdictRow.window_start, since, until))
        query = query.where(*given((VerdictRow.model_version, model_version),
                                   (VerdictRow.verdict, verdict),
                                   (VerdictRow.incident_id, incident_id)))
        query = query.order_by(VerdictRow.window_start, VerdictRow.window_end, VerdictRow.model_version, VerdictRow.id)
        return [as_dict(v) for v in session.scalars(query)]

    def ending_at(self, session: Session, service: str, model_version: str, ends: list[datetime]) -> list[tuple]:
        """(window_start, window_end, verdict, rows, evidence) of the verdicts of `model_version` whose window
        ends at one of `ends`; unordered."""
        rows: list[tuple] = []
        for i in range(0, len(ends), 500):  # a long backfill step: bounded bound parameters per query
            rows += session.execute(select(
                VerdictRow.window_start, VerdictRow.window_end, VerdictRow.verdict, VerdictRow.rows,
                VerdictRow.evidence).where(VerdictRow.service == service, VerdictRow.model_version == model_version,
                                           VerdictRow.window_end.in_(ends[i:i + 500]))).all()
        return rows

    def windows(self, session: Session, service: str, model_versions: list[str], since: datetime,
                until: datetime) -> list[tuple]:
        """(model_version, window_start, window_end, verdict, rows) of the verdicts of `model_versions` with
        window_end in (since, until], by window end then start."""
        return session.execute(select(VerdictRow.model_version, VerdictRow.window_start, VerdictRow.window_end,
                                      VerdictRow.verdict, VerdictRow.rows).where(
            VerdictRow.service == service, VerdictRow.model_version.in_(model_versions),
            VerdictRow.window_end > since, VerdictRow.window_end <= until)
            .order_by(VerdictRow.window_end, VerdictRow.window_start)).all()

    def evidence(self, session: Session, service: str, model_version: str, window_start: datetime,
                 verdicts: tuple[str, ...]) -> list[Any]:
        """The evidence of `model_version`'s verdicts among `verdicts` of windows starting at `window_start`,
        by window end."""
        return list(session.scalars(select(VerdictRow.evidence).where(
            VerdictRow.service == service, VerdictRow.model_version == model_version,
            VerdictRow.window_start == window_start, VerdictRow.verdict.in_(verdicts))
            .order_by(VerdictRow.window_end)))

    def attach(self, session: Session, incident_id: int, service: str, model_version: str, since: datetime,
               until: datetime, verdicts: tuple[str, ...]) -> None:
        """Point the verdicts among `verdicts` of `model_version` whose windows overlap `since`..`until` (and
        end by `until`) that point at no incident yet at incident `incident_id`: a longer window that began
        before the onset and breached on it belongs to the incident too."""
        for row in session.scalars(select(VerdictRow).where(
                VerdictRow.service == service, VerdictRow.model_version == model_version,
                VerdictRow.window_end > since, VerdictRow.window_end <= until, VerdictRow.incident_id.is_(None),
                VerdictRow.verdict.in_(verdicts))):
            row.incident_id = incident_id
