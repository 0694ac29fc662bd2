"""`tailwatch run`: the long-running daemon.

One process per deployment schedules; others wait for the leader lock. The leader runs the tick job on an
interval and the nightly job on a cron; heartbeats feed `/livez`, the database and systemd's watchdog.
SIGTERM or SIGINT: no new run starts, the running tick finishes (or, past the bound, is abandoned and its
open transaction rolls back), the AFTER_TICK stages (outbox drain) get a last attempt, and the process
exits 0 within `daemon.shutdown_timeout`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from datetime import UTC, datetime, timedelta

from monitor.config import Config
from monitor.daemon import jobs, leader, scheduler
from monitor.daemon.health import Health, Metrics, serve
from monitor.daemon.model_metrics import ModelMetrics
from monitor.notify import undeliverable
from storage.lock import for_store
from storage.store import Store

log = logging.getLogger(__name__)

FINAL_STAGES_SHARE = 0.3  # of the shutdown bound kept for the last AFTER_TICK attempt


def notify(message: str, address: str | None = None) -> bool:
    """Send `message` (e.g. READY=1, WATCHDOG=1) to systemd's $NOTIFY_SOCKET; False when not under systemd."""
    address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log.warning("cannot notify systemd", extra={"error": str(exc)})
        return False
    return True


def watchdog_interval() -> float | None:
    """Half of systemd's WatchdogSec (from $WATCHDOG_USEC) in seconds, when the watchdog is for this process."""
    usec, pid = os.environ.get("WATCHDOG_USEC"), os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2e6


class Daemon:
    """The daemon's state across leadership terms; `run()` blocks until stopped and returns the exit code."""

    def __init__(self, config: Config, store: Store, *, instance: str = jobs.INSTANCE) -> None:
        self.config, self.store, self.instance = config, store, instance
        d = config.daemon
        self.metrics = Metrics(ModelMetrics(config, store))
        self.health = Health(store, d.heartbeat_max_age.total_seconds(), self.metrics,
                             notifications=lambda: undeliverable(config))
        self.lock = for_store(store, d.lock_key)
        self.fenced = leader.Fenced(store, self.lock)  # what the jobs write through
        self.stop = threading.Event()
        self.started_at = datetime.now(UTC)
        self.server = None
        self._sched = None
        self._lost = False
        self._busy = threading.Condition()
        self._running = 0  # jobs in progress (tick or nightly)
        self._last_tick: tuple[datetime, str] | None = None

    # -- signals and jobs ------------------------------------------------------------------

    def request_stop(self, signum: int | None = None, _frame=None) -> None:
        if not self.stop.is_set():
            log.info("stopping", extra={"signal": signal.Signals(signum).name if signum else None})
        self.stop.set()
        self._shutdown_scheduler()

    def _shutdown_scheduler(self) -> None:
        sched = self._sched
        if sched is not None and sched.running:
            # From a signal handler or a job thread: another thread, so no lock of the scheduler is re-entered.
            threading.Thread(target=sched.shutdown, kwargs={"wait": False}, daemon=True).start()

    def _job(self, name: str, fn) -> None:
        if self.stop.is_set():
            return  # stopping: no new run starts
        with self._busy:
            self._running += 1
        try:
            fn(self.config, self.fenced, datetime.now(UTC), metrics=self.metrics, instance=self.instance)
        finally:
            with self._busy:
                self._running -= 1
                self._busy.notify_all()

    def _tick(self) -> None:
        def run(config, store, now, **kw):
            reports = jobs.tick_job(config, store, now, **kw)
            self._last_tick = (now, "ok" if all(r.status == "ok" for r in reports) else "error")
            self._store_beat("leader")

        self._job(scheduler.TICK, run)

    def _nightly(self) -> None:
        self._job(scheduler.NIGHTLY, jobs.nightly_job)

    def _heartbeat(self) -> None:
        """Feeds /livez and systemd's watchdog; runs beside a long tick (its own scheduler job)."""
        if self.stop.is_set():  # a stop that came while the scheduler was starting: shut it down now
            self._shutdown_scheduler()
        self.health.beat()
        notify("WATCHDOG=1")

    def _store_beat(self, role: str) -> None:
        last_at, last_status = self._last_tick or (None, None)
        try:
            with jobs.DB_WRITES, self.store.transaction() as session:
                self.store.heartbeats.beat(session, self.instance, role, self.started_at, datetime.now(UTC), last_at, last_status)
        except Exception as exc:  # a heartbeat row is informative; the probe and the watchdog do not need it
            log.warning("cannot store heartbeat", extra={"error": self.store.scrub(exc)})

    def _record(self, job: str, kind: str, message: str) -> None:
        # On its own thread: it waits for a running tick (jobs.DB_WRITES) without holding up the scheduler.
        threading.Thread(target=jobs.record_event, daemon=True, name="job-event",
                         args=(self.store, datetime.now(UTC), job, kind, message, self.metrics, self.instance)).start()

    def _check_leader(self) -> None:
        if self.lock.alive():
            return
        log.error("leader lock lost: stopping scheduling", extra={"lock": self.lock.kind})
        self._lost = True
        self.metrics.is_leader.set(0)
        self._record("leader", "error", "leader lock lost; scheduling stopped")
        self._shutdown_scheduler()

    def _on_error(self, job_id: str, exc: BaseException) -> None:
        log.error("job raised", extra={"job": job_id, "error": f"{type(exc).__name__}: {exc}"})
        self._record(job_id, "error", f"{type(exc).__name__}: {exc}")

    def _on_missed(self, job_id: str, why: str) -> None:
        log.warning("job run missed", extra={"job": job_id, "why": why})
        self._record(job_id, "missed", why)

    # -- main loop ---------------------------------------------------------------------------

    def run(self) -> int:
        d = self.config.daemon
        if threading.current_thread() is threading.main_thread():  # embedded (tests) in a thread: stop() instead
            signal.signal(signal.SIGTERM, self.request_stop)
            signal.signal(signal.SIGINT, self.request_stop)
        if d.health.port is not None:
            self.server = serve(self.health, d.health.host, d.health.port)
        why = self.health.check_notifications()
        if why:
            # The daemon still runs (alerts are tracked and wait in the outbox), but says it at once.
            log.error("notifications undeliverable: %s", why, extra={"reason": why})
        self.health.beat()
        notify(f"READY=1\nSTATUS=waiting for the leader lock ({self.lock.kind})\nMAINPID={os.getpid()}")
        beat_every = min(d.heartbeat_interval.total_seconds(), watchdog_interval() or float("inf"))
        try:
            while not self.stop.is_set():
                if not self.lock.acquire():
                    self._heartbeat()
                    if self.store.url.get_backend_name() != "sqlite":  # on SQLite it would contend with the leader
                        self._store_beat("follower")
                    self.stop.wait(min(d.lock_retry.total_seconds(), beat_every))
                    continue
                self._lead(beat_every)
        finally:
            self._finish()
        return 0

    def _lead(self, beat_every: float) -> None:
        d = self.config.daemon
        log.info("leader lock acquired: scheduling", extra={"lock": self.lock.kind, "instance": self.instance})
        notify("STATUS=leader: scheduling ticks")
        self.metrics.is_leader.set(1)
        self._lost = False
        self._sched = scheduler.build(
            tick=self._tick, interval=d.interval, tick_grace=d.tick_misfire_grace,
            nightly=self._nightly, nightly_cron=d.nightly, nightly_grace=d.nightly_misfire_grace,
            heartbeat=self._heartbeat, heartbeat_interval=timedelta(seconds=beat_every),
            leader_check=self._check_leader, leader_interval=d.leader_check,
            on_error=self._on_error, on_missed=self._on_missed)
        if self.stop.is_set():
            return
        self._sched.start()  # blocks until request_stop or a lost lock shuts it down
        self._sched = None
        self.metrics.is_leader.set(0)
        if self._lost:
            self._wait_idle(d.shutdown_timeout.total_seconds())
            self.lock.release()
            notify("STATUS=lost the leader lock; waiting for it again")

    def _wait_idle(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        with self._busy:
            while self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._busy.wait(left)
        return True

    def _finish(self) -> None:
        """The shutdown path: wait for the running job, give AFTER_TICK a last try, release, exit in bound."""
        notify("STOPPING=1")
        bound = self.config.daemon.shutdown_timeout.total_seconds()
        started = time.monotonic()
        idle = self._wait_idle(bound * (1 - FINAL_STAGES_SHARE))
        if idle and self.lock.alive() and jobs.AFTER_TICK:
            left = bound - (time.monotonic() - started) - 0.5
            last = threading.Thread(target=jobs.run_stages, daemon=True, name="final-stages",
                                    args=("shutdown", jobs.AFTER_TICK, self.config, self.fenced, datetime.now(UTC),
                                          self.metrics, self.instance))
            last.start()
            last.join(max(0.0, left))
            idle = not last.is_alive()
        self.lock.release()
        if self.server is not None:
            self.server.shutdown()
        if not idle:
            # The running job's open transaction dies with the process and rolls back; its committed steps
            # stand, and the next start re-scores what it left (jobs.recover).
            log.error("shutdown bound reached with work still running: exiting now",
                      extra={"bound_s": bound})
            logging.shutdown()
            os._exit(0)
        log.info("stopped", extra={"seconds": round(time.monotonic() - started, 3)})
        self.store.dispose()
