"""Query latency of the investigation API on a store holding 30 days of 5-minute buckets for 3 model
versions: `python bench/query.py [--days 30] [--versions 3] [--url sqlite:///...]`.

The store is filled from one real run: a 2-hour `healthy` scenario is simulated and ticked, and its bucket
partials (all traffic and the 3 Contract segments) and its 15-minute and 1-hour window findings are
copied onto every bucket / window of the span, for each version. Then each query runs 3 times; the
median wall and CPU time are printed (cold caches are not measured). `--url ... --reuse` times the
queries again on a store an earlier run filled.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def seed_store(work: Path):
    """A real 2-hour run: its config and store (SQLite)."""
    import yaml

    from monitor import config as config_mod
    from monitor.demo import demo_config, replay
    from monitor.simulate import generate
    from storage.store import Store

    truth = generate("healthy", work / "generated", seed=7, hours=2.0, otlp=False)
    for kind in ("predictions", "timings"):
        (work / "logs" / kind).mkdir(parents=True, exist_ok=True)
    (work / "tailwatch.yaml").write_text(yaml.safe_dump(demo_config(work), sort_keys=False))
    cfg = config_mod.load(work / "tailwatch.yaml")
    store = Store(cfg.storage.url)
    store.upgrade()
    replay(work, cfg, store, truth, None, broken_lines=False)
    return cfg, store


def fill(source, target, days: int, versions: int, end: datetime) -> dict:
    """Copy the seed's partials and findings onto `days` of buckets and windows for `versions` versions."""
    from sqlalchemy import insert, select

    from storage.models import BucketPartial, FindingRow

    with source.transaction() as s:
        parts = [dict(r) for r in s.execute(select(BucketPartial.__table__)).mappings()]
        finds = [dict(r) for r in s.execute(select(FindingRow.__table__)).mappings()]
    start = end - timedelta(days=days)
    bucket = timedelta(minutes=5)
    payloads: dict[str, list[dict]] = {}
    for p in parts:
        payloads.setdefault(p["segment"], []).append(p)
    windows: dict[timedelta, list[list[dict]]] = {}
    by_window: dict[tuple, list[dict]] = {}
    for f in finds:
        by_window.setdefault((f["window_start"], f["window_end"]), []).append(f)
    for (ws, we), rows in by_window.items():
        windows.setdefault(we - ws, []).append(rows)
    counts = {"partials": 0, "findings": 0}
    with target.transaction() as t:
        for v in range(versions):
            version = f"v{v + 1}"
            rows = []
            n = int((end - start) / bucket)
            for i in range(n):
                at = start + i * bucket
                for options in payloads.values():
                    p = options[i % len(options)]
                    rows.append({**p, "model_version": version, "bucket_start": at, "updated_at": end})
                if len(rows) > 20_000:
                    t.execute(insert(BucketPartial.__table__), rows)
                    counts["partials"] += len(rows)
                    rows = []
            if rows:
                t.execute(insert(BucketPartial.__table__), rows)
                counts["partials"] += len(rows)
            out = []
            for length, sets in windows.items():
                for i in range(int((end - start) / length)):
                    ws = start + i * length
                    for f in sets[i % len(sets)]:
                        row = {k: val for k, val in f.items() if k != "id"}
                        out.append({**row, "model_version": version, "window_start": ws, "window_end": ws + length,
                                    "tick_id": None})
                    if len(out) > 20_000:
                        t.execute(insert(FindingRow.__table__), out)
                        counts["findings"] += len(out)
                        out = []
            if out:
                t.execute(insert(FindingRow.__table__), out)
                counts["findings"] += len(out)
    return counts


def timed(fn, repeat: int = 3) -> tuple[float, float, object]:
    """Median wall and CPU seconds of `repeat` calls (CPU time is what a shared, busy machine cannot
    inflate; wall time is what the user waits on an idle one, about the same there)."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus), result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--url", help="Target database (default: a SQLite file in a temporary directory).")
    ap.add_argument("--reuse", action="store_true",
                    help="The --url database is already filled by an earlier run: only time the queries.")
    args = ap.parse_args()

    from monitor.investigate import history, sql
    from monitor.investigate import query as q
    from monitor.investigate.compare import compare
    from storage.store import Store

    with tempfile.TemporaryDirectory(prefix="tailwatch-bench-query-") as tmp:
        work = Path(tmp)
        cfg, seed = seed_store(work / "seed")
        target = Store(args.url or f"sqlite:///{work / 'bench.db'}")
        target.upgrade()
        end = datetime(2026, 12, 1, tzinfo=UTC)
        t = time.perf_counter()
        counts = {"reused": True} if args.reuse else fill(seed, target, args.days, args.versions, end)
        fill_s = time.perf_counter() - t
        day, week, span = end - timedelta(days=1), end - timedelta(days=7), end - timedelta(days=args.days)
        service = cfg.services[0]
        cases = {
            "findings: breaches, last 24 h": lambda: q.findings(target, "churn", since=day, until=end, status="breach"),
            "findings: latency batch_wait p99, 7 days": lambda: q.findings(
                target, "churn", since=week, until=end, check="latency",
                labels={"stage": "batch_wait", "quantile": "p99"}),
            f"findings: Contract drift, {args.days} days, by version": lambda: q.group_findings(
                q.findings(target, "churn", since=span, until=end, check="drift", labels={"field": "Contract"},
                           segment="all"), ["model_version"]),
            "metrics: last 24 h per hour": lambda: history.metrics(target, "churn", since=day, until=end,
                                                             every=timedelta(hours=1)),
            "metrics: 7 days per 6 h": lambda: history.metrics(target, "churn", since=week, until=end,
                                                         every=timedelta(hours=6)),
            f"metrics: {args.days} days, one row per version": lambda: history.metrics(target, "churn", since=span,
                                                                                until=end),
            "compare v1 vs v2, 7 days": lambda: compare(target, service, "v1", "v2", week, end),
            "sql: count breaches per check": lambda: sql.sql(
                target, "SELECT \"check\", count(*) AS n FROM findings WHERE status = 'breach' GROUP BY 1"),
        }
        results = {}
        for name, fn in cases.items():
            seconds, cpu, frame = timed(fn)
            rows = len(frame.table) if hasattr(frame, "table") else len(frame)
            results[name] = {"seconds": round(seconds, 3), "cpu_seconds": round(cpu, 3), "rows": rows}
            print(f"{name:48s} {seconds * 1000:8.0f} ms wall {cpu * 1000:8.0f} ms cpu  ({rows} rows)", flush=True)
        print(json.dumps({"backend": target.url.get_backend_name(), "days": args.days, "versions": args.versions,
                          **counts, "fill_seconds": round(fill_s, 1), "queries": results}, indent=2))
        target.dispose()
        seed.dispose()


if __name__ == "__main__":
    main()
