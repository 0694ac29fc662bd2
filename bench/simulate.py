"""Simulator throughput and peak memory: `python bench/simulate.py [--rows 1000000 10000000] [--no-otlp]`.

Each size runs in its own subprocess (so peak RSS is that run's alone, read from getrusage ru_maxrss),
generating the `healthy` scenario over 24 h at the rate that gives the requested rows, into a temporary
directory that is removed afterwards. Prints rows/s, peak RSS and the ratio of the largest to the
smallest size's peak memory (flat memory means a ratio near 1).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOURS = 24.0


def _child(rows: int, otlp: bool, out: str) -> None:
    from monitor.simulate import generate
    from monitor.simulate.model import train

    train()  # train outside the timed part
    t = time.perf_counter()
    gt = generate("healthy", Path(out), seed=7, hours=HOURS, rate_per_s=rows / (HOURS * 3600), otlp=otlp)
    elapsed = time.perf_counter() - t
    size = sum(f.stat().st_size for f in Path(out).rglob("*") if f.is_file())
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"rows": gt.counts["predictions"], "seconds": elapsed, "peak_rss_mb": peak_mb,
                      "bytes": size, "parts": gt.counts["parts"]}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--no-otlp", action="store_true", help="skip the OTLP span files")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(int(a.child[0]), a.child[1] == "1", a.child[2])
        return
    results = []
    for rows in a.rows:
        tmp = tempfile.mkdtemp(prefix="tailwatch-bench-")
        try:
            cmd = [sys.executable, __file__, "--child", str(rows), "0" if a.no_otlp else "1", tmp]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        results.append(r)
        print(f"{r['rows']:>11,} rows  {r['seconds']:8.1f} s  {r['rows'] / r['seconds']:>9,.0f} rows/s  "
              f"peak RSS {r['peak_rss_mb']:7.0f} MB  output {r['bytes'] / 1e9:6.2f} GB  "
              f"({r['parts']} parts, otlp={'off' if a.no_otlp else 'on'})", flush=True)
    if len(results) > 1:
        lo, hi = results[0], results[-1]
        print(f"peak memory ratio {hi['rows']:,} / {lo['rows']:,} rows: {hi['peak_rss_mb'] / lo['peak_rss_mb']:.2f}")


if __name__ == "__main__":
    main()
