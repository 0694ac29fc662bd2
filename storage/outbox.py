"""The durable outbox of notifications."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import case, func, or_, select
from sqlalchemy.orm import Session

from storage.database import Repository, utc
from storage.models import Outbox as OutboxRow


class Outbox(Repository):
    """Notifications written before they are sent."""

    def depth(self, session: Session) -> int:
        """Notifications written and not yet sent (status pending)."""
        return int(session.scalar(select(func.count()).select_from(OutboxRow).where(OutboxRow.status == "pending")) or 0)

    def add(self, session: Session, **fields: Any) -> None:
        """Write a notification with `fields` (columns)."""
        session.add(OutboxRow(**fields))

    def get(self, session: Session, item_id: int) -> OutboxRow | None:
        """Notification `item_id` (a mapped row, updated in the session's unit of work), or None."""
        return session.get(OutboxRow, item_id)

    def due(self, session: Session, now: datetime, limit: int) -> list[tuple[int, int | None, str | None]]:
        """(id, incident_id, kind) of the pending notifications due at `now`, oldest first, at most `limit`."""
        return [tuple(r) for r in session.execute(
            select(OutboxRow.id, OutboxRow.incident_id, OutboxRow.kind).where(
                OutboxRow.status == "pending", OutboxRow.next_attempt_at <= now).order_by(OutboxRow.id).limit(limit))]

    def earlier_unsent(self, session: Session, incident_id: int, item_id: int,
                       kinds: tuple[str | None, ...] | None = None) -> bool:
        """Whether incident `incident_id` has a notification (of `kinds` when given) older than `item_id`
        not sent yet."""
        query = select(OutboxRow.id).where(OutboxRow.incident_id == incident_id, OutboxRow.id < item_id,
                                           OutboxRow.status != "sent")
        if kinds is not None:
            named = [k for k in kinds if k is not None]
            query = query.where(or_(OutboxRow.kind.in_(named), OutboxRow.kind.is_(None)) if None in kinds
                                else OutboxRow.kind.in_(named))
        return session.scalar(query.limit(1)) is not None

    def supersede(self, session: Session, incident_id: int, item_id: int, kind: str, now: datetime) -> int:
        """Mark the pending `kind` notifications of `incident_id` older than `item_id` as sent, said by
        `item_id` (which carries their whole content); returns how many."""
        rows = list(session.scalars(select(OutboxRow).where(
            OutboxRow.incident_id == incident_id, OutboxRow.id < item_id, OutboxRow.kind == kind,
            OutboxRow.status == "pending")))
        for row in rows:
            row.status, row.sent_at, row.external_id = "sent", now, f"superseded by {item_id}"
        return len(rows)

    def last_written(self, session: Session, kind: str, incident_ids: list[int]) -> dict[int, tuple[datetime, bool]]:
        """Per incident of `incident_ids` with `kind` notifications: (when the newest was written, whether
        one is still pending)."""
        if not incident_ids:
            return {}
        pending = func.max(case((OutboxRow.status == "pending", 1), else_=0))
        return {i: (utc(at), bool(p)) for i, at, p in session.execute(
            select(OutboxRow.incident_id, func.max(OutboxRow.created_at), pending)
            .where(OutboxRow.kind == kind, OutboxRow.incident_id.in_(incident_ids)).group_by(OutboxRow.incident_id))}

    def of_incidents(self, session: Session, incident_ids: list[int]) -> list[dict[str, Any]]:
        """The notifications of `incident_ids` as the daemon stored them, oldest first: incident_id, kind,
        channel, status, attempts, created_at, sent_at, next_attempt_at and last_error."""
        if not incident_ids:
            return []
        columns = ("incident_id", "kind", "channel", "status", "attempts", "created_at", "sent_at",
                   "next_attempt_at", "last_error")
        rows = session.execute(select(*(getattr(OutboxRow, c) for c in columns))
                               .where(OutboxRow.incident_id.in_(incident_ids)).order_by(OutboxRow.id))
        return [dict(zip(columns, r, strict=True)) for r in rows]
