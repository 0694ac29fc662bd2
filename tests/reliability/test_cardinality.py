"""Hostile cardinality through whole ticks: thousands of model versions, stage names or segment values. Past
`limits.max_versions` / `max_stages` / `max_segment_values` a tick folds the rest into one `<other>` bucket,
says so once (a tick warning, `tailwatch_rows_folded_other` on /metrics) and loses no row; the values stored
before keep their own name; a tick and a scrape cost what the rows cost.

Each case ticks in a child process within a subprocess timeout (a tick that grew with the square of the values
ran for minutes). Each test records what it tried as pytest user properties (`rel_inputs`, `rel_rows`,
`rel_rows_lost`), which `make reliability` sums into its summary table, and the scrape's wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

pytestmark = pytest.mark.reliability

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
START = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120  # s per child: a tick at the caps takes about one
SCRAPE_BOUND = 5.0  # s: generous; a scrape at the caps measured ~0.1 s, Prometheus' default timeout is 10 s
MAX_VERSIONS, MAX_STAGES, MAX_SEGMENT_VALUES = 50, 32, 100  # the defaults

# The child: one tick_job per folder of `ticks` (its files are moved in before), with the daemon's metrics and
# the model's series; prints per tick what it read, folded and capped, then what the store holds and a scrape.
CHILD = textwrap.dedent("""
    import json, sys, time
    from collections import Counter
    from datetime import UTC, datetime, timedelta
    from pathlib import Path
    from monitor import config as config_mod
    from monitor.aggregate.partial import Partial
    from monitor.daemon.health import Metrics
    from monitor.daemon.jobs import tick_job
    from monitor.daemon.model_metrics import ModelMetrics
    from storage.store import Store

    raw, db, now = json.loads(sys.argv[1]), sys.argv[2], datetime.fromisoformat(sys.argv[3])
    pending = [Path(p) for p in json.loads(sys.argv[4])]
    cfg = config_mod.parse(raw)
    store = Store("sqlite:///" + db)
    store.upgrade()
    metrics = Metrics(ModelMetrics(cfg, store, clock=lambda: now))
    ticks = []
    for k, batch in enumerate(pending):
        for f in sorted(batch.iterdir()):
            f.rename(Path(raw["services"][0]["sources"][f.name.split(".")[0]]["path"]) / f"{k}-{f.name}")
        for r in tick_job(cfg, store, now + timedelta(minutes=k), metrics=metrics):
            ticks.append({"status": r.status, "error": r.error, "read": dict(r.read), "folded": r.folded,
                          "capped": dict(getattr(r, "capped", {})), "warnings": r.warnings})
    with store.transaction() as s:
        rows = store.partials.load(s, "svc", datetime(1970, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC))
    versions, segments, stages, stage_rows = Counter(), Counter(), set(), 0
    for r in rows:
        p = Partial.from_bytes(r.payload)
        if r.segment == "":
            versions[r.model_version] += p.rows
            stages |= {k for k in p.sketches if k.startswith("stage.")}
            stage_rows += p.counts["stage_rows"]
        else:
            segments[r.segment] += p.rows
    started = time.perf_counter()
    text = metrics.render().decode()
    scrape = time.perf_counter() - started
    per_version = Counter(line.split('model_version="')[1].split('"')[0] for line in text.splitlines()
                          if line.startswith("tailwatch_") and 'model_version="' in line)
    other = {line.split('field="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
             if line.startswith("tailwatch_rows_folded_other_total{")}
    print(json.dumps({"ticks": ticks, "versions": versions, "segments": segments, "stages": sorted(stages),
                      "stage_rows": stage_rows, "scrape_s": scrape, "per_version": per_version, "other": other}))
""")


def row(i: int, version: str, contract: str = "Month-to-month") -> str:
    ts = (START + timedelta(seconds=0.25 * i)).isoformat().replace("+00:00", "Z")
    return json.dumps({"request_id": f"r{i:07d}", "ts": ts, "model_version": version,
                       "status": ["ok", "ok", "ok", "timeout", "error"][i % 5], "tenure": i % 72,
                       "Contract": contract, "latency_ms": 10.0 + i % 7}) + "\n"


def config(tmp: Path, timed: bool = False) -> dict:
    sources = {"predictions": {"kind": "files", "path": str(tmp / "predictions")}}
    if timed:
        sources["timings"] = {"kind": "files", "path": str(tmp / "timings")}
    for folder in sources.values():
        Path(folder["path"]).mkdir()
    return {"services": [{"name": "svc", "sources": sources,
                          "schema": {"features": {"tenure": "numeric", "Contract": "categorical"},
                                     "segments": ["Contract"]},
                          "join": {"lateness": "0s"}}]}


def batches(tmp: Path, *contents: dict[str, str]) -> list[str]:
    """One folder per tick, each holding the `kind.jsonl` files the child moves into the sources before it."""
    out = []
    for k, files in enumerate(contents):
        folder = tmp / f"tick{k}"
        folder.mkdir()
        for kind, text in files.items():
            (folder / f"{kind}.jsonl").write_text(text)
        out.append(str(folder))
    return out


def run(raw: dict, tmp: Path, pending: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(raw), str(tmp / "tw.db"), NOW.isoformat(),
                           json.dumps(pending)], capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=tmp)
    assert done.returncode == 0, f"the tick failed ({done.returncode}): {done.stderr[-2000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for t in result["ticks"]:
        assert t["status"] == "ok", t["error"]
    return result


def record(record_property, result: dict, inputs: int, rows: int) -> None:
    record_property("rel_inputs", inputs)
    record_property("rel_rows", rows)
    record_property("rel_rows_lost", rows - sum(result["versions"].values()))
    record_property("scrape_seconds", round(result["scrape_s"], 3))


def warned(result: dict, limit: str) -> list[str]:
    return [w for t in result["ticks"] for w in t["warnings"] if "<other>" in w and limit in w]


def test_3000_model_versions_over_two_ticks(tmp_path, record_property):
    # A busy stable version, a canary, one really named `other`, and 3,000 versions of one row each; the
    # second tick brings 3,000 more and the canary again.
    real = ["v1", "v2-canary", "other"]
    first = [row(i, real[i % 3]) for i in range(1500)]
    first += [row(1500 + i, f"junk-{i:05d}") for i in range(3000)]
    second = [row(4500 + i, "v2-canary") for i in range(300)]
    second += [row(4800 + i, f"more-{i:05d}") for i in range(3000)]
    raw = config(tmp_path)
    result = run(raw, tmp_path, batches(tmp_path, {"predictions": "".join(first)}, {"predictions": "".join(second)}))
    rows = len(first) + len(second)
    record(record_property, result, 6003, rows)

    versions = result["versions"]
    assert sum(versions.values()) == rows == sum(t["folded"] for t in result["ticks"])
    assert len(versions) <= MAX_VERSIONS + 1
    assert versions["v1"] == versions["other"] == 500 and versions["v2-canary"] == 800  # kept, and across ticks
    assert not any(v.startswith("more-") for v in versions)  # the first tick's versions took every slot
    assert versions["<other>"] == sum(t["capped"].get("model_version", 0) for t in result["ticks"]) == 3000 - 47 + 3000
    assert len(warned(result, "limits.max_versions")) == 2  # once per tick
    assert result["other"]["model_version"] == versions["<other>"]
    assert max(result["per_version"].values()) < 200
    assert result["scrape_s"] < SCRAPE_BOUND


def test_10000_model_versions_in_one_tick(tmp_path, record_property):
    lines = [row(i, f"v{i:05d}") for i in range(10_000)]
    raw = config(tmp_path)
    result = run(raw, tmp_path, batches(tmp_path, {"predictions": "".join(lines)}))
    record(record_property, result, 10_000, len(lines))

    versions = result["versions"]
    assert sum(versions.values()) == len(lines)
    assert len(versions) == MAX_VERSIONS + 1
    # One row each: the ties go by name, the same versions whatever the order of the lines.
    assert sorted(set(versions) - {"<other>"}) == [f"v{i:05d}" for i in range(MAX_VERSIONS)]
    assert versions["<other>"] == len(lines) - MAX_VERSIONS
    assert warned(result, "limits.max_versions")
    assert len(result["per_version"]) <= MAX_VERSIONS + 1
    assert result["scrape_s"] < SCRAPE_BOUND


def test_2000_stage_names(tmp_path, record_property):
    # Every request passes `queue` and `model`; each also logs one of 2,000 made-up stage names.
    n = 2000
    lines = [row(i, "v1") for i in range(n)]
    timings = "".join(json.dumps({"request_id": f"r{i:07d}", "stage": stage, "duration_ms": ms}) + "\n"
                      for i in range(n) for stage, ms in (("queue", 2.0), ("model", 5.0), (f"span-{i:04d}", 1.0)))
    raw = config(tmp_path, timed=True)
    result = run(raw, tmp_path, batches(tmp_path, {"predictions": "".join(lines), "timings": timings}))
    record(record_property, result, n, n)

    assert sum(result["versions"].values()) == n
    assert result["stage_rows"] == 3 * n  # every timing row counted, those in <other> too
    stages = result["stages"]
    assert {"stage.queue", "stage.model", "stage.<other>"} <= set(stages)
    assert len(stages) <= MAX_STAGES + 1
    assert warned(result, "limits.max_stages")
    assert result["other"]["stage"] == n - (MAX_STAGES - 2)
    assert result["per_version"]["v1"] < 400  # 33 stages' quantiles, not 2,000
    assert result["scrape_s"] < SCRAPE_BOUND


def test_5000_segment_values(tmp_path, record_property):
    busy = ["Month-to-month", "One year", "Two year"]
    lines = [row(i, "v1", busy[i % 3]) for i in range(3000)]
    lines += [row(3000 + i, "v1", f"plan-{i:04d}") for i in range(5000)]
    raw = config(tmp_path)
    result = run(raw, tmp_path, batches(tmp_path, {"predictions": "".join(lines)}))
    record(record_property, result, 5003, len(lines))

    segments = result["segments"]
    assert sum(result["versions"].values()) == sum(segments.values()) == len(lines)
    assert len(segments) <= MAX_SEGMENT_VALUES + 1
    assert all(segments[f"Contract={b}"] == 1000 for b in busy)  # the busiest keep their own name
    assert segments["Contract=<other>"] == 5000 - (MAX_SEGMENT_VALUES - 3)
    assert warned(result, "limits.max_segment_values")
    assert result["other"]["Contract"] == segments["Contract=<other>"]
    assert result["scrape_s"] < SCRAPE_BOUND
