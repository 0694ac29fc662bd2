"""Evaluation on real public data: `python bench/realdata.py [--case NAME ...] [--short] [--out DIR] [--keep]`.

For each case (monitor/simulate/realdata.py and realcases.py, docs/evaluation.md): build the serving logs,
reference, config and ground truth from a public data set shipped inside River's, scikit-learn's or
statsmodels' package, run `tailwatch db upgrade`, `reference build` and `backfill` over the whole range,
then score the stored verdicts and findings: one criterion per fault (the slowdown's stage named, the
timeouts found, the hot value named, the quality change found from labels), no false alarm in the healthy
range, every finding with a value carrying n and an interval. Then per fault, as bench/incidents.py scores
an incident's life: its windows right / opposite / drift / healthy / other, onset error, first alert, and
how its incidents resolved against the fault's end; and the healthy range's incidents and alerting
verdicts. Prints the seconds each command took; exits 1 when any criterion or target is missed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import incidents

from monitor.simulate import realcases, realdata, realscore


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    every = realcases.all_cases()
    ap.add_argument("--case", nargs="+", choices=sorted(every), default=sorted(every))
    ap.add_argument("--short", action="store_true", help="the short versions the test runs")
    ap.add_argument("--out", type=Path, help="work directory (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, database)")
    args = ap.parse_args()
    cases = realdata.short_cases() + realcases.short_cases() if args.short else [every[n]() for n in args.case]
    root = args.out or Path(tempfile.mkdtemp(prefix="tailwatch-realdata-"))
    scores, missed = [], []
    try:
        for case in cases:
            out = root / case.name
            if out.exists():
                shutil.rmtree(out)
            started = time.perf_counter()
            truth = realcases.build_case(case, out)
            built = time.perf_counter() - started
            print(f"{case.name}: {truth['predictions']:,} predictions, {truth['labels']:,} labels, "
                  f"{truth['timings']:,} timings over {case.days:g} days; built in {built:.1f} s", flush=True)
            seconds = realscore.run(out)
            print(f"  seconds: {seconds}", flush=True)
            scores.append(realscore.score(out))
            print(realscore.table(scores[-1:]), flush=True)
            if not lives(case, truth, out):
                missed.append(f"{case.name} (incident targets)")
    finally:
        if args.keep or args.out:
            print(f"work directory: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    missed = [s.case for s in scores if not s.passed] + missed
    print(f"\n{len(scores) - len(missed)} of {len(scores)} cases pass" + (f"; missed: {', '.join(missed)}" if missed else ""))
    return 1 if missed else 0


def lives(case, truth: dict, out: Path) -> bool:
    """Print each fault's incident life (bench/incidents.py's scoring of the live backfill) and the healthy
    range's false alarms; whether every fault meets bench/incidents.py's targets."""
    stored, verdicts = realscore.stored(out)
    print(f"  {incidents.BREAKDOWN_HEADER.splitlines()[0]} misses |")
    met = True
    for name, t, s, window in incidents.realdata_scores(case, truth, stored, verdicts):
        missed = incidents.misses(t, s, window)
        met = met and not missed
        print(f"  | {name.split(': ', 1)[1]} | {incidents.window_length(window)} | {incidents.breakdown(t, s, stored, window)} "
              f"| {'; '.join(missed) or 'ok'} |")
    print(f"  healthy range: {realscore.healthy_alarms(truth, stored, verdicts)}", flush=True)
    return met


if __name__ == "__main__":
    sys.exit(main())
