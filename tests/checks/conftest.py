"""Builders for the check tests: prediction rows as the frame stage hands them to fold, and windows."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import numpy as np
import pandas as pd
import pytest

from monitor.aggregate.fold import fold
from monitor.aggregate.partial import ALL, Partial, merge_all
from monitor.aggregate.profile import Profile
from monitor.schema import Schema

T0 = pd.Timestamp("2026-03-01T00:00:00Z")


def requests(n: int, **columns) -> pd.DataFrame:
    """n joined prediction rows of model v1 within one hour; `columns` add or replace columns."""
    base = {
        "request_id": [f"r{i}" for i in range(n)],
        "ts": T0 + pd.to_timedelta(np.linspace(0, 3599, n) if n else [], unit="s"),
        "model_version": ["v1"] * n,
        "status": ["ok"] * n,
        "joined": [True] * n,
        "stage_rows": [1] * n,
    }
    base.update(columns)
    return pd.DataFrame(base)


def to_window(frame: pd.DataFrame, schema: Schema | None = None, profile: Profile | None = None) -> Partial:
    """The frame folded in hour buckets and merged into one window (segment ALL)."""
    rows = fold(frame, timedelta(hours=1), [], timed=True, schema=schema, profile=profile)
    return merge_all(Partial.from_bytes(r.payload) for r in rows if r.segment == ALL)


@pytest.fixture
def make() -> Callable[..., pd.DataFrame]:
    return requests


@pytest.fixture
def window() -> Callable[..., Partial]:
    return to_window


SCHEMA = Schema(features={"x": "numeric", "c": "categorical", "t": "text"}, signals=["queue_depth"],
                classes=["yes", "no"])


def healthy(n: int, rng: np.random.Generator, **shift) -> pd.DataFrame:
    """n rows from the one distribution every test treats as normal; `shift` replaces columns."""
    words = rng.integers(1, 30, n)
    cols = {
        "x": rng.normal(50, 10, n),
        "c": rng.choice(["a", "b", "c", "d"], n, p=[0.4, 0.3, 0.2, 0.1]),
        "t": ["w" * k for k in words],
        "prediction": rng.choice(["yes", "no"], n, p=[0.3, 0.7]),
        "score_yes": rng.beta(2, 5, n),
        "status": rng.choice(["ok", "timeout", "error", "rejected"], n, p=[0.97, 0.01, 0.01, 0.01]),
        "latency_ms": rng.lognormal(3, 0.4, n),
        "stage.model": rng.lognormal(2.5, 0.4, n),
        "stage.parse": np.zeros(n),
        "cache_hit": rng.random(n) < 0.6,
        "queue_depth": rng.poisson(4, n).astype(float),
        "cache_version": ["v1"] * n,
        "replica": rng.choice(["r0", "r1", "r2", "r3"], n),
    }
    cols.update(shift)
    return requests(n, **cols)


@pytest.fixture(scope="session")
def reference_profile() -> Profile:
    from monitor.aggregate.profile import build_profile

    return build_profile(healthy(5000, np.random.default_rng(12345)), SCHEMA)


@pytest.fixture(scope="session")
def trailing() -> Partial:
    """A healthy trailing baseline of 5000 rows."""
    return to_window(healthy(5000, np.random.default_rng(777)), SCHEMA)


@pytest.fixture
def sample() -> Callable[..., pd.DataFrame]:
    return healthy


@pytest.fixture
def schema() -> Schema:
    return SCHEMA
