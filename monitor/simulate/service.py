"""The serving path of one replica: admission against a bounded queue, a micro-batcher with maximum
batch size and maximum wait, and a single model executor. Times are float milliseconds.

A batch of n requests runs for `EXEC_FIXED_MS + sum(EXEC_PER_ITEM_MS + EXEC_PER_CHAR_MS * tokens)`
(times one noise factor per batch). A request's `model` time is its share of that run: the fixed cost
split evenly, plus its own per-item and per-character cost (the shares sum to the run time). The rest
of the run -- the compute spent on its batch-mates -- is counted in `batch_wait`, with the wait for the
batch to form and for the executor to be free, so the stages still sum to the latency. Larger batches
thus cost each request a little less model time and more batch wait.

The batcher is sequential by nature; `run_replica` is one tight pass over the requests in the order
they become ready (after parse and preprocess), carrying only `ReplicaState` across chunks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

MAX_QUEUE = 32  # requests admitted but not yet executing, per replica
DEADLINE_MS = 150.0
REPLICAS = 4


EXEC_FIXED_MS = 2.5  # per batch: kernel launches, weights through the caches
EXEC_PER_ITEM_MS = 0.35
EXEC_PER_CHAR_MS = 0.004  # per character of `notes` after truncation


def exec_ms(n: int, tokens: float, noise: float) -> float:
    """Model execution time of one batch of `n` requests with `tokens` characters after truncation."""
    return (EXEC_FIXED_MS + EXEC_PER_ITEM_MS * n + EXEC_PER_CHAR_MS * tokens) * noise


@dataclass
class ReplicaState:
    free_at: float = -1e18  # when the executor finishes its last batch
    pending: deque = field(default_factory=deque)  # [start_ms, size] of dispatched, not yet started batches
    queued: int = 0  # sum of sizes in `pending`


def run_replica(ready: list[float], hit: list[bool], tokens: list[float], noise: list[float],
                onset_ms: float, end_ms: float, cfg_before: tuple[int, float], cfg_after: tuple[int, float],
                state: ReplicaState):
    """Returns per-request lists (batch start, batch run time, the request's share of it, batch size,
    queue depth, rejected), in input order. The `after` config is in force from `onset_ms` until `end_ms`
    (the fault's end; infinity when it lasts). Cache hits are not batched but still see (and record) the queue depth. A batch open at the
    end of the chunk is dispatched when its wait runs out (a chunk-boundary approximation)."""
    n = len(ready)
    bstart = [0.0] * n
    bexec = [0.0] * n
    bshare = [0.0] * n
    bsize = [0] * n
    depth = [0] * n
    rejected = [False] * n
    pending = state.pending
    queued = state.queued
    free_at = state.free_at
    cur: list[int] = []
    cur_tok = 0.0
    cur_close = 0.0
    max_batch = cfg_before[0]

    def dispatch(close: float) -> None:
        nonlocal free_at, queued, cur, cur_tok
        start = close if close > free_at else free_at
        size = len(cur)
        f = noise[cur[0]]
        ex = exec_ms(size, cur_tok, f)
        free_at = start + ex
        pending.append((start, size))
        queued += size
        fixed = EXEC_FIXED_MS / size + EXEC_PER_ITEM_MS
        for j in cur:
            bstart[j] = start
            bexec[j] = ex
            bshare[j] = (fixed + EXEC_PER_CHAR_MS * tokens[j]) * f
            bsize[j] = size
        cur = []
        cur_tok = 0.0

    for k in range(n):
        t = ready[k]
        if cur and t > cur_close:
            dispatch(cur_close)
        while pending and pending[0][0] <= t:
            queued -= pending.popleft()[1]
        d = queued + len(cur)
        depth[k] = d
        if hit[k]:
            continue
        if d >= MAX_QUEUE:
            rejected[k] = True
            continue
        if not cur:
            max_batch, wait = cfg_after if onset_ms <= t < end_ms else cfg_before
            cur_close = t + wait
        cur.append(k)
        cur_tok += tokens[k]
        if len(cur) >= max_batch:
            dispatch(t)
    if cur:
        dispatch(cur_close)
    state.free_at = free_at
    state.queued = queued
    return bstart, bexec, bshare, bsize, depth, rejected


def serve_chunk(ready: np.ndarray, replica: np.ndarray, hit: np.ndarray, served: np.ndarray,
                tokens: np.ndarray, noise: np.ndarray, onset_ms: float, end_ms: float,
                cfg_before: tuple[int, float], cfg_after: tuple[int, float], states: list[ReplicaState]):
    """Run every replica over its requests. `served` marks requests that reach the batcher stage
    (not errors). Returns arrays aligned with the input: batch_wait, model (the request's share of its
    batch's run), batch_size, queue_depth, rejected."""
    n = len(ready)
    batch_wait = np.zeros(n)
    model = np.zeros(n)
    bsize = np.zeros(n, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    rejected = np.zeros(n, dtype=bool)
    for r in range(len(states)):
        idx = np.flatnonzero((replica == r) & served)
        idx = idx[np.argsort(ready[idx], kind="stable")]
        bs, be, sh, sz, dp, rj = run_replica(ready[idx].tolist(), hit[idx].tolist(), tokens[idx].tolist(),
                                             noise[idx].tolist(), onset_ms, end_ms, cfg_before, cfg_after, states[r])
        bs, be, sh, sz = np.asarray(bs), np.asarray(be), np.asarray(sh), np.asarray(sz, dtype=np.int64)
        h = hit[idx]
        # waiting for the batch to form and the executor, then for the batch-mates' share of the run
        batch_wait[idx] = np.where(h, 0.0, np.maximum(bs - ready[idx], 0.0) + np.maximum(be - sh, 0.0))
        model[idx] = np.where(h, 0.0, sh)
        bsize[idx] = np.where(h, 0, sz)  # cache hits skip the batcher
        depth[idx] = dp
        rejected[idx] = rj
    return batch_wait, model, bsize, depth, rejected
