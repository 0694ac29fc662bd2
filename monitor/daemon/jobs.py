"""The daemon's jobs: a tick (runner.tick, then the AFTER_TICK stages) and a nightly run (retention,
then the NIGHTLY stages). Each stage's failure is isolated: logged, counted, recorded as a job event,
and the next stage still runs.

A stage is any callable `(config, store, now) -> Any`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from monitor.aggregate.profile import stored_profile
from monitor.alerts.evaluate import after_tick
from monitor.config import Config
from monitor.daemon import logs, retention
from monitor.daemon.health import Metrics
from monitor.daemon.nightly import run_nightly
from monitor.daemon.runner import TickReport, tick
from monitor.notify import drain, undeliverable
from monitor.verdicts.stage import load_anchors
from monitor.verdicts.windows import score, store_scored, windows_for
from storage.operations import TickRecord
from storage.store import Store

log = logging.getLogger(__name__)

Stage = Callable[[Config, Store, datetime], Any]

AFTER_TICK: list[Stage] = [after_tick, drain]  # after every tick, in order: alert evaluation, outbox drain
NIGHTLY: list[Stage] = [run_nightly]  # run by the nightly job after retention: label scoring

INSTANCE = f"{socket.gethostname()}:{os.getpid()}"
# One writer at a time inside the daemon: SQLite refuses a read-then-write transaction whose snapshot another
# commit made stale, so job events and heartbeats wait for the running tick instead of breaking it.
DB_WRITES = threading.RLock()


def stage_name(stage: Stage) -> str:
    return f"{getattr(stage, '__module__', '?')}.{getattr(stage, '__qualname__', repr(stage))}"


def record_event(store: Store, now: datetime, job: str, kind: str, message: str, metrics: Metrics | None,
                 instance: str = INSTANCE) -> None:
    """Count and store a job error or missed run (what the alert stage raises an `error` alert from)."""
    if metrics is not None:
        (metrics.job_errors if kind == "error" else metrics.job_missed).labels(job=job).inc()
    try:
        with DB_WRITES, store.transaction() as session:
            store.job_events.add(session, now, job, kind, instance, logs.scrub(store.scrub(message)))
    except Exception as exc:  # the database is down: the log line and the counter still say it
        log.error("cannot record job event", extra={"job": job, "kind": kind, "error": store.scrub(exc)})


def run_stages(job: str, stages: list[Stage], config: Config, store: Store, now: datetime,
               metrics: Metrics | None = None, instance: str = INSTANCE) -> dict[str, Any]:
    """Run each stage in order; one that raises is logged, counted and recorded, and the rest still run.
    Returns each stage's result (or its exception) by stage name."""
    results: dict[str, Any] = {}
    for stage in stages:
        name = stage_name(stage)
        started = time.perf_counter()
        try:
            results[name] = stage(config, store, now)
        except Exception as exc:
            results[name] = exc
            log.exception("stage failed", extra={"job": job, "stage": name})  # redacted by the log filter
            record_event(store, now, f"{job}:{name}", "error", f"{type(exc).__name__}: {exc}", metrics, instance)
        else:
            log.info("stage done", extra={"job": job, "stage": name,
                                          "seconds": round(time.perf_counter() - started, 3)})
    return results


def tick_job(config: Config, store: Store, now: datetime, *, metrics: Metrics | None = None,
             instance: str = INSTANCE) -> list[TickReport]:
    """One scheduled tick at clock `now`: every service's tick, the re-scoring of windows a killed tick
    left unscored, then the AFTER_TICK stages."""
    with DB_WRITES:
        return _tick_job(config, store, now, metrics, instance)


def _tick_job(config: Config, store: Store, now: datetime, metrics: Metrics | None, instance: str,
              ) -> list[TickReport]:
    with store.transaction() as session:
        # With the leader lock held no other tick runs: a tick still marked running was killed mid-way.
        interrupted = store.ticks.running(session)
    reports = tick(config, store, now)
    if interrupted:
        recover(config, store, now, interrupted)
    for report in reports:
        _observe(report, store, now, metrics, instance)
    run_stages("tick", AFTER_TICK, config, store, now, metrics, instance)
    if metrics is not None:
        _gauges(config, store, now, metrics)
    return reports


def nightly_job(config: Config, store: Store, now: datetime, *, metrics: Metrics | None = None,
                instance: str = INSTANCE) -> dict[str, Any]:
    """The nightly run at clock `now`: retention (compaction and expiry), then the NIGHTLY stages."""
    with DB_WRITES:
        return run_stages("nightly", [retention.apply, *NIGHTLY], config, store, now, metrics, instance)


def recover(config: Config, store: Store, now: datetime, interrupted: list[TickRecord]) -> None:
    """Score the windows of the buckets each interrupted tick wrote before it died (its own scoring
    never ran, and the next ticks only score windows their own rows touch), then close it as error.

    Runs after the current tick ingested, so each window is scored on all the rows it will get."""
    services = {s.name: s for s in config.services}
    for dead in interrupted:
        service = services.get(dead.service)
        scored = 0
        if service is not None:
            with store.transaction() as session:
                span = store.partials.updated_span(session, service.name, dead.started_at)
            if span is not None:
                profile, _ = stored_profile(store, service)
                windows = [w for size in service.buckets.windows for w in windows_for(dead.now, size, span)]
                scored = store_scored(store, service.name, score(
                    store, service.name, profile, windows, service.check_params(), service.baseline,
                    anchors=load_anchors(service, store)), dead.id)
        with store.transaction() as session:
            store.ticks.finish(session, dead.id, "error", {}, {
                "error": "interrupted: the process ended during this tick; its committed steps were kept",
                "recovered_at": now.isoformat(), "findings_rescored": scored})
        log.warning("recovered an interrupted tick", extra={"tick_id": dead.id, "service": dead.service,
                                                            "findings": scored})


def _observe(report: TickReport, store: Store, now: datetime, metrics: Metrics | None, instance: str) -> None:
    extra = {"service": report.service, "status": report.status, "seconds": report.seconds,
             "rows_read": sum(report.read.values()), "quarantined": sum(report.quarantined.values()),
             "folded": report.folded, "findings": report.findings}
    for said in report.warnings:
        log.warning(said, extra={"service": report.service, "quarantined_by_field": dict(report.quarantined_fields)})
    if report.status == "ok":
        log.info("tick done", extra={**extra, "warnings": report.warnings})
    else:
        log.error("tick failed", extra={**extra, "error": report.error})
        record_event(store, now, "tick", "error", f"service {report.service}: {report.error}", metrics, instance)
    if metrics is None:
        return
    metrics.ticks.labels(service=report.service, status=report.status).inc()
    metrics.tick_seconds.labels(service=report.service).observe(report.seconds)
    if report.status == "ok":
        metrics.last_success.labels(service=report.service).set(time.time())
    for kind, n in report.read.items():
        metrics.rows_read.labels(service=report.service, kind=kind).inc(n)
    for reason, n in report.quarantined.items():
        metrics.rows_quarantined.labels(service=report.service, reason=reason).inc(n)
    for name, n in report.capped.items():
        metrics.rows_other.labels(service=report.service, field=name).inc(n)


def _gauges(config: Config, store: Store, now: datetime, metrics: Metrics) -> None:
    """Lag, outbox depth and firing alerts, read from the store after each tick; whether notifications
    can be delivered."""
    metrics.undeliverable.set(1 if undeliverable(config) else 0)
    try:
        with store.transaction() as session:
            for service in config.services:
                end = store.partials.newest_end(session, service.name)
                if end is not None:
                    metrics.lag.labels(service=service.name).set(max(0.0, (now - end).total_seconds()))
            metrics.outbox_depth.set(store.outbox.depth(session))
            metrics.active_alerts.set(store.alerts.firing(session))
    except Exception as exc:
        log.warning("cannot read gauges from the store", extra={"error": store.scrub(exc)})
