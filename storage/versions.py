"""Version sightings and acceptances: what a new version is compared with."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.database import Repository, utc
from storage.models import VersionAccepted, VersionSeen


class Versions(Repository):
    """Version values first seen per service and kind, and the versions accepted as good."""

    def record(self, session: Session, service: str, kind: str,
               first_seen: dict[str, datetime]) -> list[str]:
        """Remember when each version value of `kind` was first seen (event time); an earlier sighting
        of a known value moves its first_seen back. Returns the values seen for the first time."""
        if not first_seen:
            return []
        stored = {r.value: r for r in session.scalars(select(VersionSeen).where(
            VersionSeen.service == service, VersionSeen.kind == kind,
            VersionSeen.value.in_(list(first_seen))))}
        new = []
        for value, seen in sorted(first_seen.items()):
            seen = utc(seen)
            if value in stored:
                if seen < stored[value].first_seen:
                    stored[value].first_seen = seen  # a late row of an older window
                continue
            session.add(VersionSeen(service=service, kind=kind, value=value, first_seen=seen,
                                    recorded_at=self.clock()))
            new.append(value)
        session.flush()
        return new

    def load(self, session: Session, service: str) -> list[dict[str, Any]]:
        """Every version first-sighting of `service` (kind, value, first_seen), oldest first."""
        query = (select(VersionSeen).where(VersionSeen.service == service)
                 .order_by(VersionSeen.first_seen, VersionSeen.kind, VersionSeen.value))
        return [{"kind": v.kind, "value": v.value, "first_seen": v.first_seen} for v in session.scalars(query)]

    def accept(self, session: Session, service: str, value: str, at: datetime, by: str = "",
               comment: str = "") -> bool:
        """Accept version `value` of `service` as good at `at`; False when it was accepted already."""
        if session.get(VersionAccepted, (service, value)) is not None:
            return False
        session.add(VersionAccepted(service=service, value=value, accepted_at=utc(at), accepted_by=by,
                                    comment=comment))
        session.flush()
        return True

    def load_accepted(self, session: Session, service: str) -> list[dict[str, Any]]:
        """The version values of `service` accepted with `tailwatch accept` (value, accepted_at, accepted_by,
        comment), oldest first."""
        query = (select(VersionAccepted).where(VersionAccepted.service == service)
                 .order_by(VersionAccepted.accepted_at, VersionAccepted.value))
        return [{"value": a.value, "accepted_at": a.accepted_at, "accepted_by": a.accepted_by,
                 "comment": a.comment} for a in session.scalars(query)]
