"""A fake Slack Web API on 127.0.0.1 (chat.postMessage, chat.update, conversations.history / replies)
with scripted faults, and the config builder of the alert tests."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

TOKEN = "xoxb-test-0123456789-SECRETVALUE"
CHANNELS = {"#alerts": "C0ALERTS", "#warn": "C0WARN"}


class FakeSlack:
    """Messages by channel id; `faults[method]` is a queue of what the next calls do instead of
    answering: '429', '500', 'reset' (drop the connection before acting), 'reset_after' (act, then drop
    the connection: the response is lost), 'slow' (act, then answer after 1.5 s), or an error code ('ratelimited'
    answers 429 + ok:false, anything else 200 + ok:false)."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.calls: list[str] = []
        self.headers_seen: list[str] = []
        self.faults: dict[str, deque[str]] = {}
        self._seq = 0
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def _reply(self, status: int, body: dict, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _reset(self) -> None:
                self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.request.close()

            def _handle(self, params: dict) -> None:
                method = urlparse(self.path).path.rsplit("/", 1)[-1]
                fake.calls.append(method)
                fake.headers_seen.append(self.headers.get("Authorization", ""))
                fault = None
                with fake._lock:
                    queue = fake.faults.get(method)
                    if queue:
                        fault = queue.popleft()
                if fault == "429":
                    return self._reply(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "1"})
                if fault == "ratelimited":
                    return self._reply(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "2"})
                if fault == "500":
                    return self._reply(500, {"ok": False, "error": "internal_error"})
                if fault == "reset":
                    return self._reset()
                if fault not in (None, "reset_after", "slow"):
                    return self._reply(200, {"ok": False, "error": fault})
                if method != "hook" and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._reply(200, {"ok": False, "error": "invalid_auth"})
                body = fake.act(method, params)
                if fault == "reset_after":
                    return self._reset()
                if fault == "slow":  # Slack acted, then answered too late: the post is there before any lookup
                    time.sleep(1.5)
                return self._reply(200, body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length).decode()
                if "json" in self.headers.get("Content-Type", ""):
                    params = json.loads(raw or "{}")
                else:
                    params = {k: v[0] for k, v in parse_qs(raw).items()}
                self._handle(params)

            def do_GET(self) -> None:
                self._handle({k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_port}/api/"
        # shutdown() waits for serve_forever's next poll: the default 0.5 s, paid by every test's teardown.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def act(self, method: str, params: dict) -> dict:
        with self._lock:
            channel = CHANNELS.get(params.get("channel"), params.get("channel"))  # names resolve to ids
            if method in ("chat.postMessage", "chat.update", "conversations.history", "conversations.replies") \
                    and channel not in CHANNELS.values():
                return {"ok": False, "error": "channel_not_found"}
            if method == "hook":  # an incoming webhook: post only, answers plain "ok" in real Slack
                self.messages.append({"channel": "webhook", "ts": None, "text": params.get("text"),
                                      "blocks": params.get("blocks"), "thread_ts": None, "metadata": None, "edits": 0})
                return {"ok": True}
            if method == "chat.postMessage":
                self._seq += 1
                ts = f"1700000000.{self._seq:06d}"
                meta = params.get("metadata")
                msg = {"channel": channel, "ts": ts, "text": params.get("text"), "blocks": params.get("blocks"),
                       "thread_ts": params.get("thread_ts"), "metadata": meta, "edits": 0}
                self.messages.append(msg)
                return {"ok": True, "channel": channel, "ts": ts, "message": msg}
            if method == "chat.update":
                for msg in self.messages:
                    if msg["channel"] == channel and msg["ts"] == params.get("ts"):
                        msg.update(text=params.get("text"), blocks=params.get("blocks"), edits=msg["edits"] + 1)
                        return {"ok": True, "channel": channel, "ts": msg["ts"]}
                return {"ok": False, "error": "message_not_found"}
            if method == "conversations.history":
                msgs = [m for m in self.messages if m["channel"] == channel and not m["thread_ts"]]
                return {"ok": True, "messages": list(reversed(msgs))}
            if method == "conversations.replies":
                msgs = [m for m in self.messages if m["channel"] == channel
                        and (m["ts"] == params.get("ts") or m["thread_ts"] == params.get("ts"))]
                return {"ok": True, "messages": msgs}
            return {"ok": False, "error": "unknown_method"}

    def fail_next(self, method: str, *faults: str) -> None:
        self.faults.setdefault(method, deque()).extend(faults)

    @property
    def top_level(self) -> list[dict]:
        return [m for m in self.messages if not m["thread_ts"]]

    def replies(self, ts: str) -> list[dict]:
        return [m for m in self.messages if m["thread_ts"] == ts]


def make_config(tmp_path, *, slack_url: str | None = None, alerts: dict | None = None, rules: list | None = None,
                accepted: list | None = None, windows: list | None = None, url: str | None = None,
                quality: dict | None = None, ui: dict | None = None):
    """A validated config for one service `churn` whose sources are empty directories."""
    from monitor import config as config_mod

    preds = tmp_path / "logs" / "predictions"
    preds.mkdir(parents=True, exist_ok=True)
    labels = tmp_path / "logs" / "labels"
    labels.mkdir(parents=True, exist_ok=True)
    raw_alerts = dict(alerts or {})
    if slack_url is not None:
        raw_alerts.setdefault("slack", {"token": {"env": "TW_SLACK_TOKEN"}, "channel": "#alerts",
                                        "base_url": slack_url, "timeout": "1s"})
    raw = {"storage": {"url": url or f"sqlite:///{tmp_path / 'tw.db'}"},
           "services": [{"name": "churn", "sources": {"predictions": {"kind": "files", "path": str(preds)}},
                         "buckets": {"size": "5m", "windows": windows or ["15m"]}, "join": {"lateness": "5m"},
                         "rules": rules or [], "accepted_versions": accepted or []}],
           "alerts": raw_alerts}
    if ui is not None:
        raw["ui"] = ui
    if quality is not None:
        raw["services"][0]["quality"] = quality
        raw["services"][0]["sources"]["labels"] = {"kind": "files", "path": str(labels)}
    return config_mod.parse(raw, base_dir=tmp_path)

