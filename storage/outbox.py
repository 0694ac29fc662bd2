"""The durable outbox of notifications."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage.database import Repository
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

    def due(self, session: Session, now: datetime, limit: int) -> list[tuple[int, int | None]]:
        """(id, incident_id) of the pending notifications due at `now`, oldest first, at most `limit`."""
        return [(i, incident) for i, incident in session.execute(
            select(OutboxRow.id, OutboxRow.incident_id).where(
                OutboxRow.status == "pending", OutboxRow.next_attempt_at <= now).order_by(OutboxRow.id).limit(limit))]

    def earlier_unsent(self, session: Session, incident_id: int, item_id: int) -> bool:
        """Whether incident `incident_id` has a notification older than `item_id` not sent yet."""
        return session.scalar(select(OutboxRow.id).where(
            OutboxRow.incident_id == incident_id, OutboxRow.id < item_id, OutboxRow.status != "sent").limit(1)) is not None

    def of_incidents(self, session: Session, incident_ids: list[int]) -> list[tuple[int, str, str | None]]:
        """(incident_id, status, last_error) of the notifications of `incident_ids`, oldest first."""
        if not incident_ids:
            return []
        return [tuple(r) for r in session.execute(select(OutboxRow.incident_id, OutboxRow.status, OutboxRow.last_error)
                                                  .where(OutboxRow.incident_id.in_(incident_ids)).order_by(OutboxRow.id))]
