"""Evaluation on real public data: `python bench/realdata.py [--case shuttle-monthly segment-hourly]
[--short] [--out DIR] [--keep]`.

For each case (monitor/simulate/realdata.py, docs/evaluation.md): build the serving logs, reference,
config and ground truth from a UCI data set shipped inside River's wheel, run `tailwatch db upgrade`,
`reference build` and `backfill` over the whole range, then score the stored verdicts and findings:
the slowdown's stage named, the quality change found from labels, no false alarm in the healthy range,
every finding with a value carrying n and an interval. Prints a table per case and the seconds each
command took; exits 1 when any criterion is missed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from monitor.simulate import realdata, realscore


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", nargs="+", choices=sorted(realdata.CASES), default=sorted(realdata.CASES))
    ap.add_argument("--short", action="store_true", help="the short versions the test runs")
    ap.add_argument("--out", type=Path, help="work directory (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, database)")
    args = ap.parse_args()
    cases = realdata.short_cases() if args.short else [realdata.CASES[name]() for name in args.case]
    root = args.out or Path(tempfile.mkdtemp(prefix="tailwatch-realdata-"))
    scores = []
    try:
        for case in cases:
            out = root / case.name
            if out.exists():
                shutil.rmtree(out)
            started = time.perf_counter()
            truth = realdata.build(case, out)
            built = time.perf_counter() - started
            print(f"{case.name}: {truth['predictions']:,} predictions, {truth['labels']:,} labels, "
                  f"{truth['timings']:,} timings over {case.days:g} days; built in {built:.1f} s", flush=True)
            seconds = realscore.run(out)
            print(f"  seconds: {seconds}", flush=True)
            scores.append(realscore.score(out))
            print(realscore.table(scores[-1:]), flush=True)
    finally:
        if args.keep or args.out:
            print(f"work directory: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    missed = [s.case for s in scores if not s.passed]
    print(f"\n{len(scores) - len(missed)} of {len(scores)} cases pass" + (f"; missed: {', '.join(missed)}" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
