"""Small builders shared by tests (imported as a plain module: tests/ is on sys.path via conftest)."""

from __future__ import annotations

import json
import threading
from collections import deque
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

START = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def valid_row(i: int, request_id: str | None = None) -> dict:
    """One contract-valid prediction row; consecutive rows are half a second apart from START."""
    return {"request_id": request_id or f"req-{i:06d}", "ts": (START + timedelta(seconds=0.5 * i)).isoformat().replace("+00:00", "Z"),
            "model_version": "v1", "status": ["ok", "ok", "ok", "timeout", "error"][i % 5],
            "tenure": i % 72, "Contract": ["Month-to-month", "One year", "Two year"][i % 3],
            "notes": "call back " * (i % 4), "latency_ms": 10.0 + i % 7}


def valid_lines(n: int, start: int = 0) -> str:
    return "".join(json.dumps(valid_row(i)) + "\n" for i in range(start, start + n))


def stored_rows(store, service: str = "churn") -> int:
    """Rows folded into the stored all-traffic partials of `service`, over all time."""
    from monitor.aggregate.partial import ALL, Partial

    with store.transaction() as s:
        rows = store.partials.load(s, service, datetime(1970, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC),
                                   segment=ALL)
    return sum(Partial.from_bytes(r.payload).rows for r in rows)


def v2_bytes(partial) -> bytes:
    """`partial` in the binary form stored before TWP3 (TWP2: each sketch's sum, sumsq, min and max in the
    JSON header), written as that version wrote it: what a database kept from then holds."""
    import struct

    import numpy as np

    from monitor.aggregate.codec import BINARY_V2

    hists, sketches = sorted(partial.hists.items()), sorted(partial.sketches.items())
    head = {"counts": dict(sorted(partial.counts.items())), "hists": [[k, len(v)] for k, v in hists],
            "sketches": [[k, len(sk.pos), len(sk.neg), sk.zero, sk.count, sk.sum, sk.sumsq, sk.min, sk.max]
                         for k, sk in sketches]}
    if partial.unseen:
        head["unseen"] = {k: dict(sorted(v.items())) for k, v in sorted(partial.unseen.items())}
    if partial.profile:
        head["profile"] = partial.profile
    ints = [x for _, v in hists for x in v]
    for _, sk in sketches:
        for bins in (sk.pos, sk.neg):
            ints += sorted(bins) + [bins[k] for k in sorted(bins)]
    head["int"] = 8
    header = json.dumps(head, separators=(",", ":"), allow_nan=False).encode()
    header += b" " * (-len(header) % 8)
    return BINARY_V2 + struct.pack("<I", len(header)) + header + np.array(ints, dtype="<i8").tobytes()


class Receiver:
    """An HTTP server on 127.0.0.1 that records each POST (path, headers, JSON body) and answers 200, or
    the statuses queued in `fail` ('down' answers 503 to everything until `down` is cleared)."""

    def __init__(self) -> None:
        self.posts: list[dict] = []
        self.fail: deque[int] = deque()
        self.down = False
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = 503 if receiver.down else (receiver.fail.popleft() if receiver.fail else 200)
                if status == 200:
                    receiver.posts.append({"path": self.path, "headers": dict(self.headers),
                                           "body": json.loads(body or b"null")})
                data = (f"status {status}; you sent {self.headers.get('Authorization', '')}").encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def alerts(self) -> list[dict]:
        """Every alert received on /api/v2/alerts, in order."""
        return [a for p in self.posts if p["path"] == "/api/v2/alerts" for a in p["body"]]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
