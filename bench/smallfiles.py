"""Many small files: one tick over a directory of one-line JSON Lines files, against a bare Python loop that
lists the directory and opens, reads and closes each file once, in the same run.

    .venv/bin/python bench/smallfiles.py                 # 20,000 files
    .venv/bin/python bench/smallfiles.py --files 5000

Writes the files (deterministically, in a temp dir removed afterwards), runs the bare loop, then
`monitor.daemon.runner.tick` on a fresh SQLite store (listing, one stat and one read per file, parse, validate,
fold, commit of every file's offset), then the loop again; the ratio is the tick over the faster loop.
A second tick (nothing new) is timed too. Exits 1 when the tick costs more than 5x the loop.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

START = datetime(2026, 11, 1, tzinfo=UTC)
TARGET = 5.0


def write_files(folder: Path, n: int) -> None:
    statuses = ("ok", "ok", "ok", "timeout", "error")
    for i in range(n):
        row = {"request_id": f"req-{i:07d}", "ts": (START + timedelta(seconds=i)).isoformat(),
               "model_version": "v1", "status": statuses[i % 5], "latency_ms": 10.0 + i % 17, "tenure": i % 72}
        (folder / f"part-{i:07d}.jsonl").write_text(json.dumps(row) + "\n")


def bare_loop(folder: Path) -> tuple[float, int]:
    """List the folder, open, read and close each file once: seconds, bytes read."""
    started = time.perf_counter()
    total = 0
    for entry in os.scandir(folder):
        with open(entry.path, "rb") as fh:
            total += len(fh.read())
    return time.perf_counter() - started, total


def main() -> int:
    from monitor import config as config_mod
    from monitor.daemon.runner import tick
    from storage.store import Store

    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=20_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tw-smallfiles-"))
    try:
        logs = work / "logs"
        logs.mkdir()
        write_files(logs, args.files)
        cfg = config_mod.parse({"services": [{"name": "bench", "sources": {
            "predictions": {"kind": "files", "path": str(logs), "pattern": "*.jsonl"}},
            "schema": {"features": {"tenure": "numeric"}}, "join": {"lateness": "0s"}}]})
        store = Store(f"sqlite:///{work / 'tw.db'}")
        store.upgrade()
        loop_before, size = bare_loop(logs)
        now = START + timedelta(seconds=args.files + 60)
        started = time.perf_counter()
        [report] = tick(cfg, store, now)
        first = time.perf_counter() - started
        loop_after, _ = bare_loop(logs)
        started = time.perf_counter()
        [again] = tick(cfg, store, now + timedelta(minutes=1))
        second = time.perf_counter() - started
        store.dispose()
        loop = min(loop_before, loop_after)
        assert report.status == "ok", report.error
        assert report.folded == args.files and again.read["predictions"] == 0, (report.folded, again.read)
        ratio = first / loop
        print(f"{args.files:,} one-line files ({size / 1e6:.1f} MB): bare loop {loop:.3f} s "
              f"(runs {loop_before:.3f}, {loop_after:.3f}); tick {first:.3f} s "
              f"({args.files / first:,.0f} files/s), ratio {ratio:.2f}x (target <= {TARGET:g}x); "
              f"next tick with nothing new {second:.3f} s")
        return 0 if ratio <= TARGET else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    from malloc_env import reexec  # bench/malloc_env.py: run as deployed

    reexec()
    sys.exit(main())
