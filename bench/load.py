"""Sustained load: N prediction rows per 5-minute tick, each with 5 stage timings, for an hour of simulated
traffic, on this machine. Does the tick keep up with its interval, and does memory stay flat?

    .venv/bin/python bench/load.py                          # 12 ticks x 1M predictions + 5M timings (JSONL)
    .venv/bin/python bench/load.py --ticks 4 --rows 200000  # a quick look

A writer (this process) appends each tick's 5 minutes of traffic to rotating JSON Lines files, then a
long-lived child process runs the daemon's tick job (`monitor.daemon.jobs.tick_job`: ingest, checks, verdicts,
alerts) on a SQLite store with the clock at the end of that interval and reports the tick's time and its
resident memory (all, and anonymous: without the file-backed pages of libraries). Files of ticks
already read are deleted (rotation), as a log shipper would.
Exits 1 when the median tick takes more than half the interval, or when the median resident memory of the
last three ticks exceeds that of ticks 2-4 (after warm-up) by more than 15% (memory not flat).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from ingest import make_rows  # noqa: E402  (bench/ingest.py: the same realistic prediction rows)
from malloc_env import environ  # noqa: E402  (the daemon's malloc settings as deployed)

from monitor.simulate.write import STAGES  # noqa: E402

INTERVAL = timedelta(minutes=5)
START = datetime(2026, 11, 1, tzinfo=UTC)
MAX_TICK_SHARE = 0.5  # of the interval
MAX_GROWTH = 0.15  # median RSS of the last 3 ticks vs ticks 2-4

CHILD = r"""
import json, os, sys, time
from datetime import datetime
sys.path.insert(0, sys.argv[1])
from monitor import config as config_mod
from monitor.daemon.jobs import tick_job
from storage.store import Store

cfg = config_mod.load(sys.argv[2])
store = Store(cfg.storage.url)
store.upgrade()

def rss():
    with open("/proc/self/status") as fh:
        fields = dict(line.split(":", 1) for line in fh)
    return [int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM", "RssAnon")]

for line in sys.stdin:
    now = datetime.fromisoformat(line.strip())
    started = time.perf_counter()
    [report] = tick_job(cfg, store, now)
    seconds = time.perf_counter() - started
    current, peak, anon = rss()
    print(json.dumps({"seconds": seconds, "status": report.status, "error": report.error,
                      "read": dict(report.read), "accepted": dict(report.accepted), "folded": report.folded,
                      "joined": report.joined, "quarantined": sum(report.quarantined.values()),
                      "rss": current, "peak": peak, "anon": anon}), flush=True)
"""


def traffic(k: int, rows: int, seed: int = 7) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tick k's predictions (ts spread over its 5 minutes) and their 5 stage timings each."""
    frame = make_rows(rows, first=k * rows, total=rows, seed=seed)
    rng = np.random.default_rng(seed + k)
    start_ms = int((START + k * INTERVAL).timestamp() * 1000)
    offsets = np.sort(rng.integers(0, int(INTERVAL.total_seconds() * 1000), rows))
    ts = pd.to_datetime(start_ms + offsets, unit="ms", utc=True)
    frame["ts"] = ts.strftime("%Y-%m-%dT%H:%M:%S.%f").str[:-3] + "Z"
    durations = rng.lognormal(1.0, 0.6, (rows, len(STAGES))).round(3)
    timings = pd.DataFrame({
        "request_id": np.repeat(frame["request_id"].to_numpy(), len(STAGES)),
        "stage": np.tile(np.array(STAGES, dtype=object), rows),
        "duration_ms": durations.ravel(),
    })
    return frame, timings


def write(path: Path, frame: pd.DataFrame) -> None:
    """JSON Lines through pandas' C encoder, written to a temp name and renamed (no partial file seen)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for a in range(0, len(frame), 250_000):
            fh.write(frame.iloc[a:a + 250_000].to_json(orient="records", lines=True, force_ascii=False))
    tmp.rename(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ticks", type=int, default=12, help="5-minute ticks (12 = one hour)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="prediction rows per tick")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tailwatch-load-"))
    (work / "p").mkdir()
    (work / "t").mkdir()
    config = work / "tailwatch.yaml"
    config.write_text(json.dumps({
        "storage": {"url": f"sqlite:///{work / 'tw.db'}"},
        "services": [{"name": "churn",
                      "sources": {"predictions": {"kind": "files", "path": str(work / "p")},
                                  "timings": {"kind": "files", "path": str(work / "t")}},
                      "schema": {"features": {"tenure": "numeric", "MonthlyCharges": "numeric",
                                              "Contract": "categorical", "InternetService": "categorical",
                                              "notes": "text"},
                                 "segments": ["Contract"], "classes": ["No", "Yes"], "positive_class": "Yes",
                                 "signals": ["batch_size", "queue_depth"]},
                      "join": {"lateness": "2m"}}]}))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(ROOT), str(config)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=environ())
    results = []
    try:
        print(f"{args.ticks} ticks x {args.rows:,} predictions + {args.rows * len(STAGES):,} stage timings, "
              f"JSON Lines, interval {INTERVAL}")
        print(f"{'tick':>4} {'write s':>8} {'tick s':>8} {'read':>11} {'folded':>10} {'RSS MiB':>8} "
              f"{'anon MiB':>9} {'peak MiB':>9}")
        for k in range(args.ticks):
            started = time.perf_counter()
            predictions, timings = traffic(k, args.rows)
            write(work / "p" / f"pred-{k:04d}.jsonl", predictions)
            write(work / "t" / f"stages-{k:04d}.jsonl", timings)
            del predictions, timings
            written = time.perf_counter() - started
            for old in (*(work / "p").glob(f"pred-{k - 2:04d}.jsonl"), *(work / "t").glob(f"stages-{k - 2:04d}.jsonl")):
                old.unlink()  # rotated away after the tick that read it
            now = START + (k + 1) * INTERVAL + timedelta(seconds=30)
            child.stdin.write(now.isoformat() + "\n")
            child.stdin.flush()
            line = child.stdout.readline()
            if not line:
                raise RuntimeError("the ticking process died")
            result = json.loads(line)
            if result["status"] != "ok":
                raise RuntimeError(f"tick {k} failed: {result['error']}")
            results.append(result)
            print(f"{k:>4} {written:>8.1f} {result['seconds']:>8.1f} {sum(result['read'].values()):>11,} "
                  f"{result['folded']:>10,} {result['rss'] / 2**20:>8.0f} {result['anon'] / 2**20:>9.0f} "
                  f"{result['peak'] / 2**20:>9.0f}", flush=True)
    finally:
        child.stdin.close()
        child.wait(timeout=60)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    seconds = [r["seconds"] for r in results]
    median = statistics.median(seconds)
    share = median / INTERVAL.total_seconds()
    rss = [r["rss"] for r in results]
    base = statistics.median(rss[1:4] or rss)
    end = statistics.median(rss[-3:])
    growth = end / base - 1
    rows_per_s = (args.rows * (1 + len(STAGES))) / median
    print()
    print(f"median tick {median:.1f} s ({share:.0%} of the {INTERVAL.total_seconds():.0f} s interval; "
          f"max {max(seconds):.1f} s), {rows_per_s:,.0f} input rows/s")
    print(f"resident memory, median of ticks 2-4: {base / 2**20:.0f} MiB, of the last 3: {end / 2**20:.0f} MiB "
          f"({growth:+.1%}); peak {max(r['peak'] for r in results) / 2**20:.0f} MiB")
    anon = [r["anon"] for r in results]  # RSS less file-backed pages (libraries, page cache): heap memory
    print(f"anonymous memory, median of ticks 2-4: {statistics.median(anon[1:4] or anon) / 2**20:.0f} MiB, "
          f"of the last 3: {statistics.median(anon[-3:]) / 2**20:.0f} MiB")
    ok = share <= MAX_TICK_SHARE and growth <= MAX_GROWTH
    print("targets: tick <= 50% of the interval, memory growth <= 15%:", "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
