"""The APScheduler wiring: every `apscheduler` import of tailwatch lives in this module.

A `BlockingScheduler` in UTC runs the tick job on an interval and the nightly job on a cron; both with
coalesce (a backlog of missed runs runs once), max_instances=1 (a slow tick never overlaps the next) and
their own misfire grace. Errors and missed runs reach `on_error` / `on_missed`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, timedelta

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    JobExecutionEvent,
    JobSubmissionEvent,
)
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

log = logging.getLogger(__name__)

TICK, NIGHTLY, HEARTBEAT, LEADER_CHECK = "tick", "nightly", "heartbeat", "leader_check"
# The tick and nightly jobs may run at the same time; heartbeat and the leader check must never wait
# behind them (systemd's watchdog and /livez read the heartbeat).
WORKERS = 4


def build(
    *,
    tick: Callable[[], object],
    interval: timedelta,
    tick_grace: timedelta,
    nightly: Callable[[], object] | None,
    nightly_cron: str | None,
    nightly_grace: timedelta,
    heartbeat: Callable[[], object],
    heartbeat_interval: timedelta,
    leader_check: Callable[[], object] | None,
    leader_interval: timedelta,
    on_error: Callable[[str, BaseException], None],
    on_missed: Callable[[str, str], None],
) -> BlockingScheduler:
    """A UTC BlockingScheduler holding the tick, nightly (when given a cron), heartbeat and leader-check jobs;
    the first tick and heartbeat run at once."""
    scheduler = BlockingScheduler(
        timezone=UTC,
        executors={"default": ThreadPoolExecutor(WORKERS)},
        job_defaults={"coalesce": True, "max_instances": 1},
    )
    scheduler.add_job(tick, IntervalTrigger(seconds=interval.total_seconds(), timezone=UTC), id=TICK, name=TICK,
                      misfire_grace_time=_seconds(tick_grace), next_run_time=_now())
    if nightly is not None and nightly_cron:
        scheduler.add_job(nightly, CronTrigger.from_crontab(nightly_cron, timezone=UTC), id=NIGHTLY, name=NIGHTLY,
                          misfire_grace_time=_seconds(nightly_grace))
    scheduler.add_job(heartbeat, IntervalTrigger(seconds=heartbeat_interval.total_seconds(), timezone=UTC),
                      id=HEARTBEAT, name=HEARTBEAT, misfire_grace_time=_seconds(heartbeat_interval),
                      next_run_time=_now())
    if leader_check is not None:
        scheduler.add_job(leader_check, IntervalTrigger(seconds=leader_interval.total_seconds(), timezone=UTC),
                          id=LEADER_CHECK, name=LEADER_CHECK, misfire_grace_time=_seconds(leader_interval))

    def listener(event: JobExecutionEvent | JobSubmissionEvent) -> None:
        if event.code == EVENT_JOB_ERROR:
            on_error(event.job_id, event.exception)
        elif event.code == EVENT_JOB_MISSED:
            on_missed(event.job_id, f"run due at {event.scheduled_run_time.isoformat()} missed its grace time")
        elif event.code == EVENT_JOB_MAX_INSTANCES:
            times = ", ".join(t.isoformat() for t in event.scheduled_run_times)
            on_missed(event.job_id, f"run due at {times} skipped: the previous run is still going")

    scheduler.add_listener(listener, EVENT_JOB_ERROR | EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
    return scheduler


def _seconds(value: timedelta) -> int:
    return max(1, int(value.total_seconds()))


def _now():
    from datetime import datetime

    return datetime.now(UTC)
