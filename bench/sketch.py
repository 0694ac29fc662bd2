"""Quantile sketches: tailwatch's Sketch against ddsketch's DDSketch on the same latency values, in one run.

    .venv/bin/python bench/sketch.py                 # 1M rows, 5 rounds (about 30 s)
    .venv/bin/python bench/sketch.py --rows 200000   # quick run

The data has the shape of a tick's latencies: a lognormal mixture (most requests fast, a slower mode, a
thin tail of very slow ones) and four per-stage columns, in 5-minute buckets of about 3,000 rows each,
rows in arrival order. Both sides sketch every column per bucket at the same relative accuracy
(`RELATIVE_ACCURACY` of monitor/aggregate/sketch.py):

- tailwatch: what a fold does, `Values(column).table(grouping)` for each column over one grouping of the
  rows by bucket, then `.sketches()` for a Sketch object per bucket (the fold stores the tables; the
  objects are what a DDSketch per bucket would be the match of).
- ddsketch: the rows put in bucket order once, then a `DDSketch` per bucket and column, each value added
  with `add` (ddsketch has no batch add).

The sides alternate over the rounds; the median wall-clock time of each is printed, with their ratio and
each sketch's p50 / p95 / p99 relative error against the exact quantiles (numpy, `lower`: the value at
rank floor(q * (n - 1)), the rank both sketches read), the median and worst over every bucket and column.
Exits 1 when either sketch's worst error exceeds the relative accuracy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ddsketch import DDSketch  # noqa: E402

from monitor.aggregate.sketch import RELATIVE_ACCURACY, Grouping, Sketch, Values  # noqa: E402

SEED = 20261206
PER_BUCKET = 3000  # rows per 5-minute bucket, about
QUANTILES = (0.5, 0.95, 0.99)
# (share of requests, median ms, sigma of log): the end-to-end latency's modes.
LATENCY_MIX = ((0.85, 40.0, 0.35), (0.12, 220.0, 0.5), (0.03, 2500.0, 0.8))
# (stage, median ms, sigma of log)
STAGES = (("preprocess", 2.0, 0.6), ("queue", 5.0, 1.2), ("inference", 30.0, 0.4), ("postprocess", 1.5, 0.5))


def make_columns(rows: int, seed: int) -> tuple[np.ndarray, int, dict[str, np.ndarray]]:
    """The bucket of each row (non-decreasing: arrival order), the bucket count, and the value columns in ms."""
    rng = np.random.default_rng(seed)
    buckets = max(1, round(rows / PER_BUCKET))
    # Bucket sizes vary like a day's traffic: +-40% around PER_BUCKET.
    weight = 1 + 0.4 * np.sin(np.linspace(0, 2 * np.pi, buckets)) + rng.uniform(-0.05, 0.05, buckets)
    g = np.sort(rng.choice(buckets, rows, p=weight / weight.sum()))
    g = np.unique(g, return_inverse=True)[1].astype("int64")  # every bucket holds a row
    mode = rng.choice(len(LATENCY_MIX), rows, p=[share for share, _, _ in LATENCY_MIX])
    medians = np.array([m for _, m, _ in LATENCY_MIX])[mode]
    sigmas = np.array([s for _, _, s in LATENCY_MIX])[mode]
    cols = {"latency_ms": np.exp(np.log(medians) + sigmas * rng.standard_normal(rows))}
    for stage, median, sigma in STAGES:
        cols[f"{stage}_ms"] = rng.lognormal(np.log(median), sigma, rows)
    return g, int(g.max()) + 1, cols


def tailwatch(g: np.ndarray, groups: int, cols: dict[str, np.ndarray]) -> dict[str, dict[int, Sketch]]:
    """Column -> bucket -> Sketch, built as a fold builds them (one grouping, a table per column)."""
    grouping = Grouping(g, groups)
    out = {}
    for name, v in cols.items():
        table = Values(v).table(grouping)
        out[name] = table.sketches() if table is not None else {}
    return out


def ddsketches(g: np.ndarray, groups: int, cols: dict[str, np.ndarray]) -> dict[str, dict[int, DDSketch]]:
    """Column -> bucket -> DDSketch of the same values, each added one at a time."""
    order = np.argsort(g, kind="stable")
    starts = np.searchsorted(g[order], np.arange(groups + 1)).tolist()
    out = {}
    for name, v in cols.items():
        ordered = v[order].tolist()
        per = {}
        for gi in range(groups):
            s = DDSketch(RELATIVE_ACCURACY)
            add = s.add
            for x in ordered[starts[gi]:starts[gi + 1]]:
                add(x)
            per[gi] = s
        out[name] = per
    return out


def errors(g: np.ndarray, groups: int, cols: dict[str, np.ndarray], tw: dict, dd: dict) -> dict[str, np.ndarray]:
    """Side -> relative errors, shape (buckets * columns, len(QUANTILES))."""
    order = np.argsort(g, kind="stable")
    starts = np.searchsorted(g[order], np.arange(groups + 1))
    out: dict[str, list] = {"tailwatch": [], "ddsketch": []}
    for name, v in cols.items():
        ordered = v[order]
        for gi in range(groups):
            exact = np.quantile(ordered[starts[gi]:starts[gi + 1]], QUANTILES, method="lower")
            ours = np.array([tw[name][gi].quantile(q) for q in QUANTILES])
            theirs = np.array([dd[name][gi].get_quantile_value(q) for q in QUANTILES])
            out["tailwatch"].append(np.abs(ours - exact) / exact)
            out["ddsketch"].append(np.abs(theirs - exact) / exact)
    return {k: np.array(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows (default 1M)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per side (default 5)")
    args = parser.parse_args(argv)
    g, groups, cols = make_columns(args.rows, SEED)
    print(f"{args.rows:,} rows in {groups} buckets of {args.rows / groups:,.0f} rows, {len(cols)} columns "
          f"({', '.join(cols)}); relative accuracy {RELATIVE_ACCURACY}")
    tailwatch(g[:5000], int(g[4999]) + 1, {k: v[:5000] for k, v in cols.items()})  # warm-up
    times: dict[str, list[float]] = {"tailwatch": [], "ddsketch": []}
    for _ in range(args.rounds):
        for side, fn in (("tailwatch", tailwatch), ("ddsketch", ddsketches)):
            t0 = time.perf_counter()
            built = fn(g, groups, cols)
            times[side].append(time.perf_counter() - t0)
            if side == "tailwatch":
                tw = built
            else:
                dd = built
            del built
    med = {k: statistics.median(v) for k, v in times.items()}
    values = args.rows * len(cols)
    for side in ("tailwatch", "ddsketch"):
        print(f"{side:>9}: median {med[side]:.3f} s of {args.rounds} "
              f"({values / med[side] / 1e6:.2f}M values/s; rounds {', '.join(f'{t:.3f}' for t in times[side])})")
    print(f"ddsketch / tailwatch: {med['ddsketch'] / med['tailwatch']:.1f}x the time")
    err = errors(g, groups, cols, tw, dd)
    labels = "  ".join(f"p{round(q * 100)}" for q in QUANTILES)
    print(f"relative error vs exact, median / worst over {groups * len(cols)} bucket columns ({labels}):")
    worst = 0.0
    for side, e in err.items():
        cells = "  ".join(f"{m:.4%} / {w:.4%}" for m, w in zip(np.median(e, axis=0), e.max(axis=0), strict=True))
        print(f"{side:>9}: {cells}")
        worst = max(worst, float(e.max()))
    if worst > RELATIVE_ACCURACY * (1 + 1e-9):
        print(f"target missed: worst error {worst:.4%} > {RELATIVE_ACCURACY:.0%}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
