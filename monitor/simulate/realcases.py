"""Evaluation cases on public data sets that ship with scikit-learn and statsmodels (read offline, nothing
downloaded), built with the helpers of monitor/simulate/realdata.py and scored the same way.

- `digits-deadline`: scikit-learn's Digits (UCI Optical Recognition of Handwritten Digits: 1,797 8x8
  images, 64 pixel counts 0..16, most of them 0 in most images), 10 classes. An MLP served behind a
  250 ms deadline by 4 replicas, ~1,000 requests an hour for 4 days, a 300-row reference, labels 2-5 h
  late. Faults: 6% of requests time out at the deadline (successful latency flat); `api-2` takes 40% of
  traffic with a 4x slower `model` stage; a version `digits-int8` whose weights and activations are
  quantized to int8 (a little faster, a little less accurate: measured, written to `truth.json`).
- `fair-groups`: statsmodels' `fair` (Fair 1978, 6,366 survey answers), target `affairs > 0`. A gradient
  boosting classifier, ~300 requests an hour for 6 days, a 1,000-row reference, labels 6-12 h late, quality
  rules per `occupation` group. Fault: a version whose preprocessing fills `rate_marriage` from a lookup
  keyed by occupation that lacks code 5 (managerial, ~12% of traffic): those requests get the default 5.

`build_case(case, out)` builds any case (these or realdata.py's); `all_cases()` names every full case.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from monitor.simulate import realdata
from monitor.simulate.realdata import (
    FAIL_RATES,
    STAGES,
    Case,
    Fault,
    _iso,
    _Model,
    label_rows,
    log_frames,
    served_rows,
    write_logs,
)

STAGE_GAMMA = {  # stage durations (ms) as gamma (shape, scale)
    "digits": {"parse": (2.0, 0.5), "preprocess": (3.0, 1.0), "model": (4.0, 5.0), "postprocess": (2.0, 0.2)},
    "fair": {"parse": (2.0, 0.2), "preprocess": (3.0, 0.5), "model": (4.0, 1.5), "postprocess": (2.0, 0.1)},
}
DATASETS = {
    "digits": {"file": "sklearn.datasets.load_digits", "name": "UCI Optical Recognition of Handwritten Digits "
               "(scikit-learn's Digits)", "url": "https://archive.ics.uci.edu/dataset/80", "license": "CC BY 4.0"},
    "fair": {"file": "statsmodels.datasets.fair", "name": "Fair (1978), Redbook survey of affairs",
             "url": "https://www.statsmodels.org/stable/datasets/generated/fair.html", "license": "public domain"},
}
# Fair's occupation codes, as the statsmodels description names them.
OCCUPATIONS = {1: "student", 2: "farming", 3: "white_collar", 4: "teacher", 5: "managerial", 6: "professional"}
INT8_CLIP_PERCENTILE = 90  # activation range of the int8 version: this percentile of a calibration batch


@dataclass(frozen=True)
class ServedCase(Case):
    """A case with a request deadline, routing replicas, categorical features and quality groups."""

    deadline_ms: float = 1000.0
    replicas: tuple[str, ...] = ()
    categorical: tuple[str, ...] = ()
    groups: tuple[tuple[str, str], ...] = ()  # (name, expression) as written in quality.groups


def digits_case(days: float = 4, per_hour: float = 1000, timeouts: tuple[float, float] = (1.5, 2.0),
                hotspot: tuple[float, float] = (2.25, 2.75), int8: tuple[float, float] = (3.0, 3.75),
                name: str = "digits-deadline") -> ServedCase:
    """~1,000 requests an hour over 4 replicas behind a 250 ms deadline, labels 2-5 h late."""
    return ServedCase(
        name=name, dataset="digits", start=datetime(2026, 4, 6, tzinfo=UTC), days=days, per_hour=per_hour,
        label_delay=timedelta(hours=2), label_jitter=timedelta(hours=3),
        faults=(Fault("timeouts", *timeouts, share=0.06),
                Fault("hotspot", *hotspot, stage="model", factor=4.0, value="api-2", share=0.4),
                Fault("quality", *int8, stage="model", factor=0.8, version="digits-int8",
                      change="int8 weights and activations")),
        version="digits-mlp-1", bucket="5m", windows=("1h", "1d"), quality_windows=("1h", "1d"),
        maturity_horizon="12h",
        rules=({"name": "accuracy", "metric": "accuracy", "class": "all", "max_drop": 0.01},),
        step="1h", deadline_ms=250.0, replicas=("api-1", "api-2", "api-3", "api-4"))


def fair_case(days: float = 6, per_hour: float = 300, broken: tuple[float, float] = (3.0, 5.0),
              name: str = "fair-groups") -> ServedCase:
    """~300 requests an hour, labels 6-12 h late, quality rules per occupation."""
    return ServedCase(
        name=name, dataset="fair", start=datetime(2026, 5, 4, tzinfo=UTC), days=days, per_hour=per_hour,
        label_delay=timedelta(hours=6), label_jitter=timedelta(hours=6),
        faults=(Fault("quality", *broken, version="fair-gb-2",
                      change="rate_marriage lookup lacks occupation 5"),),
        version="fair-gb-1", bucket="1h", windows=("6h", "1d"), quality_windows=("6h", "1d"),
        maturity_horizon="2d",
        rules=({"name": "accuracy", "metric": "accuracy", "class": "all", "max_drop": 0.03},
               {"name": "recall by occupation", "metric": "recall", "class": "1", "group": "*", "max_drop": 0.1}),
        step="6h", categorical=("rate_marriage", "religious", "educ", "occupation", "occupation_husb"),
        groups=tuple((label, f"occupation == {code}") for code, label in OCCUPATIONS.items()))


CASES: dict[str, Callable[[], Case]] = {"digits-deadline": digits_case, "fair-groups": fair_case}


def short_cases() -> list[Case]:
    """The same mechanics over a day or two (the bench's `--short`)."""
    return [digits_case(days=1, per_hour=600, timeouts=(6 / 24, 9 / 24), hotspot=(11 / 24, 14 / 24),
                        int8=(16 / 24, 21 / 24), name="digits-short"),
            fair_case(days=4, broken=(1.5, 2.5), name="fair-short")]


def all_cases() -> dict[str, Callable[[], Case]]:
    """Every full real-data case by name: realdata.py's and these."""
    return {**realdata.CASES, **CASES}


def build_case(case: Case, out: Path) -> dict:
    """Build any real-data case under `out` (logs, reference, config, truth); returns the truth."""
    return build(case, out) if case.dataset in DATASETS else realdata.build(case, out)


# -- data and models ---------------------------------------------------------------------------------

@dataclass
class _Served:
    """The trained model (realdata's `_Model`) and how each version predicts: version -> X -> probabilities."""

    model: _Model
    predict: dict[str, Callable[[pd.DataFrame], np.ndarray]]


def load(dataset: str) -> tuple[pd.DataFrame, list[str], str]:
    """(rows, feature columns, target column) of a data set bundled with scikit-learn or statsmodels."""
    if dataset == "digits":
        from sklearn.datasets import load_digits

        bunch = load_digits()
        frame = pd.DataFrame(bunch.data.astype(int), columns=[f"px{i}" for i in range(64)])
        frame["digit"] = bunch.target
        return frame, [c for c in frame.columns if c != "digit"], "digit"
    if dataset == "fair":
        from statsmodels.datasets import fair

        frame = fair.load_pandas().data
        frame = frame.assign(affair=(frame.pop("affairs") > 0).astype(int))
        return frame, [c for c in frame.columns if c != "affair"], "affair"
    raise ValueError(f"unknown data set {dataset!r}; one of {sorted(DATASETS)}")


def _split(case: Case) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list[str]]:
    """(train, reference, pool): the pool, which serving draws from, is every row not trained on."""
    frame, features, target = load(case.dataset)
    order = np.random.default_rng(case.seed).permutation(len(frame))
    n_train, n_ref = (900, 300) if case.dataset == "digits" else (2500, 1000)
    frame = frame.rename(columns={target: "label"})
    return (frame.iloc[order[:n_train]], frame.iloc[order[n_train:n_train + n_ref]].reset_index(drop=True),
            frame.iloc[order[n_train:]].reset_index(drop=True), features)


def _softmax(z: np.ndarray) -> np.ndarray:
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def _int8(weights: np.ndarray) -> np.ndarray:
    """Symmetric per-tensor int8 quantization, returned dequantized."""
    scale = np.abs(weights).max() / 127
    return np.clip(np.round(weights / scale), -127, 127) * scale


def _int8_mlp(mlp: Any, calibration: np.ndarray) -> Callable[[pd.DataFrame], np.ndarray]:
    """The MLP with int8 weights and int8 hidden activations, their range set by the INT8_CLIP_PERCENTILE
    of a calibration batch (the larger activations saturate)."""
    w1, w2 = _int8(mlp.coefs_[0]), _int8(mlp.coefs_[1])
    b1, b2 = mlp.intercepts_

    def hidden(x: np.ndarray) -> np.ndarray:
        return np.maximum(x @ w1 + b1, 0)

    step = np.percentile(hidden(calibration), INT8_CLIP_PERCENTILE) / 127
    return lambda x: _softmax(np.clip(np.round(hidden(x.to_numpy(float)) / step), 0, 127) * step @ w2 + b2)


def _fair_broken(x: pd.DataFrame) -> pd.DataFrame:
    """What fair-gb-2's preprocessing hands the model: its `rate_marriage` lookup has no row for occupation
    5, and a miss falls back to the default 5 ("very good")."""
    x = x.copy()
    x.loc[x["occupation"] == 5, "rate_marriage"] = 5.0
    return x


def _train(case: Case) -> _Served:
    train, ref, pool, features = _split(case)
    if case.dataset == "digits":
        from sklearn.neural_network import MLPClassifier

        estimator = MLPClassifier((32,), max_iter=800, random_state=case.seed).fit(train[features], train["label"])
        broken = case.faults[-1].version
        predict = {case.version: estimator.predict_proba,
                   broken: _int8_mlp(estimator, train[features].to_numpy(float)[:64])}
    else:
        from sklearn.ensemble import GradientBoostingClassifier

        estimator = GradientBoostingClassifier(max_depth=3, random_state=case.seed).fit(train[features],
                                                                                         train["label"])
        predict = {case.version: estimator.predict_proba,
                   case.faults[0].version: lambda x: estimator.predict_proba(_fair_broken(x))}
    proba = estimator.predict_proba(ref[features])
    reference = ref[features].copy()
    reference["label"] = ref["label"].to_numpy()
    reference["prediction"] = estimator.classes_[proba.argmax(axis=1)]
    for i, cls in enumerate(estimator.classes_):
        reference[f"score_{cls}"] = proba[:, i].round(4)  # as the logs write them: one precision on both sides
    return _Served(_Model(estimator, features, [int(c) for c in estimator.classes_], reference, pool), predict)


# -- logs -------------------------------------------------------------------------------------------

def _within(day: np.ndarray, fault: Fault) -> np.ndarray:
    return (day >= fault.onset_days) & (day < fault.end_days)


def _replicas(case: ServedCase, day: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
    """The replica of each request: an even split, except that a hotspot's value takes its share."""
    if not case.replicas:
        return None
    k = len(case.replicas)
    weights = np.full((len(day), k), 1 / k)
    for fault in case.faults:
        if fault.kind == "hotspot":
            hot = np.zeros(k)
            hot[case.replicas.index(fault.value)] = fault.share
            hot[hot == 0] = (1 - fault.share) / (k - 1)
            weights[_within(day, fault)] = hot
    pick = (rng.random(len(day))[:, None] > np.cumsum(weights, axis=1)).sum(axis=1)
    return np.asarray(case.replicas, dtype=object)[np.minimum(pick, k - 1)]


def build(case: ServedCase, out: Path) -> dict:
    """Write the case's logs, reference, config and ground truth under `out`; returns the truth."""
    out = Path(out)
    rng = np.random.default_rng(case.seed + 1)
    served = _train(case)
    trained = served.model
    ts, rows, day = served_rows(case, trained, rng)
    n = len(ts)
    version = np.full(n, case.version, dtype=object)
    for fault in case.faults:
        if fault.kind == "quality":
            version[_within(day, fault)] = fault.version
    proba = np.zeros((n, len(trained.classes)))
    for v in np.unique(version):
        proba[version == v] = served.predict[v](rows.loc[version == v, trained.features])
    prediction = np.asarray(trained.classes, dtype=object)[proba.argmax(axis=1)]

    status = np.full(n, "ok", dtype=object)
    u = rng.random(n)
    status[u < FAIL_RATES["timeout"]] = "timeout"
    status[(u >= FAIL_RATES["timeout"]) & (u < FAIL_RATES["timeout"] + FAIL_RATES["error"])] = "error"
    u = rng.random(n)
    for fault in case.faults:
        if fault.kind == "timeouts":  # the model call hangs until the deadline
            status[_within(day, fault) & (u < fault.share)] = "timeout"
    replica = _replicas(case, day, rng)
    stages = {s: rng.gamma(*STAGE_GAMMA[case.dataset][s], n) for s in STAGES}
    for fault in case.faults:
        hit = _within(day, fault)
        if fault.kind == "hotspot":
            hit &= replica == fault.value
        elif fault.kind == "quality":
            hit &= version == fault.version
        if fault.stage is not None and fault.kind != "timeouts":
            stages[fault.stage] = np.where(hit, stages[fault.stage] * fault.factor, stages[fault.stage])
    overhead = rng.gamma(2, 0.05, n)
    total = sum(stages[s] for s in STAGES) + overhead
    status[(status == "ok") & (total >= case.deadline_ms)] = "timeout"  # slower than the deadline: cut off
    timeout, error = status == "timeout", status == "error"
    stages["model"] = np.where(timeout, case.deadline_ms - stages["parse"] - stages["preprocess"], stages["model"])
    for s in ("model", "postprocess"):
        stages[s] = np.where(error, np.nan, stages[s])
    stages["postprocess"] = np.where(timeout, np.nan, stages["postprocess"])
    latency = np.nansum(np.column_stack([stages[s] for s in STAGES]), axis=1) + overhead
    latency = np.where(timeout, case.deadline_ms, latency)

    request_id, preds, timing = log_frames(case, trained, ts, version, status, rows, prediction, proba, latency,
                                           stages, None if replica is None else {"replica": replica})
    labels = label_rows(case, rng, request_id, ts, rows["label"].to_numpy())
    write_logs(out, preds, timing, labels, ts, request_id)
    trained.reference.to_parquet(out / "reference.parquet", index=False)
    (out / "tailwatch.yaml").write_text(yaml.safe_dump(config(case, trained), sort_keys=False))
    truth = _truth(case, trained, preds.assign(label=rows["label"].to_numpy()), len(labels), len(timing), day)
    (out / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    return truth


def _figures(frame: pd.DataFrame, binary: bool) -> dict[str, float]:
    """Accuracy (and recall of class 1 for a binary model) of the served `ok` rows, and their count."""
    right = frame["prediction"].astype(int) == frame["label"].astype(int)
    out = {"n": int(len(frame)), "accuracy": round(float(right.mean()), 4)}
    if binary:
        out["recall_1"] = round(float(right[frame["label"] == 1].mean()), 4)
    return out


def _truth(case: ServedCase, trained: _Model, preds: pd.DataFrame, labels: int, timings: int,
           day: np.ndarray) -> dict:
    """The ground truth: the faults with the verdicts expected, the healthy range, counts, and each version's
    measured quality (overall and per group)."""
    truth = {
        "case": case.name, "dataset": DATASETS[case.dataset], "seed": case.seed,
        "start": _iso(case.start), "end": _iso(case.end), "step": case.step,
        "healthy": [_iso(case.start), _iso(case.at(min(f.onset_days for f in case.faults)))],
        "predictions": int(len(preds)), "labels": labels, "timings": timings,
        "status": {k: int(v) for k, v in Counter(preds["status"]).items()},
        "label_delay_hours": case.label_delay.total_seconds() / 3600,
        "reference_rows": int(len(trained.reference)),
        "reference_accuracy": float((trained.reference["label"] == trained.reference["prediction"]).mean()),
        "deadline_ms": case.deadline_ms,
        "faults": [{**{k: v for k, v in asdict(f).items() if v is not None}, "onset": _iso(case.at(f.onset_days)),
                    "end": _iso(case.at(f.end_days)),
                    "expected": ["worse", "both"] if f.kind == "quality" else ["slower", "both"]}
                   for f in case.faults],
    }
    ok = preds[preds["status"] == "ok"]
    binary = len(trained.classes) == 2
    truth["quality"] = {v: _figures(ok[ok["model_version"] == v], binary) for v in sorted(set(ok["model_version"]))}
    for name, expression in case.groups:
        rows = ok.query(expression)
        truth["quality"].update({f"{v}/{name}": _figures(rows[rows["model_version"] == v], binary)
                                 for v in sorted(set(rows["model_version"]))})
    for fault, shown in zip(case.faults, truth["faults"], strict=True):
        during = preds[_within(day, fault)]
        if fault.kind == "timeouts":
            shown["timeout_share"] = round(float((during["status"] == "timeout").mean()), 4)
        elif fault.kind == "hotspot":
            shown["measured_share"] = round(float((during["replica"] == fault.value).mean()), 4)
    return truth


def config(case: ServedCase, trained: _Model) -> dict:
    """realdata's config with the categorical features and the quality groups declared, as docs/config.md
    and docs/quality.md say."""
    out = realdata.config(case, trained)
    service = out["services"][0]
    service["schema"]["features"].update(dict.fromkeys(case.categorical, "categorical"))
    if case.groups:
        service["quality"]["groups"] = dict(case.groups)
    return out
