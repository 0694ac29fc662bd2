"""Checks benchmark: tailwatch's checks against Evidently 0.7 on the same data, in one run.

    .venv/bin/python bench/checks_vs_evidently.py               # 1M-row window and reference
    .venv/bin/python bench/checks_vs_evidently.py --rows 100000 # quick run

Three parts, each on data generated deterministically with numpy (10 numeric, 5 categorical and 1 text
column; the current window drifts in some of them, has more missing values, values outside the
reference range and categories the reference never had):

1. Checks vs Evidently, on three shapes of the same data, each shape's two sides run one after the
   other: `shared` (each distinct string one Python object, as parquet and Arrow hand them out),
   `distinct` (a new str object per categorical and text value of every row, as parsing JSON gives)
   and `unique` (`distinct`, and every text made unique by a leading ticket number). Each side runs in its own subprocess, so its peak RSS (the child's VmHWM,
   reset once the data is generated) is its own; both hold the same two frames. tailwatch:
   `build_profile` on the reference (timed apart: the profile is built once and stored), `fold` of the
   current rows into 5-minute partials, their merge into one 15-minute window, `evaluate` (every
   registered check). Evidently: one `Report` with `ValueDrift` (psi for numeric, jensenshannon for
   categorical) and `MissingValueCount` for every column, `OutRangeValueCount` for every numeric
   column (bounds: the reference min / max). The text column's drift is measured on its length (a
   `TextLength` descriptor, psi) as tailwatch's `length_distribution` does; Evidently's own text
   methods train a domain classifier, which is another measurement.
   Targets: at least 10x faster (5x on `unique`), at most half the peak memory.
2. Incremental cost: 24 ticks of rows/10 rows each (fold, then upsert into a SQLite store in its own
   transaction, not durable, as the ingest stage's step does) against one fold + upsert of all 2.4 x rows,
   the stored buckets checked identical. Target: <= 1.3x, on the fastest wall-clock time of each side over
   INCREMENTAL_RUNS alternating runs (other load on a shared machine only adds time); the ratio of the
   medians and the CPU-time ratio are printed beside it.
3. History: scoring one 15-minute window (`monitor.verdicts.windows.score`) with 1 day and with 30 days of
   5-minute buckets stored. Target: time ratio (30 days / 1 day) <= 1.2, i.e. ~1.

Prints a rich table and a Markdown table (for docs/performance.md); exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

os.environ.setdefault("DO_NOT_TRACK", "1")  # before anything can import Evidently

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shapes import (  # noqa: E402  (bench/shapes.py: the data both sides check)
    CATEGORICAL,
    NUMERIC,
    SEED,
    SHAPES,
    TEXT,
    make_features,
    reshape,
    schema,
    with_contract,
)

START = datetime(2026, 12, 1, tzinfo=UTC)
WINDOW = timedelta(minutes=15)
BUCKET = timedelta(minutes=5)
SERVICE = "bench"
SPEED_TARGET = {"shared": 10.0, "distinct": 10.0, "unique": 5.0}  # Evidently seconds / tailwatch seconds, at least
MEMORY_TARGET = 0.5  # tailwatch peak RSS / Evidently peak RSS, at most
INCREMENTAL_TARGET = 1.3  # 24 small ticks / one large pass, at most
HISTORY_TARGET = 1.2  # scoring with 30 days stored / with 1 day stored, at most
TICKS = 24
TAILWATCH_RUNS = 3  # the tailwatch side is timed as the median of 3; Evidently's single run takes minutes
HISTORY_RUNS = 7
INCREMENTAL_RUNS = 5


# -- memory of this process ----------------------------------------------------------------------

def _status(key: str) -> int:
    """A /proc/self/status size in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key + ":"))
    except (OSError, StopIteration):
        return 0


def _settle() -> int:
    """Collect garbage and hand freed heap back to the OS (glibc), so RSS is the live data; returns it."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return _status("VmRSS")


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so the peak read later is that of what follows."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


# -- part 1: checks vs Evidently, one subprocess per side ------------------------------------------

def _tailwatch_side(rows: int, shape: str) -> dict:
    from checks.evaluate import evaluate
    from monitor.aggregate.fold import fold
    from monitor.aggregate.partial import Partial, merge_all
    from monitor.aggregate.profile import build_profile

    sch = schema()
    ref = reshape(make_features(rows, SEED, drift=False), shape, SEED)
    cur = with_contract(reshape(make_features(rows, SEED + 1, drift=True), shape, SEED + 1), START, WINDOW, SEED + 2)

    peaks: dict[str, int] = {}

    def phase(name: str, times: dict, fn, *args):
        # VmHWM is reset before each phase: the largest phase peak is the run's peak.
        _reset_peak()
        t0 = time.perf_counter()
        out = fn(*args)
        times[name] = time.perf_counter() - t0
        peaks[name] = max(peaks.get(name, 0), _status("VmHWM"))
        return out

    def run(r: pd.DataFrame, c: pd.DataFrame) -> tuple[dict, list]:
        times: dict[str, float] = {}
        profile = phase("profile", times, build_profile, r, sch)
        parts = phase("fold", times, lambda: fold(c, BUCKET, [], timed=False, schema=sch, profile=profile))
        window = phase("merge", times, lambda: merge_all(Partial.from_bytes(p.payload) for p in parts))
        findings = phase("evaluate", times, evaluate, window, profile, None)
        assert window.rows == len(c), (window.rows, len(c))
        return times, findings

    run(ref.iloc[:2000], cur.iloc[:2000])  # warm-up: first calls, lazy imports
    peaks.clear()
    base = _settle()
    reset = _reset_peak()
    runs = [run(ref, cur) for _ in range(TAILWATCH_RUNS)]
    times = [t for t, _ in runs]
    findings = runs[-1][1]
    median = {k: statistics.median(t[k] for t in times) for k in times[0]}
    peak = max(peaks.values()) if reset else _status("VmHWM")
    return {"times": median, "all": times, "base_rss": base, "peak_rss": peak, "reset": reset,
            "phase_peaks": {k: v - base for k, v in peaks.items()},
            "findings": len(findings), "breaches": sorted({f"{f.check}:{f.labels.get('field', '')}"
                                                           for f in findings if f.status == "breach"})}


def _evidently_report(ref: pd.DataFrame, cur: pd.DataFrame, times: dict | None = None):
    from evidently import DataDefinition, Dataset, Report
    from evidently.descriptors import TextLength
    from evidently.metrics import MissingValueCount, OutRangeValueCount, ValueDrift

    length = f"{TEXT}_length"
    definition = DataDefinition(numerical_columns=list(NUMERIC), categorical_columns=list(CATEGORICAL),
                                text_columns=[TEXT])

    def dataset(frame: pd.DataFrame):
        return Dataset.from_pandas(frame, data_definition=definition, descriptors=[TextLength(TEXT, alias=length)])

    t0 = time.perf_counter()
    cur_ds, ref_ds = dataset(cur), dataset(ref)
    t1 = time.perf_counter()
    metrics = [ValueDrift(column=c, method="psi") for c in NUMERIC]
    metrics += [ValueDrift(column=c, method="jensenshannon") for c in CATEGORICAL]
    metrics += [ValueDrift(column=length, method="psi")]
    metrics += [MissingValueCount(column=c) for c in NUMERIC + CATEGORICAL + [TEXT]]
    metrics += [OutRangeValueCount(column=c, left=float(ref[c].min()), right=float(ref[c].max())) for c in NUMERIC]
    snapshot = Report(metrics).run(cur_ds, ref_ds)
    if times is not None:
        times["datasets"], times["report"] = t1 - t0, time.perf_counter() - t1
    return snapshot


def _evidently_side(rows: int, shape: str) -> dict:
    import evidently

    ref = reshape(make_features(rows, SEED, drift=False), shape, SEED)
    cur = reshape(make_features(rows, SEED + 1, drift=True), shape, SEED + 1)
    _evidently_report(ref.iloc[:2000], cur.iloc[:2000])  # warm-up
    base = _settle()
    reset = _reset_peak()
    times: dict[str, float] = {}
    snapshot = _evidently_report(ref, cur, times)
    peak = _status("VmHWM")
    results = len(snapshot.dict().get("metrics", []))
    return {"times": times, "base_rss": base, "peak_rss": peak, "reset": reset,
            "metrics": results, "version": evidently.__version__}


def run_side(side: str, rows: int, shape: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--_child", side, str(rows), shape], capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{side} side failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def checks_vs_evidently(rows: int, shape: str) -> dict:
    tw = run_side("tailwatch", rows, shape)
    print(f"{shape}: tailwatch side: {tw['times']}", file=sys.stderr)
    ev = run_side("evidently", rows, shape)
    print(f"{shape}: evidently side: {ev['times']}", file=sys.stderr)
    tw_all = sum(tw["times"].values())
    tw_stored = tw_all - tw["times"]["profile"]
    ev_s = sum(ev["times"].values())
    return {
        "rows": rows, "shape": shape, "tailwatch": tw, "evidently": ev, "tw_seconds": tw_all, "tw_stored_seconds": tw_stored,
        "ev_seconds": ev_s, "speedup": ev_s / tw_all, "speedup_stored": ev_s / tw_stored,
        "memory_ratio": tw["peak_rss"] / ev["peak_rss"],
        "memory_ratio_above_data": (tw["peak_rss"] - tw["base_rss"]) / max(ev["peak_rss"] - ev["base_rss"], 1),
    }


# -- part 2: 24 ticks vs one pass ------------------------------------------------------------------

def _fresh_store(work: Path, name: str):
    from storage.store import Store

    db = work / f"{name}-{time.monotonic_ns()}.db"
    store = Store(f"sqlite:///{db}")
    store.upgrade()
    return store, db


def _drop(store, db: Path) -> None:
    store.dispose()
    for f in db.parent.glob(db.name + "*"):
        f.unlink()


def _fold_upsert(store, frame: pd.DataFrame, sch, profile) -> None:
    from monitor.aggregate.fold import fold
    from monitor.aggregate.partial import merge_bytes

    parts = fold(frame, BUCKET, [], timed=False, schema=sch, profile=profile)
    with store.transaction(durable=False) as session:  # as monitor.ingest.stage commits a step
        store.partials.upsert(session, SERVICE, parts, merge_bytes)


def _stored_counts(store) -> dict:
    from monitor.aggregate.partial import Partial

    with store.transaction() as session:
        rows = store.partials.load(session, SERVICE, START - timedelta(days=1), START + timedelta(days=1))
    out = {}
    for r in rows:
        p = Partial.from_bytes(r.payload)
        out[r.bucket_start] = (r.rows, dict(p.counts), p.hists)
    return out


def incremental(rows: int, work: Path) -> dict:
    from monitor.aggregate.profile import build_profile

    sch = schema()
    profile = build_profile(make_features(min(rows, 200_000), SEED, drift=False), sch)
    tick_rows = max(rows // 10, 1)
    total = tick_rows * TICKS
    # Two hours of rows starting 100 s past a bucket boundary: every tick's rows straddle two buckets,
    # so each tick's upsert merges into a bucket the previous tick wrote, as late-in-bucket ticks do.
    frame = with_contract(make_features(total, SEED + 3, drift=True), START + timedelta(seconds=100),
                          timedelta(hours=2), SEED + 4)
    store, db = _fresh_store(work, "warm")
    _fold_upsert(store, frame.iloc[:2000], sch, profile)  # warm-up
    _drop(store, db)
    ticks, single, ticks_cpu, single_cpu = [], [], [], []
    for _ in range(INCREMENTAL_RUNS):
        store, db = _fresh_store(work, "ticks")
        t0, c0 = time.perf_counter(), time.process_time()
        for k in range(TICKS):
            _fold_upsert(store, frame.iloc[k * tick_rows:(k + 1) * tick_rows], sch, profile)
        ticks.append(time.perf_counter() - t0)
        ticks_cpu.append(time.process_time() - c0)
        a = _stored_counts(store)
        _drop(store, db)
        store, db = _fresh_store(work, "single")
        t0, c0 = time.perf_counter(), time.process_time()
        _fold_upsert(store, frame, sch, profile)
        single.append(time.perf_counter() - t0)
        single_cpu.append(time.process_time() - c0)
        b = _stored_counts(store)
        _drop(store, db)
        if a != b:
            raise SystemExit("24 ticks and one pass stored different partials")
    t, s = min(ticks), min(single)
    return {"tick_rows": tick_rows, "total": total, "ticks_seconds": t, "single_seconds": s, "ratio": t / s,
            "median_ratio": statistics.median(ticks) / statistics.median(single),
            "cpu_ratio": min(ticks_cpu) / min(single_cpu), "buckets": len(a)}


# -- part 3: scoring with 1 day vs 30 days stored --------------------------------------------------

def history(work: Path) -> dict:
    from monitor.aggregate.fold import fold
    from monitor.aggregate.profile import build_profile
    from monitor.verdicts.windows import score
    from storage.rows import PartialRow

    sch = schema()
    profile = build_profile(make_features(200_000, SEED, drift=False), sch)
    # One realistic bucket payload (3,000 rows, histograms on the profile's bins), stored for every bucket.
    sample = with_contract(make_features(3000, SEED + 5, drift=False), START, BUCKET, SEED + 6)
    [template] = fold(sample, BUCKET, [], timed=False, schema=sch, profile=profile)
    end = START + timedelta(days=40)
    window = (end - WINDOW, end)
    stores = {}
    for days in (1, 30):
        store, db = _fresh_store(work, f"history{days}")
        n = int(timedelta(days=days) / BUCKET)
        rows = [PartialRow("v1", end - (i + 1) * BUCKET, int(BUCKET.total_seconds()), "", template.rows,
                           template.payload) for i in range(n)]
        for first in range(0, n, 2000):
            with store.transaction() as session:
                store.partials.upsert(session, SERVICE, rows[first:first + 2000], lambda a, b: b)
        stores[days] = (store, db, n)
    found = {}
    for days, (store, _, _) in stores.items():
        [scored] = score(store, SERVICE, profile, [window])  # warm-up, and what it saw
        found[days] = (scored.rows, len(scored.findings))
    times: dict[int, list[float]] = {1: [], 30: []}
    for _ in range(HISTORY_RUNS):
        for days, (store, _, _) in stores.items():
            t0 = time.perf_counter()
            score(store, SERVICE, profile, [window])
            times[days].append(time.perf_counter() - t0)
    for store, db, _ in stores.values():
        _drop(store, db)
    if found[1] != found[30]:
        raise SystemExit(f"scoring saw different windows: {found}")
    one, thirty = statistics.median(times[1]), statistics.median(times[30])
    return {"one_day": one, "thirty_days": thirty, "ratio": thirty / one, "buckets": {1: stores[1][2], 30: stores[30][2]},
            "window_rows": found[1][0], "findings": found[1][1], "payload_bytes": len(template.payload)}


# -- output ----------------------------------------------------------------------------------------

def _mib(b: float) -> str:
    return f"{b / 2**20:,.0f} MiB"


def render(part1: list[dict] | None, part2: dict | None, part3: dict | None) -> list[str]:
    """Print the tables; return the targets missed."""
    from rich.console import Console
    from rich.table import Table

    missed: list[str] = []
    lines: list[tuple[str, str, str, str, str, bool]] = []  # measure, tailwatch, other, ratio, target, met
    for p1 in part1 or []:
        tw, ev, shape = p1["tailwatch"], p1["evidently"], p1["shape"]
        target = SPEED_TARGET[shape]
        ok = p1["speedup"] >= target
        lines.append((f"checks, `{shape}` strings, {p1['rows']:,}-row window vs {p1['rows']:,}-row reference: time "
                      "(profile + fold + merge + evaluate)",
                      f"{p1['tw_seconds']:.2f} s", f"{p1['ev_seconds']:.1f} s",
                      f"{p1['speedup']:.1f}x faster", f">= {target:g}x faster", ok))
        if not ok:
            missed.append(f"checks speed-up ({shape}) {p1['speedup']:.1f}x < {target:g}x")
        lines.append((f"same, `{shape}`, profile stored (fold + merge + evaluate)", f"{p1['tw_stored_seconds']:.2f} s",
                      f"{p1['ev_seconds']:.1f} s", f"{p1['speedup_stored']:.1f}x faster", "(information)", True))
        ok = p1["memory_ratio"] <= MEMORY_TARGET
        lines.append((f"checks, `{shape}`: peak RSS (both frames held by each side)", _mib(tw["peak_rss"]),
                      _mib(ev["peak_rss"]), f"{p1['memory_ratio']:.2f}", f"<= {MEMORY_TARGET:g}", ok))
        if not ok:
            missed.append(f"checks peak memory ratio ({shape}) {p1['memory_ratio']:.2f} > {MEMORY_TARGET:g}")
        lines.append((f"checks, `{shape}`: peak RSS above the loaded data", _mib(tw["peak_rss"] - tw["base_rss"]),
                      _mib(ev["peak_rss"] - ev["base_rss"]), f"{p1['memory_ratio_above_data']:.2f}",
                      "(information)", True))
    if part2 is not None:
        ok = part2["ratio"] <= INCREMENTAL_TARGET
        lines.append((f"{TICKS} ticks of {part2['tick_rows']:,} rows vs one pass of {part2['total']:,} "
                      "(fold + SQLite upsert)", f"{part2['ticks_seconds']:.2f} s", f"{part2['single_seconds']:.2f} s",
                      f"{part2['ratio']:.2f}", f"<= {INCREMENTAL_TARGET:g}", ok))
        if not ok:
            missed.append(f"incremental ratio {part2['ratio']:.2f} > {INCREMENTAL_TARGET:g}")
    if part3 is not None:
        ok = part3["ratio"] <= HISTORY_TARGET
        lines.append(("score one 15-min window: 30 days vs 1 day of 5-min buckets stored",
                      f"{part3['thirty_days'] * 1000:.0f} ms", f"{part3['one_day'] * 1000:.0f} ms",
                      f"{part3['ratio']:.2f}", f"<= {HISTORY_TARGET:g} (~1)", ok))
        if not ok:
            missed.append(f"history ratio {part3['ratio']:.2f} > {HISTORY_TARGET:g}")

    title = f"tailwatch checks benchmark, {os.cpu_count()} cores"
    if part1:
        title += f", Evidently {part1[0]['evidently']['version']}"
    table = Table(title=title)
    for col in ("measure", "tailwatch", "Evidently / baseline", "ratio", "target", "met"):
        table.add_column(col, justify="left" if col in ("measure", "target") else "right")
    for measure, a, b, ratio, target, ok in lines:
        table.add_row(measure, a, b, ratio, target, "yes" if ok else "NO")
    Console(width=max(Console().width, 150)).print(table)
    for p1 in part1 or []:
        tw, ev = p1["tailwatch"], p1["evidently"]
        print(f"`{p1['shape']}`: tailwatch side, median of {TAILWATCH_RUNS}: "
              + ", ".join(f"{k} {v:.2f} s (peak +{_mib(tw['phase_peaks'][k])})" for k, v in tw["times"].items()))
        print("Evidently side, one run: " + ", ".join(f"{k} {v:.2f} s" for k, v in ev["times"].items())
              + f"; {ev['metrics']} metrics")
        print(f"loaded data (both frames, imports included): tailwatch {_mib(tw['base_rss'])}, "
              f"Evidently {_mib(ev['base_rss'])}; tailwatch findings {tw['findings']}, breaches: "
              + ", ".join(tw["breaches"]))
    if part2 is not None:
        print(f"incremental: {part2['buckets']} buckets stored, identical either way; fastest of {INCREMENTAL_RUNS} "
              f"runs each (wall clock); ratio of the medians {part2['median_ratio']:.2f}, "
              f"of the CPU times (fastest) {part2['cpu_ratio']:.2f}")
    if part3 is not None:
        print(f"history: {part3['buckets'][1]:,} vs {part3['buckets'][30]:,} buckets stored "
              f"({part3['payload_bytes']:,} B each); window of {part3['window_rows']:,} rows, "
              f"{part3['findings']} findings; median of {HISTORY_RUNS}")
    print("\nMarkdown (docs/performance.md):\n")
    md = ["| measure | tailwatch | Evidently / baseline | ratio | target |", "|---|---:|---:|---:|---|"]
    md += [f"| {m} | {a} | {b} | {r} | {t} |" for m, a, b, r, t, _ in lines]
    print("\n".join(md))
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000,
                        help="rows in the window and in the reference (default 1M); the incremental part "
                             "uses 24 ticks of rows/10")
    parser.add_argument("--only", choices=("checks", "incremental", "history"), help="run one part")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES),
                        help="data shapes of the checks part (default: all three)")
    parser.add_argument("--_child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        side, rows, shape = args._child
        result = (_tailwatch_side if side == "tailwatch" else _evidently_side)(int(rows), shape)
        print(json.dumps(result, default=str))
        return 0
    work = Path(tempfile.mkdtemp(prefix="tailwatch-bench-"))
    try:
        part1 = [checks_vs_evidently(args.rows, shape) for shape in args.shapes] if args.only in (None, "checks") else None
        part2 = incremental(args.rows, work) if args.only in (None, "incremental") else None
        part3 = history(work) if args.only in (None, "history") else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    missed = render(part1, part2, part3)
    for m in missed:
        print(f"target missed: {m}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
