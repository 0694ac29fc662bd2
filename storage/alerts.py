"""Alert state, incidents and silences."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage.database import Repository, as_dict, between, given
from storage.models import AlertCursor, AlertState, Incident, Silence


class Alerts(Repository):
    """The stored state of each alert, and how far each service's alert evaluation has read."""

    def load(self, session: Session, service: str | None = None, alertnames: tuple[str, ...] | None = None,
             states: tuple[str, ...] | None = None, by_name: bool = False) -> list[AlertState]:
        """The stored alerts (of `service`, `alertnames` and `states` when given), by service and alert name
        when `by_name`; mapped rows, updated in the session's unit of work."""
        query = select(AlertState)
        query = query.where(*given((AlertState.service, service)))
        if alertnames is not None:
            query = query.where(AlertState.alertname.in_(alertnames))
        if states is not None:
            query = query.where(AlertState.state.in_(states))
        if by_name:
            query = query.order_by(AlertState.service, AlertState.alertname)
        return list(session.scalars(query))

    def add(self, session: Session, fingerprint: str) -> AlertState:
        """A new alert row for `fingerprint`, added to the session (the caller fills it in)."""
        row = AlertState(fingerprint=fingerprint)
        session.add(row)
        return row

    def cursor(self, session: Session, service: str) -> AlertCursor | None:
        """How far `service`'s alert evaluation has read (the last tick id, when); None before the first."""
        return session.get(AlertCursor, service)

    def save_cursor(self, session: Session, service: str, last_tick_id: int, at: datetime) -> None:
        """Record that `service`'s alert evaluation has read the ticks up to `last_tick_id` at `at`."""
        row = session.get(AlertCursor, service)
        if row is None:
            session.add(AlertCursor(service=service, last_tick_id=last_tick_id, updated_at=at))
        else:
            row.last_tick_id, row.updated_at = last_tick_id, at

    def firing(self, session: Session) -> int:
        """Alerts in state firing."""
        return int(session.scalar(select(func.count()).select_from(AlertState).where(AlertState.state == "firing"))
                   or 0)


class Incidents(Repository):
    """Incidents: onset, resolution and status."""

    def get(self, session: Session, incident_id: int) -> Incident | None:
        """Incident `incident_id` (a mapped row), or None."""
        return session.get(Incident, incident_id)

    def load_open(self, session: Session) -> list[Incident]:
        """The open incidents, as mapped rows."""
        return list(session.scalars(select(Incident).where(Incident.status == "open")))

    def add(self, session: Session, **fields: Any) -> Incident:
        """A new incident with `fields` (columns), added to the session."""
        row = Incident(**fields)
        session.add(row)
        return row

    @staticmethod
    def as_dict(incident: Incident) -> dict[str, Any]:
        """The incident as a dict of every column."""
        return as_dict(incident)

    def search(self, session: Session, service: str, since: datetime | None = None, until: datetime | None = None,
               model_version: str | None = None, status: str | None = None, incident_id: int | None = None,
               ) -> list[dict[str, Any]]:
        """Incidents of `service` opened in [since, until), oldest first, as dicts of every column."""
        query = select(Incident).where(Incident.service == service, *between(Incident.opened_at, since, until))
        query = query.where(*given((Incident.model_version, model_version),
                                   (Incident.status, status),
                                   (Incident.id, incident_id)))
        return [as_dict(i) for i in session.scalars(query.order_by(Incident.opened_at, Incident.id))]

    def load(self, session: Session, service: str | None = None, status: str | None = None,
             limit: int | None = None) -> list[dict[str, Any]]:
        """Incidents, newest first, as dicts of every column."""
        query = select(Incident)
        query = query.where(*given((Incident.service, service), (Incident.status, status)))
        query = query.order_by(Incident.id.desc())
        if limit is not None:
            query = query.limit(limit)
        cols = [c.key for c in Incident.__table__.columns]
        return [{c: getattr(i, c) for c in cols} for i in session.scalars(query)]


class Silences(Repository):
    """Silences: matchers and the span they hold for."""

    def add(self, session: Session, matchers: list[dict[str, str]], created_by: str, comment: str,
            starts_at: datetime, ends_at: datetime) -> int:
        """Store a silence; returns its id."""
        if ends_at <= starts_at:
            raise ValueError(f"a silence must end after it starts ({starts_at} .. {ends_at})")
        if not matchers:
            raise ValueError("a silence needs at least one matcher")
        row = Silence(matchers=matchers, created_by=created_by, comment=comment, starts_at=starts_at,
                      ends_at=ends_at, created_at=self.clock())
        session.add(row)
        session.flush()
        return row.id

    def load(self, session: Session, now: datetime | None = None) -> list[dict[str, Any]]:
        """Silences (only those in force at `now` when given), oldest first."""
        query = select(Silence).order_by(Silence.id)
        if now is not None:
            query = query.where(Silence.starts_at <= now, Silence.ends_at > now)
        cols = [c.key for c in Silence.__table__.columns]
        return [{c: getattr(s, c) for c in cols} for s in session.scalars(query)]

    def expire(self, session: Session, silence_id: int, now: datetime) -> bool:
        """End silence `silence_id` at `now`; False when there is no such silence or it already ended."""
        row = session.get(Silence, silence_id)
        if row is None or row.ends_at <= now:
            return False
        row.ends_at = max(now, row.starts_at)
        session.flush()
        return True
