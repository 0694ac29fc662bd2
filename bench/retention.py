"""Storage growth of bucket partials, before and after retention's compaction:
`python bench/retention.py [--rows-per-day 1000000] [--days 30]`.

Simulates one hour of the `healthy` churn scenario at the given daily rate, ingests it with a real tick (5-min
buckets, the Contract segment, the reference profile's histograms), then lays that hour's partials over every
hour of `--days` days in a fresh SQLite database (each hour shifted in time: same payload sizes as real
traffic at that rate) and measures the file (after VACUUM) before and after `retention.apply` with the default
tiers (5-min buckets kept 14 d, then hourly, daily after 90 d). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import yaml


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows-per-day", type=int, default=1_000_000)
    ap.add_argument("--days", type=int, default=30)
    args = ap.parse_args()

    from monitor import config as config_mod
    from monitor.aggregate.partial import Partial, merge_all
    from monitor.daemon import jobs, retention
    from monitor.demo import demo_config
    from monitor.simulate import generate
    from storage.rows import PartialRow
    from storage.store import Store

    work = Path(tempfile.mkdtemp(prefix="tailwatch-retention-"))
    try:
        truth = generate("healthy", work / "generated", seed=7, hours=1.0,
                         rate_per_s=args.rows_per_day / 86400, otlp=False)
        raw = demo_config(work)
        raw["services"][0]["sources"] = {"predictions": {"kind": "files", "path": "./generated/predictions"},
                                         "timings": {"kind": "files", "path": "./generated/timings"}}
        raw["services"][0]["buckets"] = {"size": "5m", "windows": ["15m", "1h", "1d"]}
        (work / "tailwatch.yaml").write_text(yaml.safe_dump(raw))
        cfg = config_mod.load(work / "tailwatch.yaml")
        store = Store(cfg.storage.url)
        store.upgrade()
        import pandas as pd

        end = pd.Timestamp(truth.end).to_pydatetime()
        start = pd.Timestamp(truth.start).to_pydatetime()
        jobs.tick_job(cfg, store, end + timedelta(minutes=30))
        with store.transaction() as session:
            hour = store.partials.load(session, "churn", start, start + timedelta(hours=1))
        rows_in_hour = sum(r.rows for r in hour if r.segment == "")
        per_bucket = sum(len(r.payload) for r in hour) / len({r.bucket_start for r in hour})

        db = work / "month.db"
        month = Store(f"sqlite:///{db}")
        month.upgrade()
        for day in range(args.days):
            rows = []
            for h in range(24):
                shift = timedelta(days=day, hours=h)
                rows += [PartialRow(r.model_version, r.bucket_start + shift, r.bucket_seconds, r.segment, r.rows,
                                    r.payload) for r in hour]
            with month.transaction() as session:
                month.partials.upsert(session, "churn", rows, lambda a, b: b)
        before = _size(db), _count(db)
        now = start + timedelta(days=args.days)
        t = time.perf_counter()
        done = retention.apply(cfg, month, now)
        seconds = time.perf_counter() - t
        after = _size(db), _count(db)
        # What one day weighs in each tier: its 5-min payloads, its hourly ones, and their merge into one day.
        day0 = start + timedelta(days=1)
        with month.transaction() as session:
            hourly = month.partials.load(session, "churn", day0 - timedelta(days=1), day0, bucket_seconds=3600)
        by_segment: dict = {}
        for r in hourly:
            by_segment.setdefault((r.model_version, r.segment), []).append(Partial.from_bytes(r.payload))
        daily = sum(len(merge_all(parts).to_bytes()) for parts in by_segment.values())
        print(json.dumps({
            "rows_per_day": args.rows_per_day, "days": args.days, "simulated_rows_in_hour": rows_in_hour,
            "partials_per_5min_bucket": len(hour) / 12, "payload_bytes_per_5min_bucket": round(per_bucket),
            "db_bytes_before": before[0], "partials_before": before[1],
            "db_bytes_after": after[0], "partials_after": after[1],
            "bytes_per_day_raw": round(before[0] / args.days),
            "payload_bytes_per_day": {"5min": round(per_bucket * 288), "hourly": sum(len(r.payload) for r in hourly),
                                      "daily": daily},
            "compaction": done["compacted"], "compaction_seconds": round(seconds, 2),
        }, indent=2))
        month.dispose()
        store.dispose()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _size(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        conn.execute("VACUUM")
    return db.stat().st_size


def _count(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM bucket_partials").fetchone()[0]


if __name__ == "__main__":
    main()
