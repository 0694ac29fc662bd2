"""A tick stores the same rows and reports the same counts: a simulated scenario fed tick by tick (rows
released as their time passes, timings a little late, labels as they are given, a few bad lines) on a
fresh SQLite store digests to golden values."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from monitor import config as config_mod
from monitor.daemon.runner import tick
from monitor.simulate import generate
from storage.store import Store

TICK = timedelta(minutes=20)
TIMINGS_LATE = timedelta(minutes=3)  # timings land after their prediction: some wait in the join buffer
# Columns the wall clock or the file system fills, and the migrations' key.
UNSTABLE = {"started_at", "finished_at", "updated_at", "created_at", "built_at", "recorded_at", "file_key"}


def _lines(path: Path) -> list[tuple[str, str]]:
    """(the time a line exists at, the line) for every line of the generated files under `path`."""
    out = []
    for f in sorted(path.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            out.append((row.get("label_ts") or row.get("start_ts") or row["ts"], line))
    return sorted(out)


def _release(lines: list[tuple[str, str]], until: datetime, into: Path, name: str, extra: list[str],
             done: dict[Path, int]) -> None:
    """Write the lines that exist by `until` and were not written yet as a new file `name`, then `extra`."""
    into.mkdir(exist_ok=True)
    stamp = until.isoformat().replace("+00:00", "Z")
    ready = [line for at, line in lines if at <= stamp]
    (into / f"{name}.jsonl").write_text("".join(line + "\n" for line in ready[done.get(into, 0):] + extra))
    done[into] = len(ready)


def _config(root: Path, url: str) -> config_mod.Config:
    gen = root / "generated"
    for kind in ("predictions", "timings", "labels"):
        (root / kind).mkdir(exist_ok=True)
    return config_mod.parse({
        "storage": {"url": url},
        "limits": {"chunk_rows": 700},  # several steps per tick: the fold of one overlaps the next's read
        "services": [{
            "name": "churn",
            "sources": {"predictions": {"kind": "files", "path": str(root / "predictions")},
                        "timings": {"kind": "files", "path": str(root / "timings")},
                        "labels": {"kind": "files", "path": str(root / "labels")}},
            "schema": {"features": {"tenure": "numeric", "MonthlyCharges": "numeric", "Contract": "categorical",
                                    "InternetService": "categorical", "notes": "text"},
                       "segments": ["Contract"], "classes": ["No", "Yes"], "positive_class": "Yes"},
            "reference": {"path": str(gen / "reference.parquet")},
            "buckets": {"size": "5m", "windows": ["30m", "1h"]},
            "quality": {"windows": ["1h"], "min_n": 30, "coverage_threshold": 0.5, "label_horizon": "2h",
                        "groups": {"short_tenure": "tenure < 12"}, "length_buckets": {"notes": [512]},
                        "bootstrap_samples": 50, "seed": 1},
        }],
    }, base_dir=root)


DIGITS = 9  # significant digits of a stored float: the math library's last bits differ between CPUs


def _stable(value):
    """`value` with every float, also inside a JSON text, rounded to DIGITS significant digits."""
    if isinstance(value, float):
        return float(f"{value:.{DIGITS}g}")
    if isinstance(value, list):
        return [_stable(v) for v in value]
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items()}
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.dumps(_stable(json.loads(value)), sort_keys=True)
        except ValueError:
            return value
    return value


def _digest_store(path: Path, root: Path) -> dict[str, str]:
    """Per table, a digest of its rows (sorted), the wall-clock columns and report seconds left out, floats
    rounded (_stable) and the scenario's folder written as ROOT."""
    out = {}
    with sqlite3.connect(path) as db:
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
                  if t != "alembic_version"]
        for table in tables:
            cursor = db.execute(f'SELECT * FROM "{table}"')  # noqa: S608 - names from sqlite_master
            names = [d[0] for d in cursor.description]
            rows = []
            for row in cursor:
                values = {n: _stable(v) for n, v in zip(names, row, strict=True) if n not in UNSTABLE}
                if table == "ticks":  # the tick's report, but for its duration
                    values["summary"] = {k: v for k, v in json.loads(values["summary"]).items() if k != "seconds"}
                rows.append(repr(sorted(values.items())).replace(str(root), "ROOT"))
            out[table] = hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest()[:16]
    return out


def run_scenario(root: Path) -> tuple[dict[str, str], str]:
    """Tick the scenario every TICK until an hour past its end: (per-table digests, reports' digest)."""
    truth = generate("both-long-inputs", root / "generated", seed=3, hours=2, rate_per_s=0.5, otlp=False)
    gen = root / "generated"
    preds, timings, labels = _lines(gen / "predictions"), _lines(gen / "timings"), _lines(gen / "labels")
    timings = [((datetime.fromisoformat(at.replace("Z", "+00:00")) + TIMINGS_LATE).isoformat()
                .replace("+00:00", "Z"), line) for at, line in timings]
    db = root / "tw.db"
    store = Store(f"sqlite:///{db}")
    store.upgrade()
    cfg = _config(root, f"sqlite:///{db}")
    start = datetime.fromisoformat(truth.start.replace("Z", "+00:00"))
    end = datetime.fromisoformat(truth.end.replace("Z", "+00:00")) + timedelta(hours=1)
    reports = hashlib.sha256()
    now, i, done = start + TICK, 0, {}
    while now <= end:
        # A broken line, an unknown label and a repeated prediction now and then: quarantine and duplicates.
        bad = ['{"request_id": "x", "ts": "not a time"}'] if i % 3 == 1 else []
        repeat = [preds[i * 5][1]] if i % 4 == 2 else []
        _release(preds, now, root / "predictions", f"p{i:03d}", bad + repeat, done)
        _release(timings, now, root / "timings", f"t{i:03d}", [], done)
        unknown = ['{"request_id": "nobody", "label": "Maybe", "label_ts": "2026-11-02T00:00:00Z"}'] if i == 2 else []
        _release(labels, now, root / "labels", f"l{i:03d}", unknown, done)
        for report in tick(cfg, store, now):
            assert report.status == "ok", report.error
            said = json.dumps({k: v for k, v in report.as_dict().items() if k != "seconds"}, default=str)
            reports.update(said.replace(str(root), "ROOT").encode())
        now, i = now + TICK, i + 1
    store.dispose()
    return _digest_store(db, root), reports.hexdigest()


@pytest.mark.slow
def test_a_scenario_ticked_stores_and_reports_the_golden_rows(tmp_path):
    tables, reports = run_scenario(tmp_path)
    assert reports == GOLDEN_REPORTS
    assert {t: d for t, d in tables.items() if d != EMPTY} == GOLDEN_TABLES


EMPTY = hashlib.sha256(b"").hexdigest()[:16]
GOLDEN_REPORTS = "f16fc1756e35188030bfb9f3dbe4fe2dcd5e448276c62a3d94864efc6bac0fb5"
GOLDEN_TABLES = {
    "bucket_partials": "0c2c3083adafcd55", "findings": "350e9e374e4d0b4d", "labels": "036fa5e04a393983",
    "quarantine": "67a0aa7b859ce295", "reference_profiles": "d9369df1877903f1", "scored_predictions": "33fb0c7fd226945b",
    "source_offsets": "79950a1e3439a74e", "ticks": "4e51ffe678430136", "versions_seen": "d3fd25f40a1dad49",
}
