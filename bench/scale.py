"""Scaling benchmark: the local engine (chunked) against the Dask engine, 100k -> 1M -> 10M rows.

    .venv/bin/python bench/scale.py                        # 100k, 1M, 10M rows
    .venv/bin/python bench/scale.py --max-rows 1000000     # stop at 1M
    .venv/bin/python bench/scale.py --workers 4 --partition-rows 250000

Data: one simulated day of the churn service (`healthy` scenario, about 100k rows, joined with their
stage timings), written as a Parquet dataset partitioned by hour (`monitor.daemon.engines.dataset` layout),
each hour in files of at most `--file-rows` rows.
Larger sizes repeat each hour's rows with new request_ids, so every size covers the same day (same
buckets, same number of partials) with 10x, 100x the traffic: what "a day no longer fits one machine"
means. Each run is a fresh subprocess (a LocalCluster of `--workers` single-threaded processes for
Dask); its wall time covers read, validate, join, fold, gather and merge (not the cluster's start, not
the store); peak memory is the sampled RSS summed over the process and all its children (scheduler,
nannies, workers). Prints a table, writes docs/img/scale.png and a JSON of the figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from malloc_env import environ  # noqa: E402  (bench/malloc_env.py, beside this script)

SIZES = (100_000, 1_000_000, 10_000_000)
DEFAULT_PARTITION_ROWS = 250_000  # monitor.daemon.engines.local's default
SCENARIO, SEED = "healthy", 11
SAMPLE_S = 0.05


def make_base(work: Path, rows: int) -> Path:
    """One simulated day of about `rows` joined rows, as Arrow; returns the generator's folder."""
    import pandas as pd

    from monitor.daemon.engines import dataset as layout
    from monitor.simulate import generate

    gen = work / "generated"
    if (work / "base.parquet").exists() and (gen / "reference.parquet").exists():
        return gen  # a kept --work directory: the same day again
    # The simulator's daily curve averages to its rate: rows ~= rate * 86400.
    generate(SCENARIO, gen, seed=SEED, hours=24, rate_per_s=rows / 86400, otlp=False)
    joined = layout.joined_rows(layout.read_jsonl(gen / "predictions"), layout.read_jsonl(gen / "timings"))
    joined["ts"] = pd.to_datetime(joined["ts"], utc=True, format="ISO8601")
    joined.to_parquet(work / "base.parquet", index=False)
    return gen


def write_size(work: Path, copies: int, file_rows: int | None = None) -> tuple[Path, int]:
    """The base day with each row repeated `copies` times (new request_ids), one file per hour (or
    files of at most `file_rows` rows)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from monitor.daemon.engines.dataset import HOUR_FORMAT, PARTITION

    out = work / f"x{copies}"
    if out.exists():
        shutil.rmtree(out)
    base = pq.read_table(work / "base.parquet")
    hours = pc.strftime(base["ts"], format=HOUR_FORMAT)
    total = 0
    for hour in sorted(set(hours.to_pylist())):
        part = base.filter(pc.equal(hours, hour))
        tables = []
        for c in range(copies):
            rid = pc.binary_join_element_wise(part["request_id"], pa.scalar(f"c{c}"), "-")
            tables.append(part.set_column(part.schema.get_field_index("request_id"), "request_id", rid))
        table = pa.concat_tables(tables)
        folder = out / f"{PARTITION}={hour}"
        folder.mkdir(parents=True)
        step = file_rows or table.num_rows
        for i, a in enumerate(range(0, table.num_rows, step)):
            pq.write_table(table.slice(a, step), folder / f"part-{i}.parquet", row_group_size=128 * 1024)
        total += table.num_rows
    return out, total


def child(engine: str, dataset: str, config: str, reference: str, partition_rows: int, workers: int) -> None:
    """One measured run (in its own process): prints its figures as JSON."""
    import pandas as pd

    from monitor import config as config_mod
    from monitor.aggregate.profile import profile_for
    from monitor.daemon.engines import local

    cfg = config_mod.load(config)
    service = cfg.services[0]
    profile = profile_for(reference, service.schema_)
    now = pd.Timestamp("2027-01-01", tz="UTC").to_pydatetime()
    scan = local.Scan.of(service, cfg.limits, profile, now, timed=True)
    if engine == "local":
        result = local.scan(dataset, scan, partition_rows)
        startup = 0.0
    else:
        from monitor.daemon.engines import dask as dask_engine

        started = time.perf_counter()
        with dask_engine.client_for(None, workers) as client:
            client.wait_for_workers(workers)
            startup = time.perf_counter() - started
            result = dask_engine.scan(dataset, scan, client, partition_rows)
    payloads = [len(p.payload) for p in result.partials]
    print(json.dumps({"seconds": result.seconds, "startup": startup, "chunks": result.chunks,
                      "folded": result.counts["folded"], "partials": len(result.partials),
                      "gathered_bytes": result.gathered_bytes,
                      "partial_bytes_median": sorted(payloads)[len(payloads) // 2] if payloads else 0,
                      "partial_bytes_max": max(payloads, default=0)}))


def measure(engine: str, dataset: Path, config: Path, reference: Path, partition_rows: int, workers: int) -> dict:
    """Run `child` in a subprocess; its figures plus the peak RSS summed over its process tree."""
    import psutil

    cmd = [sys.executable, __file__, "--child", engine, str(dataset), str(config), str(reference),
           str(partition_rows), str(workers)]
    # The child runs with the deploy files' malloc settings (bench/malloc_env.py): its peak is the deployed one.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ())
    root = psutil.Process(proc.pid)
    peak = {"rss": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            total = 0
            try:
                for p in [root, *root.children(recursive=True)]:
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
            peak["rss"] = max(peak["rss"], total)
            done.wait(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode:
        raise RuntimeError(f"{engine} run failed:\n{stderr[-3000:]}")
    figures = json.loads(stdout.strip().splitlines()[-1])
    return figures | {"peak_rss": peak["rss"]}


def service_config(work: Path, gen: Path) -> Path:
    import yaml

    from monitor.demo import demo_config

    raw = demo_config(work)
    raw["storage"]["url"] = "sqlite:///bench.db"
    raw["services"][0]["reference"] = {"path": str(gen / "reference.parquet")}
    for kind in ("predictions", "timings"):
        (work / "logs" / kind).mkdir(parents=True, exist_ok=True)
    path = work / "tailwatch.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def render(results: list[dict]) -> list[str]:
    lines = [f"{'engine':<7} {'rows':>11} {'seconds':>8} {'rows/s':>10} {'x time':>7} {'peak RSS':>9} "
             f"{'chunks':>6} {'partials':>8} {'gathered':>10}"]
    prev: dict[tuple, dict] = {}
    for r in results:
        key = (r["engine"], r.get("file_rows"))  # the ratio is to the previous size of the same series
        before = prev.get(key)
        ratio = f"{r['seconds'] / before['seconds']:.1f}x" if before else "-"
        lines.append(f"{r['engine']:<7} {r['rows']:>11,} {r['seconds']:>8.1f} {r['rows'] / r['seconds']:>10,.0f} "
                     f"{ratio:>7} {r['peak_rss'] / 2**20:>7,.0f}Mi {r['chunks']:>6} {r['partials']:>8,} "
                     f"{r['gathered_bytes'] / 2**20:>8.1f}Mi")
        prev[key] = r
    return lines


def plot(results: list[dict], path: Path, workers: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
    series = sorted({(r["engine"], r.get("file_rows")) for r in results}, key=lambda k: (k[1] or 0, k[0] != "local"))
    for engine, file_rows in series:
        rs = sorted((r for r in results if (r["engine"], r.get("file_rows")) == (engine, file_rows)),
                    key=lambda r: r["rows"])
        label = "local (chunked)" if engine == "local" else f"dask ({workers} workers)"
        if file_rows:
            label += f", files <= {file_rows:,} rows"
        rows = [r["rows"] for r in rs]
        style = "s--" if file_rows else "o-"
        color = "C0" if engine == "local" else "C1"
        ax_t.plot(rows, [r["seconds"] for r in rs], style, color=color, label=label)
        ax_m.plot(rows, [r["peak_rss"] / 2**20 for r in rs], style, color=color, label=label)
    rows = sorted({r["rows"] for r in results})
    first = min((r for r in results if r["rows"] == rows[0] and r["engine"] == "local"),
                key=lambda r: r["seconds"], default=min(results, key=lambda r: r["rows"]))
    ax_t.plot(rows, [first["seconds"] * n / rows[0] for n in rows], ":", color="grey", label="linear")
    for ax, title, unit in ((ax_t, "time", "seconds"), (ax_m, "peak memory (RSS, all processes)", "MiB")):
        ax.set_xscale("log")
        ax.set_xlabel("rows (one simulated day)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_yscale("log")
    ax_t.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax_t.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax_m.set_ylim(bottom=0)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-rows", type=int, default=SIZES[-1], help="largest size to run (default 10M)")
    parser.add_argument("--min-rows", type=int, default=SIZES[0], help="smallest size to run (default 100k)")
    parser.add_argument("--file-rows", type=int, default=DEFAULT_PARTITION_ROWS,
                        help="split each hour into Parquet files of at most this many rows (0: one file per hour; "
                             "the engines' pieces do not depend on it)")
    parser.add_argument("--workers", type=int, default=2, help="Dask LocalCluster worker processes")
    parser.add_argument("--partition-rows", type=int, default=DEFAULT_PARTITION_ROWS, help="rows folded at once")
    parser.add_argument("--engines", default="local,dask")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "scale.png")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--work", type=Path, default=None, help="keep the data here (default: a temp dir)")
    parser.add_argument("--replot", type=Path, default=None, help="only plot the figures of a --json file")
    args = parser.parse_args(argv)
    if args.replot:
        results = json.loads(args.replot.read_text())
        print("\n".join(render(sorted(results, key=lambda r: (r["engine"], r.get("file_rows") or 0, r["rows"])))))
        plot(results, args.plot, args.workers)
        return 0
    sizes = [n for n in SIZES if args.min_rows <= n <= args.max_rows]
    work = args.work or Path(tempfile.mkdtemp(prefix="tailwatch-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    try:
        started = time.perf_counter()
        gen = make_base(work, SIZES[0])
        config = service_config(work, gen)
        print(f"base day generated in {time.perf_counter() - started:.0f} s", flush=True)
        for size in sizes:
            dataset, rows = write_size(work, size // SIZES[0], args.file_rows or None)
            for engine in args.engines.split(","):
                r = measure(engine, dataset, config, gen / "reference.parquet", args.partition_rows, args.workers)
                r |= {"engine": engine, "rows": rows, "file_rows": args.file_rows or None}
                results.append(r)
                print(render([r])[1], flush=True)
                if args.json:  # after each run, so a long run cut short keeps what it measured
                    args.json.write_text(json.dumps(results, indent=2))
            shutil.rmtree(dataset)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print("\n".join(render(sorted(results, key=lambda r: (r["engine"], r.get("file_rows") or 0, r["rows"])))))
    if results:
        plot(results, args.plot, args.workers)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        engine, dataset, config, reference, rows, workers = sys.argv[2:8]
        child(engine, dataset, config, reference, int(rows), int(workers))
    else:
        sys.exit(main())
