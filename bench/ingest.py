"""Ingest benchmark: tailwatch's tick against pyarrow's bare parse, on the same files, in one run.

    .venv/bin/python bench/ingest.py                   # 1M rows, then the 5M-row memory check
    .venv/bin/python bench/ingest.py --rows 200000 --skip-memory

Generates (deterministically, in a temp dir removed afterwards) a JSON Lines file of prediction rows
with a few bad lines of different kinds, and the same valid rows as Parquet. Measures
`pyarrow.json.read_json` and `pyarrow.parquet.read_table`, and tailwatch's ingest, 3 runs, each tick
right after the bare parse it is compared with (ratios: median of the 3 runs' ratios; rates: medians):
`monitor.daemon.runner.tick` on a fresh SQLite store (parse, validate, quarantine, commit of offsets and
per-bucket partials), its window scoring timed apart. Then one tick over a 5M-row JSONL backlog in a
subprocess, peak RSS measured (sampled, and the child's own VmHWM).
Exits 1 when a target is missed: JSONL >= 0.5x pyarrow, Parquet >= 2M rows/s, peak RSS < 1 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

START = datetime(2026, 11, 1, tzinfo=UTC)
SPAN = timedelta(days=1)  # the rows' timestamps cover one day (288 five-minute buckets)
NOW = START + SPAN + timedelta(minutes=1)
JSONL_RATIO_TARGET = 0.5
PARQUET_TARGET = 2_000_000  # rows/s
MEMORY_TARGET = 1 << 30  # bytes
RUNS = 3
SEED = 20261101

_WORDS = ("customer called about billing again please check the contract renewal discount offered "
          "router reset fiber outage résumé promo \"quoted\" escalate tier-2 ok thanks").split()


def _notes_pool(rng: np.random.Generator, n: int = 4096) -> np.ndarray:
    """Free-text notes of 0-300 characters (a third empty), drawn from a fixed pool."""
    pool = []
    for _ in range(n):
        target = 0 if rng.random() < 0.33 else int(rng.integers(5, 300))
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < target:
            words.append(_WORDS[int(rng.integers(len(_WORDS)))])
        pool.append(" ".join(words)[:target])
    return np.array(pool, dtype=object)


def make_rows(n: int, first: int = 0, total: int | None = None, seed: int = SEED) -> pd.DataFrame:
    """`n` valid prediction rows (rows first..first+n of a `total`-row stream), deterministic."""
    total = total or n
    rng = np.random.default_rng(seed + first)
    idx = np.arange(first, first + n)
    offset_ms = (idx * (SPAN.total_seconds() * 1000 / total)).astype(np.int64) + rng.integers(0, 500, n)
    ts = pd.to_datetime(int(START.timestamp() * 1000) + offset_ms, unit="ms", utc=True)
    status = rng.choice(np.array(["ok", "timeout", "rejected", "error"]), n, p=[0.94, 0.03, 0.01, 0.02])
    score = rng.beta(2, 5, n).round(4)
    return pd.DataFrame({
        "request_id": pd.Series(idx).map("req-{:09d}".format).to_numpy(),
        "ts": ts,
        "model_version": rng.choice(np.array(["churn-v7", "churn-v8"]), n, p=[0.8, 0.2]),
        "status": status,
        "tenure": rng.integers(0, 73, n),
        "MonthlyCharges": rng.uniform(18, 119, n).round(2),
        "Contract": rng.choice(np.array(["Month-to-month", "One year", "Two year"]), n, p=[0.55, 0.21, 0.24]),
        "InternetService": rng.choice(np.array(["DSL", "Fiber optic", "No"]), n, p=[0.34, 0.44, 0.22]),
        "notes": _notes_pool(rng)[rng.integers(0, 4096, n)],
        "prediction": np.where(score >= 0.5, "Yes", "No"),
        "score_Yes": score,
        "latency_ms": rng.lognormal(3.2, 0.5, n).round(3),
        "cache_hit": rng.random(n) < 0.3,
        "replica": rng.choice(np.array([f"pod-{k}" for k in range(8)]), n),
        "batch_size": rng.integers(1, 33, n),
        "queue_depth": rng.poisson(3, n),
    })


def bad_lines() -> list[bytes]:
    """20 lines that break the contract in different ways (each must be quarantined, nothing else)."""
    good = {"request_id": "bad-x", "ts": "2026-11-01T12:00:00.000Z", "model_version": "churn-v7", "status": "ok",
            "tenure": 12, "MonthlyCharges": 50.5, "Contract": "One year", "notes": "n", "latency_ms": 20.0}

    def row(**change) -> bytes:
        r = {**good, **change}
        return json.dumps({k: v for k, v in r.items() if v is not ...}).encode()

    return [
        b"{not json",
        b"[1, 2, 3]",
        b'"just a string"',
        b'{"request_id": "bad-trunc", "ts": "2026-11-01T12:00',
        row(notes="caf\u00e9").replace(b"caf\\u00e9", b"caf\xff\xfe"),  # invalid UTF-8
        row(request_id=...),
        row(status=None),
        row(ts="yesterday"),
        row(tenure="twelve"),
        row(request_id={"nested": [1]}),
        row(MonthlyCharges=[1, 2]),
        row(cache_hit="perhaps"),
        row(ts=-5),
        row(ts="1969-07-20T20:17:00Z"),
        row(ts=(NOW + timedelta(days=3)).isoformat().replace("+00:00", "Z")),
        row(status="maybe"),
        row(latency_ms=-1.5),
        row(notes="x" * 70_000),
        row(model_version=...),
        row(ts=None),
    ]


def _jsonl(frame: pd.DataFrame) -> bytes:
    out = frame.assign(ts=frame["ts"].dt.strftime("%Y-%m-%dT%H:%M:%S.%f").str[:-3] + "Z")
    return out.to_json(orient="records", lines=True, force_ascii=False).encode()


def write_jsonl(path: Path, rows: int, bad: int = 20, chunk: int = 1_000_000) -> int:
    """Write `rows` lines, `bad` of them broken (spread evenly); returns the number of bad lines."""
    broken = bad_lines()[:bad] if bad else []
    at = set(np.linspace(rows // (len(broken) + 1), rows - 1, len(broken), dtype=np.int64).tolist()) if broken else set()
    bad_iter = iter(broken)
    with open(path, "wb") as fh:
        for first in range(0, rows, chunk):
            n = min(chunk, rows - first)
            lines = _jsonl(make_rows(n, first, rows)).split(b"\n")[:n]
            for i in sorted(k - first for k in at if first <= k < first + n):
                lines[i] = next(bad_iter)
            fh.write(b"\n".join(lines) + b"\n")
    return len(broken)


def write_parquet(path: Path, rows: int) -> None:
    frame = make_rows(rows)
    frame["ts"] = frame["ts"].astype("datetime64[ms, UTC]")
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)


def service_config(directory: Path, db: Path):
    from monitor import config as config_mod

    return config_mod.parse({
        "storage": {"url": f"sqlite:///{db}"},
        "services": [{
            "name": "churn",
            "sources": {"predictions": {"kind": "files", "path": str(directory)}},
            "schema": {"features": {"tenure": "numeric", "MonthlyCharges": "numeric", "Contract": "categorical",
                                    "InternetService": "categorical", "notes": "text"},
                       "segments": ["Contract"], "classes": ["No", "Yes"], "positive_class": "Yes"},
        }],
    })


def run_tick(directory: Path, work: Path) -> tuple[float, dict]:
    """One tick of tailwatch over `directory` on a fresh SQLite store: (ingest seconds, report).

    Ingest is the tick without its window scoring (timed apart, in report["score_seconds"]): scoring
    costs what the windows cost, not what the new rows cost.
    """
    from monitor.daemon import runner
    from storage.store import Store

    db = work / f"tw-{time.monotonic_ns()}.db"
    cfg = service_config(directory, db)
    store = Store(cfg.storage.url)
    store.upgrade()
    score, scoring, scoring_cpu = runner.score_windows, [0.0], [0.0]

    def timed_score(*args, **kwargs):
        started, cpu = time.perf_counter(), time.process_time()
        try:
            return score(*args, **kwargs)
        finally:
            scoring[0] += time.perf_counter() - started
            scoring_cpu[0] += time.process_time() - cpu

    runner.score_windows = timed_score
    try:
        started, cpu = time.perf_counter(), time.process_time()
        [report] = runner.tick(cfg, store, NOW)
        seconds = time.perf_counter() - started - scoring[0]
        cpu_seconds = time.process_time() - cpu - scoring_cpu[0]
    finally:
        runner.score_windows = score
    store.dispose()
    for f in work.glob(db.name + "*"):
        f.unlink()
    if report.status != "ok":
        raise SystemExit(f"tick failed: {report.error}")
    return seconds, report.as_dict() | {"score_seconds": scoring[0], "cpu_seconds": cpu_seconds}


def timed(fn, runs: int = RUNS) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(rows: int, work: Path) -> dict:
    jdir, pdir = work / "jsonl", work / "parquet"
    jdir.mkdir()
    pdir.mkdir()
    jfile, pfile = jdir / "predictions.jsonl", pdir / "predictions.parquet"
    started = time.perf_counter()
    bad = write_jsonl(jfile, rows)
    write_parquet(pfile, rows)
    print(f"generated {rows:,} rows ({jfile.stat().st_size / 1e6:.0f} MB JSONL with {bad} bad lines, "
          f"{pfile.stat().st_size / 1e6:.0f} MB Parquet) in {time.perf_counter() - started:.1f}s", file=sys.stderr)

    # pyarrow cannot read a file with bad lines at all; its bare rate is measured on the valid lines.
    clean = work / "clean.jsonl"
    with open(jfile, "rb") as src, open(clean, "wb") as dst:
        for line in src:
            if line.startswith(b'{"request_id":"req-'):
                dst.write(line)
    clean_rows = rows - bad
    out: dict = {"rows": rows, "bad": bad}
    # Each tick runs right after the bare parse it is compared with: on a shared machine the load drifts
    # over minutes, and a ratio of two measurements taken far apart would measure the drift.
    pajson.read_json(clean)  # warm-up, untimed: the first call in a process pays for setting pyarrow up
    pq.read_table(pfile)
    bare_j, bare_p, ingest_j, ingest_p, cpu_j, cpu_p, cpu_bare_p, scoring = [], [], [], [], [], [], [], []
    for _ in range(RUNS):
        bare_j.append(timed(lambda: pajson.read_json(clean), 1))
        seconds, report = run_tick(jdir, work)
        _check(report, rows, bad)
        ingest_j.append(seconds)
        cpu_j.append(report["cpu_seconds"])
        scoring.append(report["score_seconds"])
        cpu = time.process_time()
        bare_p.append(timed(lambda: pq.read_table(pfile), 1))
        cpu_bare_p.append(time.process_time() - cpu)
        seconds, report = run_tick(pdir, work)
        _check(report, rows, 0)
        ingest_p.append(seconds)
        cpu_p.append(report["cpu_seconds"])
        scoring.append(report["score_seconds"])
    clean.unlink()
    out["pyarrow_jsonl"] = clean_rows / statistics.median(bare_j)
    out["pyarrow_parquet"] = rows / statistics.median(bare_p)
    out["score_seconds"] = statistics.median(scoring)
    out["tailwatch_jsonl"] = rows / statistics.median(ingest_j)
    out["tailwatch_parquet"] = rows / statistics.median(ingest_p)
    # The ratio of each run (tick over the bare parse just before it), median over runs.
    out["jsonl_ratio"] = statistics.median((rows / t) / (clean_rows / b) for b, t in zip(bare_j, ingest_j, strict=True))
    out["parquet_ratio"] = statistics.median(b / t for b, t in zip(bare_p, ingest_p, strict=True))
    out["cpu_jsonl"], out["cpu_parquet"] = statistics.median(cpu_j), statistics.median(cpu_p)
    out["cpu_bare_parquet"] = statistics.median(cpu_bare_p)
    out["runs"] = [(clean_rows / bj, rows / tj, rows / bp, rows / tp)
                   for bj, tj, bp, tp in zip(bare_j, ingest_j, bare_p, ingest_p, strict=True)]
    return out


def _check(report: dict, rows: int, bad: int) -> None:
    """Every line accepted or quarantined, the bad ones (and only they) quarantined."""
    read, accepted = report["read"]["predictions"], report["accepted"]["predictions"]
    quarantined = sum(report["quarantined"].values())
    if read != rows or accepted != rows - bad or quarantined != bad or report["folded"] != rows - bad:
        raise SystemExit(f"ingest lost or misclassified rows: read {read}, accepted {accepted}, "
                         f"quarantined {report['quarantined']}, folded {report['folded']}, expected {rows} / {bad} bad")


def memory(backlog_rows: int, work: Path) -> dict:
    """Peak RSS of one tick over a `backlog_rows` JSONL backlog, in a fresh subprocess."""
    import psutil

    bdir = work / "backlog"
    bdir.mkdir()
    started = time.perf_counter()
    # A backlog as a logger leaves it: several files (5 of 1M rows), bad lines included.
    per_file = 1_000_000
    bad = 0
    for k, first in enumerate(range(0, backlog_rows, per_file)):
        bad += write_jsonl(bdir / f"predictions-{k:03d}.jsonl", min(per_file, backlog_rows - first))
    size = sum(f.stat().st_size for f in bdir.iterdir())
    print(f"generated a {backlog_rows:,}-row backlog ({size / 1e6:.0f} MB) in {time.perf_counter() - started:.1f}s",
          file=sys.stderr)
    proc = subprocess.Popen([sys.executable, __file__, "--_child", str(bdir), str(work)],
                            stdout=subprocess.PIPE, text=True)
    peak = 0
    ps = psutil.Process(proc.pid)
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            try:
                peak = max(peak, ps.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = proc.communicate()
    stop.set()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"backlog tick failed (exit {proc.returncode})")
    child = json.loads(output)
    _check(child["report"], backlog_rows, bad)
    # Not getrusage(RUSAGE_CHILDREN): Linux carries the parent's high-water mark into a child through
    # fork + exec, so it would report this process's own peak (the 1M-row files) as the child's.
    return {"backlog_rows": backlog_rows, "peak_rss": max(peak, child["hwm"]), "backlog_seconds": child["seconds"],
            "backlog_bytes": size}


def _high_water() -> int:
    """This process's peak RSS in bytes since exec (VmHWM), 0 where /proc is missing."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0


def _child(directory: str, work: str) -> None:
    seconds, report = run_tick(Path(directory), Path(work))
    print(json.dumps({"seconds": seconds, "report": report, "hwm": _high_water()}, default=str))


def render(result: dict, mem: dict | None) -> list[str]:
    """Print the table; return the targets missed."""
    from rich.console import Console
    from rich.table import Table

    missed = []
    j_ok = result["jsonl_ratio"] >= JSONL_RATIO_TARGET
    p_ok = result["tailwatch_parquet"] >= PARQUET_TARGET
    if not j_ok:
        missed.append(f"JSONL ratio {result['jsonl_ratio']:.2f} < {JSONL_RATIO_TARGET}")
    if not p_ok:
        missed.append(f"Parquet {result['tailwatch_parquet']:,.0f} rows/s < {PARQUET_TARGET:,}")
    rows = [
        ("JSON Lines", result["pyarrow_jsonl"], result["tailwatch_jsonl"], result["jsonl_ratio"],
         f">= {JSONL_RATIO_TARGET}x pyarrow", j_ok),
        ("Parquet", result["pyarrow_parquet"], result["tailwatch_parquet"], result["parquet_ratio"],
         f">= {PARQUET_TARGET / 1e6:.0f}M rows/s", p_ok),
    ]
    table = Table(title=f"ingest of {result['rows']:,} rows ({result['bad']} bad JSONL lines), "
                        f"{os.cpu_count()} cores, pyarrow {pa.__version__}")
    for col in ("format", "pyarrow rows/s", "tailwatch rows/s", "ratio", "target", "met"):
        table.add_column(col, justify="left" if col in ("format", "target") else "right")
    for fmt, bare, ours, ratio, target, ok in rows:
        table.add_row(fmt, f"{bare:,.0f}", f"{ours:,.0f}", f"{ratio:.2f}", target, "yes" if ok else "NO")
    md = ["| format | pyarrow bare parse (rows/s) | tailwatch ingest (rows/s) | ratio | target |",
          "|---|---:|---:|---:|---|"]
    md += [f"| {fmt} | {bare:,.0f} | {ours:,.0f} | {ratio:.2f} | {target} |" for fmt, bare, ours, ratio, target, _ in rows]
    if mem is not None:
        m_ok = mem["peak_rss"] < MEMORY_TARGET
        if not m_ok:
            missed.append(f"peak RSS {mem['peak_rss'] / 2**20:,.0f} MiB >= 1024 MiB")
        table.add_row(f"JSONL backlog {mem['backlog_rows'] / 1e6:g}M rows", "",
                      f"{mem['backlog_rows'] / mem['backlog_seconds']:,.0f}",
                      "", "peak RSS < 1 GiB", f"{mem['peak_rss'] / 2**20:,.0f} MiB " + ("yes" if m_ok else "NO"))
        md.append(f"| JSONL backlog, {mem['backlog_rows'] / 1e6:g}M rows ({mem['backlog_bytes'] / 1e9:.1f} GB), one tick "
                  f"| | {mem['backlog_rows'] / mem['backlog_seconds']:,.0f} | | peak RSS "
                  f"{mem['peak_rss'] / 2**20:,.0f} MiB (< 1024 MiB) |")
    console = Console()
    console.print(table)
    print(f"(not in the rates above: the tick's window scoring took {result['score_seconds']:.1f}s more, median)")
    print(f"ingest CPU time (all threads, median): JSONL {result['cpu_jsonl']:.2f}s, Parquet {result['cpu_parquet']:.2f}s "
          f"for {result['rows']:,} rows; ratio = median over runs of (tick rate / bare rate measured just before it)")
    # What a rate target asks of this machine: at 2M rows/s its cores offer cores / 2M CPU-seconds per row,
    # and only while every core is busy the whole time.
    budget = (os.cpu_count() or 1) * result["rows"] / PARQUET_TARGET
    print(f"Parquet CPU budget at {PARQUET_TARGET / 1e6:g}M rows/s on {os.cpu_count()} cores: {budget:.2f}s for "
          f"{result['rows']:,} rows; tailwatch's ingest took {result['cpu_parquet']:.2f}s, the bare read_table "
          f"alone {result['cpu_bare_parquet']:.2f}s (all threads, medians)")
    for k, (bj, tj, bp, tp) in enumerate(result["runs"], 1):
        print(f"  run {k}: JSONL {tj:,.0f} / {bj:,.0f} rows/s = {tj / bj:.2f}; Parquet {tp:,.0f} / {bp:,.0f} rows/s "
              f"= {tp / bp:.2f}")
    print("\nMarkdown (docs/performance.md):\n")
    print("\n".join(md))
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the timed files (default 1M)")
    parser.add_argument("--backlog-rows", type=int, default=5_000_000, help="rows in the memory backlog (default 5M)")
    parser.add_argument("--skip-memory", action="store_true", help="skip the backlog peak-memory check")
    parser.add_argument("--keep", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        _child(*args._child)
        return 0
    work = Path(tempfile.mkdtemp(prefix="tailwatch-bench-"))
    try:
        result = measure(args.rows, work)
        mem = None if args.skip_memory else memory(args.backlog_rows, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    missed = render(result, mem)
    for m in missed:
        print(f"target missed: {m}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    from malloc_env import reexec  # bench/malloc_env.py: run as deployed

    reexec()
    sys.exit(main())
