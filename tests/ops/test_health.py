"""Probes: /readyz fails while the database is down and recovers after; /livez follows the heartbeat age;
/metrics parses with prometheus_client's parser."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from opsfeed import wait_for
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url
from test_daemon import get

from monitor.daemon.health import Health, Metrics, serve
from storage.store import Store


class Proxy:
    """A TCP relay 127.0.0.1:port -> the PostgreSQL server, that can be cut (database down) and restored."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target, self.port, self.conns, self.listener = target, 0, [], None

    def start(self) -> None:
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", self.port))
        self.port = self.listener.getsockname()[1]
        self.listener.listen()
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone would not
        except OSError:
            pass
        self.listener.close()
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
        self.conns = []


@pytest.mark.postgres
def test_readyz_fails_while_the_database_is_down_and_recovers(pg_schema):
    url, connect_args = pg_schema
    real = make_url(url)
    proxy = Proxy((real.host or "127.0.0.1", real.port or 5432))
    proxy.start()
    store = Store(real.set(port=proxy.port).render_as_string(hide_password=False), connect_args=connect_args)
    store.upgrade()
    health = Health(store, max_age_s=60, metrics=Metrics())
    server = serve(health, "127.0.0.1", 0)
    port = server.server_address[1]
    try:
        assert get(port, "/readyz") == (200, "ok: database reachable, schema current\n")
        proxy.cut()
        status, body = wait_for(lambda: (r := get(port, "/readyz"))[0] == 503 and r, timeout=20, what="not ready")
        assert body.startswith("fail: cannot connect")
        proxy.start()  # same port: the database is back
        wait_for(lambda: get(port, "/readyz")[0] == 200, timeout=20, what="ready again")
    finally:
        server.shutdown()
        proxy.cut()
        store.dispose()


def test_readyz_fails_on_a_schema_behind_and_livez_on_an_old_heartbeat(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'tw.db'}")
    store.upgrade("0004")
    metrics = Metrics()
    health = Health(store, max_age_s=0.3, metrics=metrics)
    server = serve(health, "127.0.0.1", 0)
    port = server.server_address[1]
    try:
        status, body = get(port, "/readyz")
        assert status == 503 and f"behind {store.head_revision()}" in body
        store.upgrade()
        assert get(port, "/readyz")[0] == 200
        health.beat()
        assert get(port, "/livez")[0] == 200
        time.sleep(0.4)
        assert get(port, "/livez")[0] == 503
        health.beat()
        assert get(port, "/livez")[0] == 200
        metrics.ticks.labels(service="a", status="ok").inc(3)
        metrics.tick_seconds.labels(service="a").observe(0.2)
        metrics.is_leader.set(1)
        status, body = get(port, "/metrics")
        families = {f.name: f for f in text_string_to_metric_families(body)}
        assert status == 200 and families["tailwatch_ticks"].type == "counter"
        assert families["tailwatch_tick_duration_seconds"].type == "histogram"
        assert {"tailwatch_is_leader", "tailwatch_outbox_depth", "tailwatch_active_alerts", "tailwatch_lag_seconds",
                "tailwatch_rows_read", "tailwatch_rows_quarantined", "tailwatch_last_success_timestamp_seconds",
                "tailwatch_heartbeat_timestamp_seconds"} <= set(families)
        assert get(port, "/nope")[0] == 404
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        store.dispose()


@pytest.mark.reliability
def test_a_missing_slack_token_is_loud_at_start_and_on_every_drain(tmp_path, record_property):
    """The daemon with alerts.slack configured and its token's variable unset: an error log line at start
    and on each drain, `tailwatch_notifications_undeliverable` 1, `/readyz` 503 saying why; the daemon
    itself keeps ticking."""
    import json
    import signal

    import yaml
    from opsfeed import stop, tailwatch, write_config
    from test_daemon import free_port, metric, samples

    port = free_port()
    cfg = write_config(tmp_path, interval="1s", heartbeat_interval="0.5s", shutdown_timeout="8s",
                       health={"host": "127.0.0.1", "port": port})
    raw = yaml.safe_load(cfg.read_text())
    raw["alerts"] = {"slack": {"token": {"env": "TW_UNSET_SLACK_TOKEN"}, "channel": "#alerts",
                               "base_url": "http://127.0.0.1:9/api/", "timeout": "1s"}}
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    store = Store(raw["storage"]["url"])
    store.upgrade()
    store.dispose()
    why = "alerts.slack.token: environment variable TW_UNSET_SLACK_TOKEN is not set"
    proc = tailwatch(cfg, "run")
    try:
        page = wait_for(lambda: (p := get(port, "/metrics"))[0] == 200
                        and metric(samples(p[1]), "tailwatch_ticks_total") >= 2 and samples(p[1]),
                        timeout=180, what="two ticks in /metrics")
        assert metric(page, "tailwatch_notifications_undeliverable") == 1
        assert get(port, "/readyz") == (503, f"fail: database reachable, schema current; notifications "
                                             f"undeliverable: {why}\n")
        assert get(port, "/livez")[0] == 200  # alive: it is the notifications that cannot go out
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    finally:
        stop(proc)
    assert proc.returncode == 0, err.decode()[-2000:]
    events = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    loud = [e for e in events if e["level"] == "ERROR" and e["message"].startswith("notifications undeliverable")]
    ticks = [e for e in events if e["message"] == "tick done"]
    assert loud[0]["message"] == f"notifications undeliverable: {why}"  # at start, before any tick
    assert events.index(loud[0]) < events.index(ticks[0])
    assert len(loud) >= 1 + len(ticks)  # and on each drain (a tick's last stage; and the last one on SIGTERM)
    record_property("rel_inputs", len(ticks))
    record_property("rel_faults", 1)
