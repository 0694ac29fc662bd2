"""Small builders shared by tests (imported as a plain module: tests/ is on sys.path via conftest)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

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
    from monitor.partials import ALL, Partial

    with store.transaction() as s:
        rows = store.load_partials(s, service, datetime(1970, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC),
                                   segment=ALL)
    return sum(Partial.from_bytes(r.payload).rows for r in rows)
