"""A small simulated feed for the daemon tests: predictions and stage timings over a span of minutes,
written as a logger would (one file per hour, lines in arrival order), plus config and table dumps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from monitor.aggregate.partial import Partial
from storage.store import Store

START = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
PY = str(Path(sys.executable))
ROOT = Path(__file__).resolve().parents[2]


def feed_lines(minutes: int = 90, per_minute: int = 40, seed: int = 1, start: datetime = START):
    """(prediction lines, timing lines), each a list of (visible_at, bytes) in event order; a few timings
    arrive minutes late, a few lines are broken."""
    rng = np.random.default_rng(seed)
    n = minutes * per_minute
    offsets = np.sort(rng.uniform(0, minutes * 60, n))
    preds, timings = [], []
    for i, off in enumerate(offsets):
        ts = start + timedelta(seconds=float(off))
        slow = off > minutes * 60 * 0.6  # the last 40%: the model stage gets slower
        row = {"request_id": f"r{seed}-{i:06d}", "ts": _iso(ts), "model_version": "v1" if i % 7 else "v2",
               "status": "ok" if rng.random() > 0.05 else "timeout",
               "tenure": int(rng.integers(0, 72)), "Contract": ["Month-to-month", "One year", "Two year"][i % 3],
               "latency_ms": float(round(rng.gamma(4, 10 if not slow else 16), 3))}
        preds.append((ts, json.dumps(row).encode() + b"\n"))
        if i % 50 == 7:
            preds.append((ts, b'{"request_id": "broken", "ts": \n'))
        if i % 23 == 0:
            continue  # no timings: folded unmatched once lateness passes
        late = timedelta(minutes=3) if i % 31 == 0 else timedelta(0)
        for stage, ms in (("preprocess", rng.gamma(2, 2)), ("model", rng.gamma(4, 8 if not slow else 14))):
            t = {"request_id": row["request_id"], "stage": stage, "duration_ms": float(round(ms, 3)),
                 "start_ts": _iso(ts + late)}
            timings.append((ts + late, json.dumps(t).encode() + b"\n"))
    return preds, timings


def _iso(ts: datetime) -> str:
    return ts.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def write_all(folder: Path, lines: list[tuple[datetime, bytes]], prefix: str) -> None:
    """Every line at once, one file per hour of arrival, in arrival order (what a backlog looks like)."""
    folder.mkdir(parents=True, exist_ok=True)
    for at, line in sorted(lines, key=lambda x: x[0]):
        with open(folder / f"{prefix}-{at:%Y%m%d%H}.jsonl", "ab") as fh:
            fh.write(line)


def append_until(folder: Path, lines: list[tuple[datetime, bytes]], prefix: str, prev: datetime | None,
                 now: datetime) -> None:
    """Append the lines that arrive in (prev, now], as a live logger would."""
    folder.mkdir(parents=True, exist_ok=True)
    for at, line in sorted(lines, key=lambda x: x[0]):
        if (prev is None or at > prev) and at <= now:
            with open(folder / f"{prefix}-{at:%Y%m%d%H}.jsonl", "ab") as fh:
                fh.write(line)


def config_dict(db: Path, chunk_rows: int = 150, **daemon) -> dict:
    return {
        "storage": {"url": f"sqlite:///{db}"},
        "limits": {"chunk_rows": chunk_rows},
        "daemon": {"log_format": "json", "health": {"port": None}, **daemon},
        "services": [{
            "name": "svc",
            "sources": {"predictions": {"kind": "files", "path": "./logs/predictions"},
                        "timings": {"kind": "files", "path": "./logs/timings"}},
            "schema": {"features": {"tenure": "numeric", "Contract": "categorical"}, "segments": ["Contract"]},
            "buckets": {"size": "5m", "windows": ["15m", "1h"]},
            "join": {"lateness": "2m"},
        }],
    }


def write_config(work: Path, db: Path | None = None, chunk_rows: int = 150, **daemon) -> Path:
    (work / "logs" / "predictions").mkdir(parents=True, exist_ok=True)
    (work / "logs" / "timings").mkdir(parents=True, exist_ok=True)
    path = work / "tailwatch.yaml"
    path.write_text(yaml.safe_dump(config_dict(db or work / "tw.db", chunk_rows, **daemon), sort_keys=False))
    return path


def partial_table(store: Store, service: str = "svc") -> dict:
    """Stored partials by key, as comparable values: rows, exact counts, histograms, sketch bins and counts,
    and float sums rounded (their addition order may differ)."""
    with store.transaction() as session:
        rows = store.partials.load(session, service, datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))
    out = {}
    for r in rows:
        p = Partial.from_bytes(r.payload)
        out[(r.model_version, r.bucket_start, r.bucket_seconds, r.segment)] = (
            r.rows, dict(p.counts), p.hists,
            {k: (s.count, s.zero, s.pos, s.neg, round(s.sum, 6), s.min, s.max) for k, s in p.sketches.items()},
            {k: dict(v) for k, v in p.unseen.items()})
    return out


FINDING_KEYS = ("check", "model_version", "window_start", "window_end", "labels_key", "status", "n")


def finding_table(store: Store, service: str = "svc") -> dict:
    """Stored findings by identity: status, n and rounded values (ids, tick ids and times left out)."""
    with store.transaction() as session:
        rows = store.findings.load(session, service)
    return {(f["check"], f["model_version"], f["window_start"], f["window_end"], f["labels_key"]):
            (f["status"], f["n"], *(None if f[k] is None else round(f[k], 6) for k in ("value", "baseline")))
            for f in rows}


def quarantine_total(store: Store, service: str = "svc") -> int:
    with store.transaction() as session:
        return sum(store.quarantine.counts(session, service).values())


def tailwatch(config: Path, *args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    """`tailwatch --config <config> <args>` as a subprocess of this Python, in its own process group."""
    return subprocess.Popen([PY, "-c", "from monitor.cli import main; main()", "--config", str(config), *args],
                            cwd=ROOT, env={**os.environ, "NO_PROXY": "127.0.0.1,localhost", **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **kw)


def stop(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Kill a test subprocess (and its group) if it is still running."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.communicate(timeout=timeout)
    except Exception:
        pass


def wait_for(predicate, timeout: float, every: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def line_counts(lines: Iterable[tuple[datetime, bytes]]) -> int:
    return sum(1 for _ in lines)


def as_frame(lines) -> pd.DataFrame:
    return pd.DataFrame([json.loads(b) for _, b in lines])
