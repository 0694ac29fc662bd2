"""Evaluation cases on real public data: serving logs built from UCI data sets that River ships inside its
wheel (read offline with `importlib.resources`, nothing downloaded), with faults injected at known times,
then replayed by `tailwatch backfill` and scored against the ground truth written beside the logs.

- `shuttle-monthly`: UCI Statlog (Shuttle), NASA shuttle sensor readings, 49,097 rows, 9 integer features,
  binary `anomaly` target (~7% positives; River's ODDS form). A random forest, ~165 predictions a day for
  ten months, labels 30 days late; the model stage 4x slower for two weeks from month 6, then from month 8 a
  model version whose preprocessing zeroes `f1` (recall drops; the logged inputs are the raw requests).
- `segment-hourly`: UCI Image Segmentation, 2,310 rows, 18 numeric features, 7 classes. ~580 requests an
  hour for 7 days resampled from the rows not trained on, a 300-row reference, labels 2-6 h late; the preprocess
  stage 3x slower for 12 hours, then a version whose preprocessing swaps the blue and green channels.

Both data sets come from the UCI Machine Learning Repository under CC BY 4.0. River (BSD-3-Clause) is
needed only to hold the files (`pip install 'river>=0.26'`, part of the `dev` extra).

`build(case, out)` writes `logs/{predictions,timings,labels}/`, `reference.parquet`, `tailwatch.yaml`
(written from docs/config.md, docs/contract.md and docs/quality.md) and `truth.json`; monitor/simulate/realscore.py
runs the case and scores it (docs/evaluation.md).
"""

from __future__ import annotations

import importlib.resources
import json
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

STAGES = ("parse", "preprocess", "model", "postprocess")
# Stage durations (ms) as gamma (shape, scale) per stage: a CPU model served behind a small HTTP layer;
# the image service's preprocessing extracts region features, most of its time.
STAGE_GAMMA = {
    "shuttle": {"parse": (2.0, 0.15), "preprocess": (3.0, 0.6), "model": (4.0, 2.0), "postprocess": (2.0, 0.1)},
    "segment": {"parse": (2.0, 0.3), "preprocess": (4.0, 2.5), "model": (4.0, 2.0), "postprocess": (2.0, 0.1)},
}
TIMEOUT_MS = 1000.0
FAIL_RATES = {"timeout": 0.004, "error": 0.002}  # of requests; they are logged, never dropped
LABELLED_SHARE = 0.97  # requests that ever get a label
ALERTING = ("slower", "worse", "both", "drift")  # verdicts that would alert (ModelRegression or InputDrift)
DATASETS = {
    "shuttle": {"file": "shuttle.csv.gz", "name": "UCI Statlog (Shuttle), ODDS binary form",
                "url": "https://archive.ics.uci.edu/dataset/148/statlog+shuttle", "license": "CC BY 4.0"},
    "segment": {"file": "segment.csv.zip", "name": "UCI Image Segmentation",
                "url": "https://archive.ics.uci.edu/dataset/50/image+segmentation", "license": "CC BY 4.0"},
}


@dataclass(frozen=True)
class Fault:
    """An injected fault over [onset, end) days from the start: `slowdown` multiplies one stage's time,
    `quality` serves `version` whose preprocessing breaks a feature (the logs keep the raw inputs);
    monitor/simulate/realcases.py adds `timeouts` (a `share` of requests hit the deadline) and `hotspot`
    (routing `value` takes a `share` of traffic and its `stage` is `factor` times slower)."""

    kind: str  # slowdown | quality | timeouts | hotspot
    onset_days: float
    end_days: float
    stage: str | None = None
    factor: float | None = None
    version: str | None = None
    change: str | None = None
    value: str | None = None
    share: float | None = None


@dataclass(frozen=True)
class Case:
    """One evaluation case: data set, traffic, label delay, faults and the config's windows."""

    name: str
    dataset: str
    start: datetime
    days: float
    per_hour: float
    label_delay: timedelta
    label_jitter: timedelta
    faults: tuple[Fault, ...]
    version: str
    bucket: str
    windows: tuple[str, ...]
    quality_windows: tuple[str, ...]
    maturity_horizon: str
    rules: tuple[dict, ...]
    step: str  # the backfill clock step (daemon.interval): the smallest window
    seed: int = 0

    @property
    def end(self) -> datetime:
        return self.start + timedelta(days=self.days)

    def at(self, days: float) -> datetime:
        return self.start + timedelta(days=days)


def shuttle_case(days: float = 300, label_delay_days: float = 30, slowdown: tuple[float, float] = (150, 164),
                 quality: tuple[float, float] = (240, 285), quality_windows: tuple[str, ...] = ("7d", "30d"),
                 name: str = "shuttle-monthly") -> Case:
    """~165 predictions a day (the full case: ten months, labels 30 days late)."""
    return Case(
        name=name, dataset="shuttle", start=datetime(2026, 1, 5, tzinfo=UTC), days=days, per_hour=165 / 24,
        label_delay=timedelta(days=label_delay_days), label_jitter=timedelta(hours=6),
        faults=(Fault("slowdown", *slowdown, stage="model", factor=4.0),
                Fault("quality", *quality, version="shuttle-rf-2", change="preprocessing zeroes f1")),
        version="shuttle-rf-1", bucket="1h", windows=("1d", "7d"), quality_windows=quality_windows,
        maturity_horizon=f"{int(label_delay_days) + 5}d",
        rules=({"name": "anomaly recall", "metric": "recall", "class": "1", "max_drop": 0.05},),
        step="1d")


def segment_case(days: float = 7, slowdown: tuple[float, float] = (3 + 10 / 24, 3 + 22 / 24),
                 quality: tuple[float, float] = (5, 6.5), name: str = "segment-hourly") -> Case:
    """~580 requests an hour (the full case: 7 days, labels 2-6 h late)."""
    return Case(
        name=name, dataset="segment", start=datetime(2026, 3, 2, tzinfo=UTC), days=days, per_hour=580,
        label_delay=timedelta(hours=2), label_jitter=timedelta(hours=4),
        faults=(Fault("slowdown", *slowdown, stage="preprocess", factor=3.0),
                Fault("quality", *quality, version="segment-rf-2", change="preprocessing swaps blue and green")),
        version="segment-rf-1", bucket="5m", windows=("1h", "1d"), quality_windows=("1h", "1d"),
        maturity_horizon="12h",
        rules=({"name": "accuracy", "metric": "accuracy", "class": "all", "max_drop": 0.03},
               {"name": "macro f1", "metric": "f1", "class": "macro", "max_drop": 0.05}),
        step="1h")


CASES = {"shuttle-monthly": shuttle_case, "segment-hourly": segment_case}


def short_cases() -> list[Case]:
    """The same mechanics over fewer days (what the test runs): 33 days of shuttle with labels 7 days
    late, 24 hours of segment."""
    return [shuttle_case(days=33, label_delay_days=7, slowdown=(9, 15), quality=(16, 33),
                         quality_windows=("7d",), name="shuttle-short"),
            segment_case(days=1, slowdown=(10 / 24, 15 / 24), quality=(16 / 24, 1), name="segment-short")]


# -- data -------------------------------------------------------------------------------------------

def load(dataset: str) -> tuple[pd.DataFrame, list[str], str]:
    """(rows, feature columns, target column) of a data set River ships; ValueError without River."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown data set {dataset!r}; one of {sorted(DATASETS)}")
    try:
        files = importlib.resources.files("river.datasets")
    except ModuleNotFoundError:
        raise ValueError("the real-data cases read their data from River's wheel: pip install 'river>=0.26'") from None
    with (files / DATASETS[dataset]["file"]).open("rb") as fh:
        frame = pd.read_csv(fh, compression="gzip" if dataset == "shuttle" else "zip")
    target = "anomaly" if dataset == "shuttle" else "category"
    return frame, [c for c in frame.columns if c != target], target


@dataclass
class _Model:
    """The served classifier and the rows it was not trained on."""

    estimator: Any
    features: list[str]
    classes: list
    reference: pd.DataFrame  # validation rows: features, label, prediction, scores
    pool: pd.DataFrame  # rows not trained on, serving draws from: features and the true class


def _train(case: Case) -> _Model:
    from sklearn.ensemble import RandomForestClassifier

    frame, features, target = load(case.dataset)
    rng = np.random.default_rng(case.seed)
    order = rng.permutation(len(frame))
    n_train, n_ref = (6000, 3000) if case.dataset == "shuttle" else (1000, 300)
    train = frame.iloc[order[:n_train]]
    ref = frame.iloc[order[n_train:n_train + n_ref]].reset_index(drop=True)
    # Serving draws from every row the model was not trained on, the reference's among them: the image
    # set is too small for a population apart from its 300 reference rows (a day of traffic replays each
    # held-out row ~14 times, so a day's window would be a sample of ~1,000 judged as one of 14,000).
    pool = frame.iloc[order[n_train:]].reset_index(drop=True)
    model = RandomForestClassifier(n_estimators=100, max_depth=8 if case.dataset == "shuttle" else 10,
                                   random_state=case.seed, n_jobs=1).fit(train[features], train[target])
    proba = model.predict_proba(ref[features])
    reference = ref[features].copy()
    reference["label"] = ref[target].to_numpy()
    reference["prediction"] = model.classes_[proba.argmax(axis=1)]
    for i, cls in enumerate(model.classes_):
        reference[f"score_{cls}"] = proba[:, i].round(6)
    return _Model(model, features, list(model.classes_), reference, pool.rename(columns={target: "label"}))


def _broken(case: Case, fault: Fault, x: pd.DataFrame) -> pd.DataFrame:
    """What the faulty version's preprocessing hands the model."""
    x = x.copy()
    if case.dataset == "shuttle":
        x["f1"] = 0
    else:  # the colour planes read in the wrong order: blue and green swapped, raw and excess
        for a, b in (("rawblue-mean", "rawgreen-mean"), ("exblue-mean", "exgreen-mean")):
            x[a], x[b] = x[b].to_numpy(), x[a].to_numpy()
    return x


# -- logs -------------------------------------------------------------------------------------------

def _arrivals(case: Case, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (epoch seconds, sorted): Poisson with a daily cycle peaking at 14:00 UTC."""
    seconds = case.days * 86400
    n = rng.poisson(case.per_hour * case.days * 24)
    start = case.start.timestamp()
    out = np.empty(0)
    while len(out) < n:  # thinning: candidates kept with probability intensity / peak
        t = rng.uniform(0, seconds, int(n * 1.6) + 100)
        hour = (t / 3600) % 24
        keep = rng.random(len(t)) < (1 + 0.5 * np.cos((hour - 14) / 24 * 2 * np.pi)) / 1.5
        out = np.concatenate([out, t[keep]])
    return start + np.sort(out[:n])


def _rfc3339(epoch_s: np.ndarray) -> np.ndarray:
    return pd.to_datetime(np.round(epoch_s * 1000).astype("int64"), unit="ms", utc=True).strftime(
        "%Y-%m-%dT%H:%M:%S.%f").str[:-3].to_numpy(dtype=object) + "Z"


def build(case: Case, out: Path) -> dict:
    """Write the case's logs, reference, config and ground truth under `out`; returns the truth."""
    out = Path(out)
    rng = np.random.default_rng(case.seed + 1)
    trained = _train(case)
    ts, rows, day = served_rows(case, trained, rng)
    n = len(ts)
    version = np.full(n, case.version, dtype=object)
    seen = rows[trained.features]
    for fault in case.faults:
        if fault.kind == "quality":
            hit = (day >= fault.onset_days) & (day < fault.end_days)
            version[hit] = fault.version
            seen = seen.copy()
            seen.loc[hit] = _broken(case, fault, seen.loc[hit])
    proba = trained.estimator.predict_proba(seen[trained.features])
    prediction = np.asarray(trained.classes, dtype=object)[proba.argmax(axis=1)]

    status = np.full(n, "ok", dtype=object)
    u = rng.random(n)
    status[u < FAIL_RATES["timeout"]] = "timeout"
    status[(u >= FAIL_RATES["timeout"]) & (u < FAIL_RATES["timeout"] + FAIL_RATES["error"])] = "error"
    stages = {s: rng.gamma(*STAGE_GAMMA[case.dataset][s], n) for s in STAGES}
    for fault in case.faults:
        if fault.kind == "slowdown":
            hit = (day >= fault.onset_days) & (day < fault.end_days)
            stages[fault.stage] = np.where(hit, stages[fault.stage] * fault.factor, stages[fault.stage])
    timeout, error = status == "timeout", status == "error"
    stages["model"] = np.where(timeout, TIMEOUT_MS - stages["parse"] - stages["preprocess"], stages["model"])
    for s in ("model", "postprocess"):
        stages[s] = np.where(error, np.nan, stages[s])
    stages["postprocess"] = np.where(timeout, np.nan, stages["postprocess"])
    latency = np.nansum(np.column_stack([stages[s] for s in STAGES]), axis=1) + rng.gamma(2, 0.05, n)

    request_id, preds, timing = log_frames(case, trained, ts, version, status, rows, prediction, proba, latency,
                                           stages)
    ok = status == "ok"
    labels = label_rows(case, rng, request_id, ts, rows["label"].to_numpy())
    write_logs(out, preds, timing, labels, ts, request_id)
    trained.reference.to_parquet(out / "reference.parquet", index=False)
    (out / "tailwatch.yaml").write_text(yaml.safe_dump(config(case, trained), sort_keys=False))

    truth = {
        "case": case.name, "dataset": DATASETS[case.dataset], "seed": case.seed,
        "start": _iso(case.start), "end": _iso(case.end), "step": case.step,
        "healthy": [_iso(case.start), _iso(case.at(min(f.onset_days for f in case.faults)))],
        "predictions": int(n), "labels": int(len(labels)), "timings": int(len(timing)),
        "status": {k: int(v) for k, v in Counter(status).items()},
        "label_delay_hours": case.label_delay.total_seconds() / 3600,
        "reference_rows": int(len(trained.reference)),
        "reference_accuracy": float((trained.reference["label"] == trained.reference["prediction"]).mean()),
        "faults": [{**{k: v for k, v in asdict(f).items() if v is not None}, "onset": _iso(case.at(f.onset_days)),
                    "end": _iso(case.at(f.end_days)),
                    "expected": ["slower", "both"] if f.kind == "slowdown" else ["worse", "both"]}
                   for f in case.faults],
    }
    served = preds.assign(label=rows["label"].to_numpy())[ok]
    for fault in case.faults:
        if fault.kind == "quality":
            within = served["model_version"] == fault.version
            truth[f"accuracy_{fault.version}"] = float((served[within]["prediction"].astype(str)
                                                        == served[within]["label"].astype(str)).mean())
            truth[f"accuracy_{case.version}"] = float((served[~within]["prediction"].astype(str)
                                                       == served[~within]["label"].astype(str)).mean())
    (out / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    return truth


def label_rows(case: Case, rng: np.random.Generator, request_id: np.ndarray, ts: np.ndarray,
               label: np.ndarray) -> pd.DataFrame:
    """The label records: LABELLED_SHARE of the requests, `label_ts` (epoch s) the case's delay plus
    jitter after the prediction, in `label_ts` order."""
    n = len(ts)
    labelled = rng.random(n) < LABELLED_SHARE
    label_ts = ts + case.label_delay.total_seconds() + rng.uniform(0, case.label_jitter.total_seconds(), n)
    labels = pd.DataFrame({"request_id": request_id, "label": label, "label_ts": label_ts})
    return labels[labelled].sort_values("label_ts", kind="stable")


def write_logs(out: Path, preds: pd.DataFrame, timing: pd.DataFrame, labels: pd.DataFrame, ts: np.ndarray,
               request_id: np.ndarray) -> None:
    """One JSONL file per UTC day of predictions and their timings (by prediction day) and of labels (by
    `label_ts` day) under `out/logs/`."""
    logs = out / "logs"
    for kind in ("predictions", "timings", "labels"):
        (logs / kind).mkdir(parents=True, exist_ok=True)
    pred_day = pd.to_datetime(ts, unit="s", utc=True).strftime("%Y%m%d").to_numpy()
    for d in np.unique(pred_day):
        mask = pred_day == d
        _jsonl(logs / "predictions" / f"predictions-{d}.jsonl", preds[mask])
        ids = set(request_id[mask])
        _jsonl(logs / "timings" / f"timings-{d}.jsonl", timing[timing["request_id"].isin(ids)])
    label_day = pd.to_datetime(labels["label_ts"].to_numpy(), unit="s", utc=True).strftime("%Y%m%d").to_numpy()
    labels = labels.assign(label_ts=_rfc3339(labels["label_ts"].to_numpy()))
    for d in np.unique(label_day):
        _jsonl(logs / "labels" / f"labels-{d}.jsonl", labels[label_day == d])


def served_rows(case: Case, trained: _Model, rng: np.random.Generator) -> tuple[np.ndarray, pd.DataFrame, np.ndarray]:
    """(arrival times in epoch s, the rows served at them, days since the start): rows drawn from the
    pool, each used once before any repeats."""
    ts = _arrivals(case, rng)
    n = len(ts)
    picks = np.concatenate([rng.permutation(len(trained.pool)) for _ in range(n // len(trained.pool) + 1)])[:n]
    return ts, trained.pool.iloc[picks].reset_index(drop=True), (ts - case.start.timestamp()) / 86400


def log_frames(case: Case, trained: _Model, ts: np.ndarray, version: np.ndarray, status: np.ndarray,
               rows: pd.DataFrame, prediction: np.ndarray, proba: np.ndarray, latency: np.ndarray,
               stages: dict[str, np.ndarray], extra: dict[str, np.ndarray] | None = None
               ) -> tuple[np.ndarray, pd.DataFrame, pd.DataFrame]:
    """(request ids, prediction rows, stage timing rows) as the logs hold them: features as served, the
    prediction and scores of `ok` requests only, `extra` columns (routing) after the status."""
    n = len(ts)
    request_id = np.array([f"{case.dataset[:3]}-{case.seed}-{i:07d}" for i in range(n)], dtype=object)
    preds = pd.DataFrame({"request_id": request_id, "ts": _rfc3339(ts), "model_version": version,
                          "status": status, **(extra or {})})
    for f in trained.features:
        preds[f] = rows[f].to_numpy()
    ok = status == "ok"
    preds["prediction"] = pd.array(np.where(ok, prediction, None), dtype=_class_dtype(trained.classes))
    for i, cls in enumerate(trained.classes):
        preds[f"score_{cls}"] = np.where(ok, proba[:, i].round(4), np.nan)
    preds["latency_ms"] = latency.round(3)
    timing = pd.DataFrame({"request_id": np.repeat(request_id, len(STAGES)),
                           "stage": np.tile(np.array(STAGES, dtype=object), n),
                           "duration_ms": np.column_stack([stages[s] for s in STAGES]).ravel().round(3)})
    timing = timing[timing["duration_ms"].notna()]  # a failed request never reached its later stages
    return request_id, preds, timing


def _class_dtype(classes: list) -> str:
    return "Int64" if all(isinstance(c, int | np.integer) for c in classes) else "object"


def _jsonl(path: Path, frame: pd.DataFrame) -> None:
    frame.to_json(path, orient="records", lines=True, double_precision=10)


def _iso(ts: datetime) -> str:
    return ts.isoformat().replace("+00:00", "Z")


def config(case: Case, trained: _Model) -> dict:
    """The case's tailwatch.yaml, as a user would write it from docs/config.md and docs/quality.md."""
    classes = [str(c) for c in trained.classes]
    schema: dict[str, Any] = {"features": dict.fromkeys(trained.features, "numeric"), "classes": classes}
    if len(classes) == 2:
        schema["positive_class"] = "1"
    return {
        "storage": {"url": "sqlite:///tailwatch.db"},
        # daemon.interval is the backfill's clock step: one step per smallest window.
        "daemon": {"interval": case.step, "log_format": "text", "health": {"port": None}},
        "services": [{
            "name": case.dataset,
            "sources": {"predictions": {"kind": "files", "path": "./logs/predictions"},
                        "timings": {"kind": "files", "path": "./logs/timings"},
                        "labels": {"kind": "files", "path": "./logs/labels"}},
            "schema": schema,
            "reference": {"path": "./reference.parquet"},
            "buckets": {"size": case.bucket, "windows": list(case.windows)},
            "accepted_versions": [case.version],
            "quality": {"windows": list(case.quality_windows), "coverage_threshold": 0.8,
                        "maturity_horizon": case.maturity_horizon,
                        "retention": f"{int(case.label_delay / timedelta(days=1)) + 30}d",
                        "accepted_version": case.version, "rules": [dict(r) for r in case.rules]},
        }],
        # Labels arrive `label_delay` (+ jitter) after their prediction: stale only a day past that.
        "alerts": {"no_data": {"labels_after": f"{int((case.label_delay + case.label_jitter) / timedelta(hours=1)) + 24}h"}},
    }
