"""Stage timings as an OpenTelemetry Collector's file exporter writes them: OTLP-JSON, one export request per
line, many resourceSpans per line (one per replica), several Collector instances each writing its own file
and rotating it, so a request's spans are spread over files and lines, out of time order.

Each request's spans (the gateway's and its replica's) go to one of the Collector instances; an instance
exports a batch when it holds `batch` spans or every `flush` seconds, a resourceSpans per replica (sorted by
name, so a line is not in the order its spans ended), and rotates its file every `rotate_lines` lines."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import numpy as np

STAGES = (("preprocess", 0.0, 3.0), ("model", 3.0, 40.0), ("postprocess", 43.0, 2.0))  # name, offset, mean ms


def _attr(key: str, value) -> dict:
    return {"key": key, "value": {"stringValue": str(value)}}


def collector_feed(start: datetime, minutes: int, per_minute: int, *, instances: int = 3, rotate_lines: int = 120,
                   batch: int = 120, flush: float = 20.0, seed: int = 11):
    """(prediction lines, {file name: [(written_at, line bytes)]}, spans written): predictions as (ts, bytes)
    in arrival order; span files as the Collector instances wrote them, each line when it was written."""
    rng = np.random.default_rng(seed)
    n = minutes * per_minute
    offsets = np.sort(rng.uniform(0, minutes * 60, n))
    preds = []
    queues: list[list[tuple[float, str, dict]]] = [[] for _ in range(instances)]
    for i, off in enumerate(offsets):
        ts = start + timedelta(seconds=float(off))
        rid = f"c{seed}-{i:06d}"
        replica = f"api-{i % 4}"
        row = {"request_id": rid, "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
               "model_version": "v1", "status": "ok", "tenure": int(rng.integers(0, 72)),
               "Contract": ["Month-to-month", "One year", "Two year"][i % 3],
               "latency_ms": float(round(rng.gamma(4, 12), 3))}
        preds.append((ts, json.dumps(row).encode() + b"\n"))
        t0 = int(ts.timestamp() * 1e9)
        instance = int(rng.integers(0, instances))
        trace = f"{rng.integers(1, 2**62):016x}{i:016x}"
        for name, at_ms, mean in STAGES:
            begin = t0 + int(at_ms * 1e6)
            end = begin + int(rng.gamma(3, mean / 3) * 1e6)
            span = {"traceId": trace, "spanId": f"{rng.integers(1, 2**62):016x}", "name": name, "kind": 2,
                    "startTimeUnixNano": str(begin), "endTimeUnixNano": str(end),
                    "attributes": [_attr("request_id", rid)]}
            queues[instance].append((end / 1e9, replica, span))
        gw_end = t0 + int(rng.gamma(4, 14) * 1e6)
        queues[instance].append((gw_end / 1e9, "gateway", {
            "traceId": trace, "spanId": f"{rng.integers(1, 2**62):016x}", "name": "gateway", "kind": 2,
            "startTimeUnixNano": str(t0), "endTimeUnixNano": str(gw_end),
            "attributes": [_attr("request_id", rid)]}))
    files: dict[str, list[tuple[datetime, bytes]]] = {}
    written = 0
    for k, queue in enumerate(queues):
        queue.sort(key=lambda q: q[0])
        who = f"agent-{k}"
        lines: list[tuple[datetime, bytes]] = []
        held: list[tuple[float, str, dict]] = []
        next_flush = queue[0][0] + flush if queue else 0.0
        for item in queue + [(float("inf"), "", {})]:
            while held and (item[0] >= next_flush or len(held) >= batch):
                at = min(next_flush, item[0]) if len(held) < batch else held[-1][0]
                lines.append((datetime.fromtimestamp(at, start.tzinfo), _export(held)))
                written += len(held)
                held, next_flush = [], at + flush
            if item[2]:
                held.append(item)
        for j in range(0, len(lines), rotate_lines):
            files[f"traces-{who}-{j // rotate_lines:03d}.json"] = lines[j:j + rotate_lines]
    return preds, files, written


def _export(held: list[tuple[float, str, dict]]) -> bytes:
    """One ExportTraceServiceRequest: a resourceSpans per replica, its spans in one scope."""
    by_replica: dict[str, list[dict]] = {}
    for _, replica, span in held:
        by_replica.setdefault(replica, []).append(span)
    doc = {"resourceSpans": [
        {"resource": {"attributes": [_attr("service.name", "churn-api" if r != "gateway" else "gateway"),
                                     _attr("host.name", r)]},
         "scopeSpans": [{"scope": {"name": "tailwatch.server", "version": "1.0"}, "spans": spans}],
         "schemaUrl": "https://opentelemetry.io/schemas/1.24.0"}
        for r, spans in sorted(by_replica.items())]}
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"
