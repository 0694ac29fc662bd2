"""Ticks, daemon heartbeats, job events, backfill runs and retention."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from storage.database import Repository, between, given
from storage.models import BackfillProgress, DaemonHeartbeat, JobEvent, Outbox, QuarantineRow, Tick

TICK_STATUSES = ("running", "ok", "error")
TICK_COUNTS = ("rows_read", "accepted", "quarantined", "joined", "unmatched", "duplicates")


@dataclass(frozen=True, slots=True)
class TickRecord:
    """A stored tick: when it ran, against which clock, how it ended, and its row counts."""

    id: int
    service: str
    started_at: datetime
    finished_at: datetime | None
    now: datetime
    status: str
    counts: dict[str, int]
    summary: Any


class Ticks(Repository):
    """Ticks: when each ran, against which clock, how it ended, its row counts."""

    def start(self, session: Session, service: str, now: datetime) -> int:
        """Record a tick as running against clock `now`; returns its id."""
        tick = Tick(service=service, started_at=self.clock(), now=now, status="running")
        session.add(tick)
        session.flush()
        return tick.id

    def finish(
        self, session: Session, tick_id: int, status: str, counts: dict[str, int], summary: Any
    ) -> None:
        """Close a tick with its final status ('ok' or 'error'), row counts and JSON summary."""
        if status not in TICK_STATUSES:
            raise ValueError(f"tick status {status!r} is not one of {TICK_STATUSES}")
        unknown = set(counts) - set(TICK_COUNTS)
        if unknown:
            raise ValueError(f"unknown tick counts {sorted(unknown)}; known: {TICK_COUNTS}")
        tick = session.get(Tick, tick_id)
        if tick is None:
            raise LookupError(f"no tick with id {tick_id}")
        tick.status = status
        tick.finished_at = self.clock()
        for name, value in counts.items():
            setattr(tick, name, int(value))
        tick.summary = summary
        session.flush()

    def last(self, session: Session, service: str, limit: int = 10) -> list[TickRecord]:
        """The `limit` most recent ticks of `service`, newest first."""
        rows = session.scalars(
            select(Tick).where(Tick.service == service).order_by(Tick.id.desc()).limit(limit)
        ).all()
        return [_record(t) for t in rows]

    def last_read(self, session: Session, service: str, until: datetime) -> TickRecord | None:
        """The newest tick of `service` with its clock at or before `until` that read any rows; None if none."""
        row = session.scalars(select(Tick).where(Tick.service == service, Tick.rows_read > 0, Tick.now <= until)
                              .order_by(Tick.id.desc()).limit(1)).first()
        return None if row is None else _record(row)

    def running(self, session: Session, service: str | None = None) -> list[TickRecord]:
        """Ticks still marked running, oldest first: with the leader lock held, ticks a killed process left."""
        query = select(Tick).where(Tick.status == "running")
        query = query.where(*given((Tick.service, service)))
        return [_record(t) for t in session.scalars(query.order_by(Tick.id))]

    def search(self, session: Session, service: str, since: datetime | None = None, until: datetime | None = None,
               status: str | None = None, limit: int | None = None) -> list[TickRecord]:
        """Ticks of `service` whose clock (`now`) is in [since, until), newest first (the newest `limit`)."""
        query = select(Tick).where(Tick.service == service, *between(Tick.now, since, until))
        query = query.where(*given((Tick.status, status)))
        query = query.order_by(Tick.id.desc())
        if limit is not None:
            query = query.limit(limit)
        return [_record(t) for t in session.scalars(query)]


def _record(t: Tick) -> TickRecord:
    return TickRecord(id=t.id, service=t.service, started_at=t.started_at, finished_at=t.finished_at, now=t.now,
                      status=t.status, counts={name: getattr(t, name) for name in TICK_COUNTS}, summary=t.summary)


class Heartbeats(Repository):
    """The last heartbeat of each daemon instance."""

    def beat(self, session: Session, instance: str, role: str, started_at: datetime, at: datetime,
             last_tick_at: datetime | None = None, last_tick_status: str | None = None) -> None:
        """Record that daemon `instance` (host:pid) is alive as `role` at `at`."""
        row = session.get(DaemonHeartbeat, instance)
        if row is None:
            row = DaemonHeartbeat(instance=instance, started_at=started_at)
            session.add(row)
        row.role, row.beat_at = role, at
        if last_tick_at is not None:
            row.last_tick_at, row.last_tick_status = last_tick_at, last_tick_status
        session.flush()

    def load(self, session: Session) -> list[dict[str, Any]]:
        """Every daemon's last heartbeat, newest first."""
        rows = session.scalars(select(DaemonHeartbeat).order_by(DaemonHeartbeat.beat_at.desc()))
        return [{c: getattr(r, c) for c in ("instance", "role", "started_at", "beat_at", "last_tick_at",
                                            "last_tick_status")} for r in rows]


class JobEvents(Repository):
    """Failed jobs and runs the scheduler missed."""

    def add(self, session: Session, at: datetime, job: str, kind: str, instance: str,
            message: str) -> None:
        """Record a failed job (`kind` error) or a run the scheduler missed (`kind` missed)."""
        session.add(JobEvent(at=at, job=job, kind=kind, instance=instance, message=message[:2000]))
        session.flush()

    def load(self, session: Session, since: datetime, until: datetime | None = None,
             ) -> list[dict[str, Any]]:
        """Job errors and missed runs with `at` in [since, until), oldest first."""
        query = select(JobEvent).where(JobEvent.at >= since)
        if until is not None:
            query = query.where(JobEvent.at < until)
        return [{c: getattr(e, c) for c in ("id", "at", "job", "kind", "instance", "message")}
                for e in session.scalars(query.order_by(JobEvent.id))]


class Backfills(Repository):
    """Backfill runs and how far each reached."""

    def start(self, session: Session, since: datetime, until: datetime, step_seconds: int,
              staging: str) -> int:
        """Record a new backfill run; returns its id."""
        now = self.clock()
        row = BackfillProgress(since=since, until=until, step_seconds=step_seconds, reached=None,
                               status="running", staging=staging, started_at=now, updated_at=now)
        session.add(row)
        session.flush()
        return row.id

    def open(self, session: Session) -> dict[str, Any] | None:
        """The unfinished backfill run, if any."""
        row = session.scalars(select(BackfillProgress).where(BackfillProgress.status == "running")
                              .order_by(BackfillProgress.id.desc()).limit(1)).first()
        return None if row is None else _run(row)

    def get(self, session: Session, run_id: int) -> dict[str, Any] | None:
        """Backfill run `run_id` (its range, step, reach, status and start), or None."""
        row = session.get(BackfillProgress, run_id)
        return None if row is None else _run(row)

    def advance(self, session: Session, run_id: int, reached: datetime, status: str = "running") -> None:
        """Mark a backfill's steps done up to clock `reached` (and `status` done when finished)."""
        row = session.get(BackfillProgress, run_id)
        if row is None:
            raise LookupError(f"no backfill run with id {run_id}")
        row.reached, row.status, row.updated_at = reached, status, self.clock()
        session.flush()


def _run(row: BackfillProgress) -> dict[str, Any]:
    return {c: getattr(row, c) for c in ("id", "since", "until", "step_seconds", "reached", "status", "staging",
                                         "started_at", "updated_at")}


class Retention(Repository):
    """Deletion of rows past their retention."""

    def expire(self, session: Session, what: str, before: datetime) -> int:
        """Delete rows of `what` (quarantine, outbox_sent, ticks, job_events) older than `before`; how many."""
        queries = {
            "quarantine": delete(QuarantineRow).where(QuarantineRow.created_at < before),
            "outbox_sent": delete(Outbox).where(Outbox.status == "sent", Outbox.sent_at < before),
            # A running tick is never expired: recovery looks for it.
            "ticks": delete(Tick).where(Tick.status != "running", Tick.now < before),
            "job_events": delete(JobEvent).where(JobEvent.at < before),
        }
        return session.execute(queries[what]).rowcount or 0
