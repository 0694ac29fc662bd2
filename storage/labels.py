"""Scored predictions and their labels: what quality scoring reads once labels mature."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from storage.database import Repository, utc
from storage.models import LabelRow, ScoredPrediction


def _parts(items: list, size: int) -> Iterator[list]:
    """`items` in consecutive slices of at most `size` (bounded IN lists)."""
    for i in range(0, len(items), size):
        yield items[i:i + size]


class Labels(Repository):
    """Scored predictions and the labels that arrive for them."""

    def add_predictions(self, session: Session, service: str, rows: list[dict[str, Any]]) -> int:
        """Insert scored predictions (keys: request_id, model_version, ts, status, prediction, scores,
        attrs); a (request_id, model_version) already stored keeps its first row. Returns rows given."""
        if not rows:
            return 0
        dialect = sqlite if session.get_bind().dialect.name == "sqlite" else postgresql
        values = [{**r, "service": service, "ts": utc(r["ts"])} for r in rows]
        for part in _parts(values, 2000):
            session.execute(dialect.insert(ScoredPrediction).on_conflict_do_nothing(), part)
        return len(rows)

    def upsert(self, session: Session, service: str, rows: list[dict[str, Any]],
               now: datetime) -> tuple[list[str], list[str], int]:
        """Store labels (keys: request_id, label, label_ts or None) in arrival order: (request ids labelled
        for the first time, request ids whose label changed, repeats of the stored label). The latest wins
        (a label older by label_ts than the stored one does not replace it); a label that differs from the
        stored one counts as a change either way."""
        fresh, changed, repeated = [], [], 0
        stored: dict[str, Any] = {}
        ids = list(dict.fromkeys(r["request_id"] for r in rows))
        for part in _parts(ids, 500):
            query = select(LabelRow).where(LabelRow.service == service, LabelRow.request_id.in_(part))
            stored |= {r.request_id: r for r in session.scalars(query)}
        for r in rows:
            label_ts = None if r.get("label_ts") is None else utc(r["label_ts"])
            row = stored.get(r["request_id"])
            if row is None:
                row = LabelRow(service=service, request_id=r["request_id"], label=r["label"], label_ts=label_ts,
                               first_seen=now, updated_at=now, changes=0)
                session.add(row)
                stored[r["request_id"]] = row
                fresh.append(r["request_id"])
                continue
            older = label_ts is not None and row.label_ts is not None and label_ts < row.label_ts
            if r["label"] == row.label:
                repeated += 1
                if not older and label_ts is not None:
                    row.label_ts = label_ts
                continue
            row.changes += 1
            changed.append(r["request_id"])
            if not older:
                row.label, row.label_ts, row.updated_at = r["label"], label_ts, now
        session.flush()
        return fresh, changed, repeated

    def expire(self, session: Session, service: str, cutoff: datetime) -> list[dict[str, Any]]:
        """Delete and return (as dicts) the labels first seen at or before `cutoff` whose request has no
        scored prediction: they waited their horizon in vain."""
        has_prediction = select(ScoredPrediction.request_id).where(
            ScoredPrediction.service == service, ScoredPrediction.request_id == LabelRow.request_id).exists()
        query = select(LabelRow).where(LabelRow.service == service, LabelRow.first_seen <= cutoff, ~has_prediction)
        expired = [{"request_id": r.request_id, "label": r.label, "label_ts": r.label_ts, "first_seen": r.first_seen}
                   for r in session.scalars(query)]
        for part in _parts([e["request_id"] for e in expired], 500):
            session.execute(delete(LabelRow).where(LabelRow.service == service, LabelRow.request_id.in_(part)))
        return expired

    def prediction_times(self, session: Session, service: str, request_ids: list[str]) -> list[datetime]:
        """Prediction times of the scored predictions of `request_ids` (one per model version)."""
        out: list[datetime] = []
        for part in _parts(list(dict.fromkeys(request_ids)), 500):
            out += session.scalars(select(ScoredPrediction.ts).where(
                ScoredPrediction.service == service, ScoredPrediction.request_id.in_(part))).all()
        return out

    def load(self, session: Session, service: str, since: datetime, until: datetime) -> list[tuple]:
        """Scored predictions with ts in [since, until), each with its label or None: tuples (request_id,
        model_version, ts, status, prediction, scores, attrs, label, label_changes), by ts."""
        sp = ScoredPrediction
        query = (
            select(sp.request_id, sp.model_version, sp.ts, sp.status, sp.prediction, sp.scores, sp.attrs,
                   LabelRow.label, LabelRow.changes)
            .outerjoin(LabelRow, (LabelRow.service == sp.service) & (LabelRow.request_id == sp.request_id))
            .where(sp.service == service, sp.ts >= since, sp.ts < until)
            .order_by(sp.ts, sp.request_id, sp.model_version)
        )
        return [tuple(r) for r in session.execute(query)]

    def span(self, session: Session, service: str) -> tuple[datetime | None, datetime | None]:
        """The first and last prediction time of the stored scored predictions (None, None when none)."""
        lo, hi = session.execute(select(func.min(ScoredPrediction.ts), func.max(ScoredPrediction.ts))
                                 .where(ScoredPrediction.service == service)).one()
        return lo, hi

    def prune(self, session: Session, service: str, before: datetime) -> int:
        """Delete scored predictions made before `before` and their labels; returns predictions deleted."""
        old = select(ScoredPrediction.request_id).where(ScoredPrediction.service == service,
                                                         ScoredPrediction.ts < before)
        session.execute(delete(LabelRow).where(LabelRow.service == service, LabelRow.request_id.in_(old)))
        result = session.execute(delete(ScoredPrediction).where(ScoredPrediction.service == service,
                                                                ScoredPrediction.ts < before))
        return int(result.rowcount or 0)
