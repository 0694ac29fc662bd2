"""Stored partial payloads stay byte-identical: a fixed frame folds, merges and encodes to golden bytes."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import numpy as np
import pandas as pd

from monitor.aggregate.fold import fold
from monitor.aggregate.partial import Partial, merge_all, merge_bytes
from monitor.aggregate.profile import build_profile
from monitor.schema import Schema

T0 = pd.Timestamp("2026-03-01T00:00:00Z")
SCHEMA = Schema(features={"x": "numeric", "c": "categorical", "t": "text"}, signals=["queue_depth"],
                classes=["yes", "no"], segments=["region"])


def _frame(n: int = 3000) -> tuple[pd.DataFrame, object]:
    rng = np.random.default_rng(7)
    profile = build_profile(pd.DataFrame({
        "x": rng.normal(50, 20, 500), "c": rng.choice(["a", "b", "c"], 500),
        "t": rng.choice(["the cat sat", "a dog ran far away", "", "hello world"], 500),
        "prediction": rng.choice(["yes", "no"], 500), "score_yes": rng.random(500),
        "input_tokens": rng.integers(1, 800, 500)}), SCHEMA)
    latency = np.where(rng.random(n) < 0.9, rng.lognormal(4, 0.5, n), rng.lognormal(6, 0.8, n))
    latency[::97] = np.nan
    frame = pd.DataFrame({
        "request_id": [f"r{i}" for i in range(n)],
        "ts": T0 + pd.to_timedelta(np.sort(rng.uniform(0, 1800, n)), unit="s"),
        "model_version": rng.choice(["v1", "v2"], n),
        "status": rng.choice(["ok", "ok", "ok", "error", "timeout", "rejected"], n),
        "joined": rng.random(n) < 0.95, "stage_rows": rng.integers(0, 3, n),
        "latency_ms": latency, "stage.model": latency * 0.7, "stage.queue": np.where(rng.random(n) < 0.5, 0.0, 3.5),
        "ttft_ms": latency * 0.2, "input_tokens": rng.integers(1, 900, n), "output_tokens": rng.integers(0, 300, n),
        "cache_hit": rng.choice(np.array([True, False, None], dtype=object), n),
        "cache_version": rng.choice(np.array(["v1", "v0", None], dtype=object), n),
        "cache_state": rng.choice(["cold", "warm"], n), "replica": rng.choice(["r0", "r1", "r2"], n),
        "route": rng.choice(["fast", "slow"], n), "queue_depth": np.where(rng.random(n) < 0.1, np.nan,
                                                                         rng.integers(0, 40, n).astype(float)),
        "x": np.where(rng.random(n) < 0.05, np.nan, rng.normal(55, 30, n)),
        "c": rng.choice(np.array(["a", "b", "c", "zz", "yy", None], dtype=object), n),
        "t": rng.choice(np.array(["the cat sat", "unknown words here", "", None, "a dog ran"], dtype=object), n),
        "prediction": rng.choice(["yes", "no", "maybe"], n), "score_yes": rng.random(n),
        "region": rng.choice(np.array(["eu", "us", None], dtype=object), n),
    })
    return frame, profile


def _digest(rows) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(f"{r.model_version}|{r.bucket_start.isoformat()}|{r.bucket_seconds}|{r.segment}|{r.rows}|".encode())
        h.update(r.payload)
    return h.hexdigest()


def test_fold_writes_the_golden_payload_bytes():
    frame, profile = _frame()
    rows = fold(frame, timedelta(minutes=5), ["region"], timed=True, schema=SCHEMA, profile=profile)
    assert len(rows) == 2 * 6 * 4
    assert _digest(rows) == GOLDEN_FOLD


def test_decoded_and_merged_partials_encode_to_the_golden_bytes():
    frame, profile = _frame()
    rows = fold(frame, timedelta(minutes=5), ["region"], timed=True, schema=SCHEMA, profile=profile)
    # Partial.to_bytes of a decoded fold payload writes the very bytes the fold wrote.
    assert all(Partial.from_bytes(r.payload).to_bytes() == r.payload for r in rows)
    merged = merge_all(Partial.from_bytes(r.payload) for r in rows)
    assert hashlib.sha256(merged.to_bytes()).hexdigest() == GOLDEN_MERGED
    pair = merge_bytes(rows[0].payload, rows[1].payload)
    assert hashlib.sha256(pair).hexdigest() == GOLDEN_PAIR
    big = Partial(merged.counts + type(merged.counts)({"rows": 2**70}), merged.hists, merged.sketches,
                  merged.unseen, merged.profile)
    assert hashlib.sha256(big.to_bytes()).hexdigest() == GOLDEN_JSON  # past 64 bits: the JSON form


GOLDEN_FOLD = "63c6fcdea099ac676d55d9785703f88560657c35be90d971e56a7ef7ff9adbfd"
GOLDEN_MERGED = "25b24eebfec958949eec21c33fb8a554a771fecf175ca731c676be04b17f30a6"
GOLDEN_PAIR = "44752cef09ea0574590d2ac20cc08b4cc00f966ca582e7ebfc380121fcb3147d"
GOLDEN_JSON = "694d6a53dedf90af91c6e1b6a0e86c0e14efeb94b4934c27a63709ce21c5529e"
