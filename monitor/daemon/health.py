"""Health and metrics over HTTP: `/livez` (heartbeat age), `/readyz` (database reachable, schema current,
notifications deliverable), `/metrics` (Prometheus text format), from a small server on a background thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.registry import Collector

from storage.database import StoreError
from storage.store import Store

log = logging.getLogger(__name__)

TICK_SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    """The daemon's Prometheus metrics, on a registry of their own (one per daemon, so tests can run several),
    and `model`'s series of the monitored model when given (monitor.daemon.model_metrics)."""

    def __init__(self, model: Collector | None = None) -> None:
        self.registry = r = CollectorRegistry()
        if model is not None:
            r.register(model)
        self.ticks = Counter("tailwatch_ticks", "Service ticks run, by outcome.", ["service", "status"], registry=r)
        self.tick_seconds = Histogram("tailwatch_tick_duration_seconds", "Wall time of one service tick.",
                                      ["service"], buckets=TICK_SECONDS_BUCKETS, registry=r)
        self.last_success = Gauge("tailwatch_last_success_timestamp_seconds",
                                  "Unix time of the last tick that ended ok.", ["service"], registry=r)
        self.rows_read = Counter("tailwatch_rows_read", "Input rows read.", ["service", "kind"], registry=r)
        self.rows_quarantined = Counter("tailwatch_rows_quarantined", "Input rows quarantined, by reason.",
                                        ["service", "reason"], registry=r)
        self.rows_other = Counter("tailwatch_rows_folded_other", "Rows folded into the <other> bucket of a field "
                                  "past its limits.max_* cap (model_version, stage, a segment column).",
                                  ["service", "field"], registry=r)
        self.lag = Gauge("tailwatch_lag_seconds",
                         "Tick clock minus the end of the newest stored bucket (how far data is behind).",
                         ["service"], registry=r)
        self.outbox_depth = Gauge("tailwatch_outbox_depth", "Notifications waiting to be sent.", registry=r)
        self.active_alerts = Gauge("tailwatch_active_alerts", "Alerts in state firing.", registry=r)
        self.is_leader = Gauge("tailwatch_is_leader", "1 while this process holds the leader lock.", registry=r)
        self.job_errors = Counter("tailwatch_job_errors", "Scheduled jobs (or their stages) that raised.",
                                  ["job"], registry=r)
        self.job_missed = Counter("tailwatch_job_missed", "Scheduled runs missed or skipped.", ["job"], registry=r)
        self.heartbeat = Gauge("tailwatch_heartbeat_timestamp_seconds", "Unix time of the last heartbeat.",
                               registry=r)
        self.undeliverable = Gauge("tailwatch_notifications_undeliverable",
                                   "1 while notifications are configured but cannot be delivered (a Slack secret "
                                   "missing or unreadable; /readyz says why), else 0.", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class Health:
    """What the probes read: the last heartbeat (monotonic clock), the store, and `notifications`, which
    says why notifications cannot be delivered ('' when they can)."""

    def __init__(self, store: Store, max_age_s: float, metrics: Metrics,
                 notifications: Callable[[], str] | None = None) -> None:
        self.store, self.max_age_s, self.metrics = store, max_age_s, metrics
        self.notifications = notifications
        self._beat = time.monotonic()
        self._lock = threading.Lock()

    def beat(self) -> None:
        with self._lock:
            self._beat = time.monotonic()
        self.metrics.heartbeat.set(time.time())

    def live(self) -> tuple[bool, str]:
        """Alive while the last heartbeat is younger than max_age_s."""
        with self._lock:
            age = time.monotonic() - self._beat
        ok = age <= self.max_age_s
        return ok, f"heartbeat {age:.1f}s ago (limit {self.max_age_s:g}s)"

    def ready(self) -> tuple[bool, str]:
        """Ready when the database answers, its schema is this code's head revision, and the configured
        notifications can be delivered."""
        try:
            self.store.ensure_current()
        except Exception as exc:  # StoreError / SchemaError / driver errors: all mean "not ready"
            return False, str(exc) if isinstance(exc, StoreError) else self.store.scrub(exc)
        why = self.check_notifications()
        if why:
            return False, f"database reachable, schema current; notifications undeliverable: {why}"
        return True, "database reachable, schema current"

    def check_notifications(self) -> str:
        """Why notifications cannot be delivered ('' when they can), kept in the metric as well."""
        why = self.notifications() if self.notifications is not None else ""
        self.metrics.undeliverable.set(1 if why else 0)
        return why


def serve(health: Health, host: str, port: int) -> ThreadingHTTPServer:
    """Start the probe server on host:port in a daemon thread; returns it (server_address has the real
    port when `port` is 0)."""
    routes: dict[str, Callable[[], tuple[int, bytes, str]]] = {
        "/livez": lambda: _probe(health.live()),
        "/readyz": lambda: _probe(health.ready()),
        "/metrics": lambda: (200, health.metrics.render(), CONTENT_TYPE_LATEST),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            route = routes.get(self.path.split("?", 1)[0])
            if route is None:
                status, body, ctype = 404, b"not found: try /livez, /readyz, /metrics\n", "text/plain"
            else:
                try:
                    status, body, ctype = route()
                except Exception as exc:
                    log.exception("health endpoint %s failed", self.path)
                    status, body, ctype = 500, f"{type(exc).__name__}\n".encode(), "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - probes every few seconds are noise
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    log.info("health server listening", extra={"host": server.server_address[0], "port": server.server_address[1]})
    return server


def _probe(result: tuple[bool, str]) -> tuple[int, bytes, str]:
    ok, why = result
    return (200 if ok else 503), f"{'ok' if ok else 'fail'}: {why}\n".encode(), "text/plain; charset=utf-8"
