"""The store: one database and a repository per aggregate, e.g. `store.partials.upsert(session, ...)`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from storage.alerts import Alerts, Incidents, Silences
from storage.database import Database, utc_now
from storage.findings import Findings, Verdicts
from storage.labels import Labels
from storage.offsets import JoinBuffer, Offsets, Quarantine
from storage.operations import Backfills, Heartbeats, JobEvents, Retention, Ticks
from storage.outbox import Outbox
from storage.partials import Partials, Profiles
from storage.versions import Versions


class Store(Database):
    """A tailwatch database and its repositories; each repository reads the store's `clock`."""

    def __init__(self, url: str, password: str | None = None, *, connect_args: dict[str, Any] | None = None,
                 clock: Callable[[], datetime] = utc_now) -> None:
        super().__init__(url, password, connect_args=connect_args, clock=clock)

        def clock() -> datetime:
            return self.clock()  # looked up at each call: a test may set `store.clock`

        self.offsets = Offsets(clock)
        self.quarantine = Quarantine(clock)
        self.pending = JoinBuffer(clock)
        self.partials = Partials(clock)
        self.profiles = Profiles(clock)
        self.findings = Findings(clock)
        self.verdicts = Verdicts(clock)
        self.labels = Labels(clock)
        self.versions = Versions(clock)
        self.alerts = Alerts(clock)
        self.incidents = Incidents(clock)
        self.silences = Silences(clock)
        self.outbox = Outbox(clock)
        self.ticks = Ticks(clock)
        self.heartbeats = Heartbeats(clock)
        self.job_events = JobEvents(clock)
        self.backfills = Backfills(clock)
        self.retention = Retention(clock)
