"""Hostile cardinality: one tick and one /metrics scrape over thousands of model versions, stage names or
segment values (past limits.max_versions / max_stages / max_segment_values they fold into `<other>`).

    .venv/bin/python bench/cardinality.py                  # 3,000 and 10,000 versions, 2,000 stages, 5,000 segment values
    .venv/bin/python bench/cardinality.py --case versions --values 3000

Writes the logs (deterministically, in a temp dir removed afterwards), ticks once on a fresh SQLite store and
times the tick (with the alert evaluation after it) and a scrape of the daemon's registry with the model's series. Exits 1 when a scrape takes 1 s
or more.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

START = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
CASES = [("versions", 3000), ("versions", 10_000), ("stages", 2000), ("segments", 5000)]


def write(tmp: Path, case: str, values: int) -> dict:
    """The case's logs (two rows per value, or one timing per value) and its config."""
    preds, times = tmp / "predictions", tmp / "timings"
    preds.mkdir()
    times.mkdir()
    rows = 2 * values
    with open(preds / "p.jsonl", "w") as p, open(times / "t.jsonl", "w") as t:
        for i in range(rows):
            ts = (START + timedelta(seconds=0.25 * i)).isoformat().replace("+00:00", "Z")
            p.write(json.dumps({"request_id": f"r{i}", "ts": ts, "status": "ok", "latency_ms": 10.0 + i % 7,
                                "model_version": f"v{i % values}" if case == "versions" else "v1",
                                "Contract": f"c{i % values}" if case == "segments" else "One year"}) + "\n")
            if case == "stages":
                for stage in ("queue", f"s{i % values}"):
                    t.write(json.dumps({"request_id": f"r{i}", "stage": stage, "duration_ms": 1.5}) + "\n")
    sources = {"predictions": {"kind": "files", "path": str(preds)}}
    if case == "stages":
        sources["timings"] = {"kind": "files", "path": str(times)}
    return {"services": [{"name": "svc", "sources": sources, "schema": {"features": {"Contract": "categorical"},
                                                                      "segments": ["Contract"]},
                          "join": {"lateness": "0s"}}], "database": {"url": f"sqlite:///{tmp / 'tw.db'}"}}


def run(case: str, values: int, quiet: bool = False) -> float:
    from monitor import config as config_mod
    from monitor.daemon.health import Metrics
    from monitor.daemon.jobs import tick_job
    from monitor.daemon.model_metrics import ModelMetrics
    from storage.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="tw-cardinality-"))
    try:
        raw = write(tmp, case, values)
        db = raw.pop("database")["url"]
        cfg = config_mod.parse(raw)
        store = Store(db)
        store.upgrade()
        metrics = Metrics(ModelMetrics(cfg, store, clock=lambda: NOW))
        started = time.perf_counter()
        report = tick_job(cfg, store, NOW, metrics=metrics)[0]
        ticked = time.perf_counter() - started
        started = time.perf_counter()
        text = metrics.render().decode()
        scraped = time.perf_counter() - started
        series = sum(1 for line in text.splitlines() if line.startswith("tailwatch_"))
        if not quiet:
            print(f"{case:>9} {values:>7,}  rows {report.folded:>7,}  tick {ticked:6.2f} s  scrape {scraped:5.3f} s  "
                  f"series {series:>6,}  in <other> {dict(report.capped)}")
        store.dispose()
        return scraped
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["versions", "stages", "segments"])
    parser.add_argument("--values", type=int, default=3000)
    args = parser.parse_args()
    cases = [(args.case, args.values)] if args.case else CASES
    run("versions", 10, quiet=True)  # the modules a first tick imports, out of the figures
    worst = max(run(case, values) for case, values in cases)
    return 0 if worst < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
