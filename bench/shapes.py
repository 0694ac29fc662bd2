"""The checks benchmark's data: feature frames generated deterministically with numpy (10 numeric, 5
categorical and 1 text column), the current window's drift, the shapes strings come in, and the
contract fields tailwatch folds by."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pandas as pd

SEED = 20261201
NUMERIC = [f"num_{i}" for i in range(10)]
CATEGORICAL = [f"cat_{i}" for i in range(5)]
TEXT = "notes"
CARDINALITY = (3, 5, 12, 50, 150)
SHAPES = ("shared", "distinct", "unique")

_WORDS = ("customer called about billing again please check the contract renewal discount offered "
          "router reset fiber outage promo escalate tier-2 ok thanks modem slow refund").split()


def _text_pool(rng: np.random.Generator, n: int = 4096) -> np.ndarray:
    pool = []
    for _ in range(n):
        target = int(rng.integers(0, 300))
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < target:
            words.append(_WORDS[int(rng.integers(len(_WORDS)))])
        pool.append(" ".join(words)[:target])
    return np.array(pool, dtype=object)


def _with_missing(values: np.ndarray, rng: np.random.Generator, rate: float) -> np.ndarray:
    out = values.astype(object) if values.dtype == object else values.astype(float)
    out[rng.random(len(out)) < rate] = None if out.dtype == object else np.nan
    return out


def make_features(n: int, seed: int, drift: bool) -> pd.DataFrame:
    """`n` rows of the 16 feature columns, deterministic in `seed`; `drift` is the current window's
    changes: shifted / rescaled numbers, values beyond the reference range, new category mix, unseen
    categories, longer texts and more missing values."""
    rng = np.random.default_rng(seed)
    d = 1 if drift else 0
    cols: dict[str, np.ndarray] = {
        "num_0": rng.normal(50 + 5 * d, 10, n),  # mean shift of half a standard deviation
        "num_1": rng.lognormal(3.0, 0.5 + 0.2 * d, n),  # wider
        "num_2": rng.uniform(0, 100, n),
        "num_3": rng.exponential(2.0, n),
        "num_4": rng.poisson(4, n).astype(float),
        "num_5": rng.normal(0, 1, n),
        "num_6": rng.gamma(2.0, 3.0, n),
        "num_7": rng.integers(0, 73, n).astype(float),
        "num_8": rng.beta(2, 5, n),
        "num_9": rng.normal(1000, 200, n),
    }
    if drift:
        # 2% of num_2 beyond the reference's [0, 100), both sides.
        out = rng.random(n) < 0.02
        cols["num_2"][out] = np.where(rng.random(int(out.sum())) < 0.5, -5.0, 150.0)
    for name, values in cols.items():
        rate = 0.08 if drift and name == "num_3" else 0.01
        cols[name] = _with_missing(values, rng, rate)
    for i, k in enumerate(CARDINALITY):
        names = np.array([f"c{i}_{j:03d}" for j in range(k)], dtype=object)
        weights = 1.0 / np.arange(1, k + 1)  # Zipf-like
        if drift and i == 1:
            weights = weights[::-1]  # the mix turns around
        values = names[rng.choice(k, n, p=weights / weights.sum())]
        if drift and i == 3:
            new = rng.random(n) < 0.02  # categories the reference never had
            values[new] = np.array([f"c3_new{j}" for j in range(40)], dtype=object)[rng.integers(0, 40, int(new.sum()))]
        cols[f"cat_{i}"] = _with_missing(values, rng, 0.03 if drift and i == 2 else 0.005)
    pool = _text_pool(np.random.default_rng(SEED))  # one pool for both frames
    lengths = np.array([len(s) for s in pool])
    if drift:
        p = (lengths + 50.0) ** 2  # longer texts more likely
        texts = pool[rng.choice(len(pool), n, p=p / p.sum())]
    else:
        texts = pool[rng.integers(0, len(pool), n)]
    cols[TEXT] = _with_missing(texts, rng, 0.05)
    return pd.DataFrame(cols)


def reshape(frame: pd.DataFrame, shape: str, seed: int) -> pd.DataFrame:
    """The frame in one of SHAPES: `shared` as generated (rows share each distinct str object);
    `distinct` a new str object per categorical and text value (what json.loads of each row gives);
    `unique` that, and each text prefixed by a ticket number unique to its row and `seed`."""
    if shape == "shared":
        return frame
    cols = {}
    for name in [*CATEGORICAL, TEXT]:
        values = frame[name].to_numpy(dtype=object).tolist()
        if shape == "unique" and name == TEXT:
            cols[name] = [None if v is None else f"#{seed % 1000:03d}{i:07d} {v}" for i, v in enumerate(values)]
        else:
            cols[name] = [None if v is None else v.encode().decode() for v in values]
    return frame.assign(**{k: np.array(v, dtype=object) for k, v in cols.items()})


def with_contract(frame: pd.DataFrame, start: datetime, span: timedelta, seed: int) -> pd.DataFrame:
    """The features plus the contract's own fields (ts spread evenly over [start, start + span),
    one model version, a few failed requests) that tailwatch folds by."""
    n = len(frame)
    rng = np.random.default_rng(seed)
    step_ns = span.total_seconds() * 1e9 / n
    ts = pd.to_datetime(int(start.timestamp() * 1e9) + (np.arange(n) * step_ns).astype("int64"), utc=True)
    status = rng.choice(np.array(["ok", "timeout", "error"], dtype=object), n, p=[0.97, 0.02, 0.01])
    return frame.assign(ts=ts, model_version="v1", status=status)


def schema():
    from monitor.schema import Schema

    return Schema(features={**{c: "numeric" for c in NUMERIC}, **{c: "categorical" for c in CATEGORICAL},
                            TEXT: "text"})
