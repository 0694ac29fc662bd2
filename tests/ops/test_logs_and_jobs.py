"""JSON logs with secrets redacted; stage isolation; the scheduler's missed runs and errors; config checks."""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from opsfeed import write_config

from monitor import config as config_mod
from monitor.config import ConfigError
from monitor.daemon import jobs, logs, scheduler
from monitor.daemon import service as daemon
from monitor.daemon.health import Metrics

CANARY = "s3cr3t/canary+token=="


def test_json_lines_never_hold_a_configured_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("TW_CANARY", CANARY)
    cfg = config_mod.load(write_config(tmp_path, redact=[{"env": "TW_CANARY"}, {"env": "TW_UNSET"}]))
    stream = io.StringIO()
    logs.setup("json", "INFO", logs.config_secrets(cfg), stream=stream)
    log = logging.getLogger("tailwatch.test")
    try:
        log.info("connecting with %s", CANARY, extra={"url": f"postgresql://u:{CANARY}@db/x"})
        try:
            raise RuntimeError(f"auth failed for token {CANARY}")
        except RuntimeError:
            log.exception("call failed")
        log.warning("quoted form %s", "s3cr3t%2Fcanary%2Btoken%3D%3D")
        assert logs.scrub(f"token {CANARY}") == "token ***"  # for messages stored or sent, not only logged
    finally:
        logs.setup("text", "WARNING", stream=io.StringIO())
    lines = stream.getvalue().splitlines()
    events = [json.loads(line) for line in lines]  # one JSON object per line, tracebacks included
    assert len(events) == 3 and CANARY not in stream.getvalue() and "s3cr3t%2F" not in stream.getvalue()
    assert events[0]["message"] == "connecting with ***" and events[0]["url"] == "postgresql://u:***@db/x"
    assert "RuntimeError: auth failed for token ***" in events[1]["exc_info"]
    assert {"time", "level", "logger", "message"} <= set(events[0])


def test_a_failing_stage_is_isolated_counted_and_recorded(tmp_path, store):
    cfg = config_mod.load(write_config(tmp_path))
    calls = []

    def broken(config, s, now):
        raise ValueError("stage broke")

    def after(config, s, now):
        calls.append(now)
        return "ran"

    metrics = Metrics()
    now = datetime(2026, 11, 2, 12, tzinfo=UTC)
    results = jobs.run_stages("tick", [broken, after], cfg, store, now, metrics)
    assert isinstance(results[jobs.stage_name(broken)], ValueError) and results[jobs.stage_name(after)] == "ran"
    assert calls == [now]
    with store.transaction() as session:
        (event,) = store.job_events.load(session, now)
    assert event["kind"] == "error" and event["job"].endswith("broken") and "stage broke" in event["message"]
    assert metrics.job_errors.labels(job=event["job"])._value.get() == 1


def test_scheduler_reports_errors_and_runs_skipped_behind_a_slow_one():
    errors, missed = [], []
    release = threading.Event()

    def slow_tick():
        release.wait(5)

    def broken_heartbeat():
        raise RuntimeError("heartbeat broke")

    sched = scheduler.build(
        tick=slow_tick, interval=timedelta(seconds=0.2), tick_grace=timedelta(seconds=1), nightly=None,
        nightly_cron=None, nightly_grace=timedelta(hours=1), heartbeat=broken_heartbeat,
        heartbeat_interval=timedelta(seconds=0.3), leader_check=None, leader_interval=timedelta(seconds=1),
        on_error=lambda job, exc: errors.append((job, str(exc))),
        on_missed=lambda job, why: missed.append((job, why)))
    thread = threading.Thread(target=sched.start, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (errors and missed):
            time.sleep(0.05)
    finally:
        release.set()
        sched.shutdown(wait=False)
        thread.join(5)
    assert ("heartbeat", "heartbeat broke") in errors
    assert missed and missed[0][0] == "tick" and "still going" in missed[0][1]


def test_config_rejects_a_bad_cron_and_shrinking_tiers(tmp_path):
    with pytest.raises(ConfigError, match="daemon.nightly"):
        config_mod.load(write_config(tmp_path, nightly="61 2 * * *"))
    with pytest.raises(ConfigError, match="tiers must grow"):
        config_mod.load(write_config(tmp_path, retention={"tiers": [{"after": "14d", "bucket": "1h"},
                                                                    {"after": "7d", "bucket": "1d"}]}))
    cfg = config_mod.load(write_config(tmp_path, nightly=None, interval="30s"))
    assert cfg.daemon.nightly is None and cfg.daemon.interval == timedelta(seconds=30)
    assert cfg.daemon.health.host == "127.0.0.1"


def test_notify_sends_datagrams_to_the_notify_socket(tmp_path, monkeypatch):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "n.sock"))
    sock.settimeout(2)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "n.sock"))
    try:
        assert daemon.notify("READY=1\nSTATUS=up")
        assert sock.recv(100) == b"READY=1\nSTATUS=up"
    finally:
        sock.close()
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not daemon.notify("WATCHDOG=1")
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    assert daemon.watchdog_interval() == 2.0
