"""Time of a backfill over months of low-rate history:
`python bench/backfill.py [--days 304] [--per-day 165] [--step 1h] [--max-steps N] [--profile out.prof]`.

Writes a history like the one a small service keeps: predictions at `--per-day` a day (Poisson arrivals, one
JSON Lines file per month), five stage timings per request without `start_ts`, and labels 30 days late with
their `label_ts`; a config with a `quality:` section (1-day windows) and 1-hour buckets; then runs
`backfill.run` over the whole span with `--step` and prints one JSON object: steps, seconds, steps/s, and what
was folded, joined, labelled and quarantined (`summary`: the backfill's own, per service) (`cpu_seconds`: the process's CPU time, steadier than the wall
clock on a shared machine). `--max-steps` stops early (the seconds are then for those steps); `--from-day D --max-steps N` times N steps
from day D on (the history before it is read by one untimed first step), for a figure later in the history.
`--spans` writes the timings as OTLP-JSON spans the way OpenTelemetry Collectors' file exporters do (three
instances, each request's spans in one export line of the instance it went to, a file per instance and
month): spans out of time order across files that each cover a month.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import inspect
import json
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

START = datetime(2025, 1, 1, tzinfo=UTC)
STAGES = ("preprocess", "retrieve", "model", "postprocess", "serialize")
LABEL_DELAY = timedelta(days=30)


def write_history(root: Path, days: int, per_day: float, seed: int = 3, spans: bool = False) -> dict:
    """Predictions, timings (no start_ts; with `spans`, OTLP-JSON export lines) and labels (label_ts 30 days
    after ts) under root/logs."""
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(per_day * days))
    offsets_us = np.sort(rng.integers(0, days * 86_400_000_000, n))
    ts = pd.to_datetime(START) + pd.to_timedelta(offsets_us, unit="us")
    rid = np.char.add("r", np.arange(n).astype(str)).astype(object)
    tenure = rng.integers(0, 72, n)
    contract = np.asarray(["Month-to-month", "One year", "Two year"], dtype=object)[rng.integers(0, 3, n)]
    p_yes = 1 / (1 + np.exp((tenure - 20) / 8))
    truth = rng.random(n) < p_yes
    score = np.clip(p_yes + rng.normal(0, 0.15, n), 0, 1)
    preds = pd.DataFrame({
        "request_id": rid, "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "model_version": "v1",
        "status": np.where(rng.random(n) < 0.02, "timeout", "ok"), "tenure": tenure, "Contract": contract,
        "prediction": np.where(score >= 0.5, "Yes", "No"), "score_Yes": score.round(4),
        "latency_ms": rng.gamma(4, 10, n).round(3)})
    month = ts.strftime("%Y%m")
    timings = pd.DataFrame({
        "request_id": np.repeat(rid, len(STAGES)), "stage": np.tile(np.asarray(STAGES, dtype=object), n),
        "duration_ms": rng.gamma(2, 4, n * len(STAGES)).round(3)})
    label_at = ts + LABEL_DELAY
    labels = pd.DataFrame({"request_id": rid, "label": np.where(truth, "Yes", "No"),
                           "label_ts": label_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")})
    for kind in ("predictions", "timings", "labels"):
        (root / "logs" / kind).mkdir(parents=True, exist_ok=True)
    for m in sorted(set(month)):
        preds[month == m].to_json(root / "logs" / "predictions" / f"predictions-{m}.jsonl", orient="records",
                                  lines=True)
        if not spans:
            timings[np.repeat(month == m, len(STAGES))].to_json(
                root / "logs" / "timings" / f"timings-{m}.jsonl", orient="records", lines=True)
    if spans:
        _write_spans(root / "logs" / "timings", ts, rid, timings["duration_ms"].to_numpy(), month, rng)
    label_month = label_at.strftime("%Y%m")
    for m in sorted(set(label_month)):
        labels[label_month == m].to_json(root / "logs" / "labels" / f"labels-{m}.jsonl", orient="records", lines=True)
    return {"predictions": n, "timings": n * len(STAGES), "labels": n}


def _write_spans(folder: Path, ts: pd.DatetimeIndex, rid: np.ndarray, durations: np.ndarray, month: np.ndarray,
                 rng: np.random.Generator, instances: int = 3) -> None:
    """Each request's stages as spans one after the other from its `ts`, in one export line of a random
    Collector instance's file for its month."""
    start = ts.asi8  # ns
    ms = durations.reshape(len(rid), len(STAGES))
    ends = start[:, None] + np.cumsum(ms * 1e6, axis=1).astype(np.int64)
    begins = ends - (ms * 1e6).astype(np.int64)
    who = rng.integers(0, instances, len(rid))
    for i in range(len(rid)):
        spans = [{"traceId": f"{i + 1:032x}", "spanId": f"{i * 8 + k + 1:016x}", "name": stage,
                  "startTimeUnixNano": str(begins[i, k]), "endTimeUnixNano": str(ends[i, k]),
                  "attributes": [{"key": "request_id", "value": {"stringValue": rid[i]}}]}
                 for k, stage in enumerate(STAGES)]
        doc = {"resourceSpans": [{"resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "churn"}}]},
            "scopeSpans": [{"scope": {"name": "bench"}, "spans": spans}]}]}
        with open(folder / f"traces-agent-{who[i]}-{month[i]}.json", "a") as fh:
            fh.write(json.dumps(doc, separators=(",", ":")) + "\n")


def config(root: Path, step: str, spans: bool = False) -> dict:
    return {
        "storage": {"url": f"sqlite:///{root / 'tw.db'}"},
        # daemon.interval is the step of a backfill that has no --step of its own.
        "daemon": {"log_format": "json", "health": {"port": None}, "interval": step},
        "services": [{
            "name": "svc",
            "sources": {kind: {"kind": "files", "path": str(root / "logs" / kind)}
                        | ({"format": "otlp"} if spans and kind == "timings" else {})
                        for kind in ("predictions", "timings", "labels")},
            "schema": {"features": {"tenure": "numeric", "Contract": "categorical"}, "segments": ["Contract"],
                       "classes": ["No", "Yes"], "positive_class": "Yes"},
            "buckets": {"size": "1h", "windows": ["1h", "1d"]},
            "join": {"lateness": "10m"},
            "quality": {"windows": ["1d"], "min_n": 30, "label_horizon": "45d", "maturity_horizon": "40d",
                        "rules": [{"metric": "recall", "class": "Yes", "max_drop": 0.2}], "bootstrap_samples": 50},
        }],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=304)
    ap.add_argument("--per-day", type=float, default=165.0)
    ap.add_argument("--step", default="1h")
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--from-day", type=int, default=0,
                    help="start the replay this many days in (its first step, the backlog before it, is not timed)")
    ap.add_argument("--profile", type=Path, default=None, help="write a cProfile of the replay here")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--spans", action="store_true", help="timings as Collector-written OTLP-JSON span files")
    args = ap.parse_args()

    from monitor import config as config_mod
    from monitor.daemon import backfill
    from storage.store import Store

    work = Path(tempfile.mkdtemp(prefix="tailwatch-backfill-"))
    try:
        written = write_history(work, args.days, args.per_day, spans=args.spans)
        (work / "tailwatch.yaml").write_text(yaml.safe_dump(config(work, args.step, args.spans), sort_keys=False))
        cfg = config_mod.load(work / "tailwatch.yaml")
        store = Store(cfg.storage.url)
        store.upgrade()
        kw = {"max_steps": args.max_steps}
        if "step" in inspect.signature(backfill.run).parameters:
            kw["step"] = config_mod.parse_duration(args.step)
        since, until = START + timedelta(days=args.from_day), START + timedelta(days=args.days)
        if args.from_day:
            backfill.run(cfg, store, since, until, **{**kw, "max_steps": 1})
        profiler = cProfile.Profile(time.process_time) if args.profile else None  # CPU, not waits
        started, cpu = time.perf_counter(), time.process_time()
        if profiler:
            profiler.enable()
        result = backfill.run(cfg, store, since, until, **kw)
        if profiler:
            profiler.disable()
            profiler.dump_stats(args.profile)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        year_steps = 365 * 86400 / _seconds(args.step)
        with store.transaction() as session:
            quarantined = store.quarantine.counts(session, "svc")
        totals = _totals(store)
        print(json.dumps({
            "days": args.days, "from_day": args.from_day, "written": written, "step": args.step, "steps": result.steps, "done": result.done,
            "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1), "steps_per_s": round(result.steps / seconds, 1),
            # A year's replay at this step, from the seconds per step measured here.
            "year_minutes": round(seconds / max(result.steps, 1) * year_steps / 60, 1),
            "year_cpu_minutes": round(cpu / max(result.steps, 1) * year_steps / 60, 1),
            **totals, "quarantined": dict(quarantined),
            "summary": [dataclasses.asdict(x) for x in backfill.summarize(cfg, store, result.run_id)]},
            indent=1, default=str))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


def _seconds(step: str) -> float:
    from monitor.config import parse_duration

    return parse_duration(step).total_seconds()


def _totals(store) -> dict:
    """Predictions folded with and without timings, labels stored, and quality findings written by ticks."""
    from sqlalchemy import text

    with store.engine.connect() as conn:
        joined, unmatched = conn.execute(text("select sum(joined), sum(unmatched) from ticks")).one()
        labels = conn.execute(text("select count(*) from labels")).scalar()
        summaries = conn.execute(text("select summary from ticks")).scalars().all()
    quality = sum((json.loads(s) if isinstance(s, str) else s or {}).get("quality_findings", 0) for s in summaries)
    return {"joined": joined, "unmatched": unmatched, "labels_stored": labels, "quality_findings": quality}


if __name__ == "__main__":
    main()
