"""The Dask engine: the chunk function of the local engine, run per piece of a Parquet dataset.

The client plans pieces from the files' footers (`local.plan`: row groups of one or more files, at
most `partition_rows` rows each) and builds a `dask.dataframe` with `from_map`: each task opens its
files on the worker (local path or fsspec URL), reads only its row groups and the columns a chunk uses,
validates, joins and folds them, and returns only its serialized partials (kilobytes per piece, never
rows); the client gathers them, merges them by key with `monitor.aggregate.partial.merge_all` and stores them
through `Store.partials.upsert` like the runner does.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pandas as pd

from monitor.daemon.engines.local import (
    DEFAULT_PARTITION_ROWS,
    ChunkResult,
    Piece,
    Scan,
    ScanResult,
    filesystem,
    fold_piece,
    merge_rows,
    open_dataset,
    scan_plan,
    stage_columns,
)
from monitor.ingest.sources.batch import Observer
from storage.rows import PartialRow

PARTIAL, COUNTS = "partial", "counts"  # the two kinds of result row: one partial, or a partition's counts
RESULT_COLUMNS = ("kind", "model_version", "bucket_start", "bucket_seconds", "segment", "rows", "payload")


def result_meta() -> pd.DataFrame:
    """The (empty) frame each partition returns: one row per partial plus one row of counts."""
    return pd.DataFrame({
        "kind": pd.Series([], dtype=object), "model_version": pd.Series([], dtype=object),
        "bucket_start": pd.Series([], dtype="datetime64[us, UTC]"), "bucket_seconds": pd.Series([], dtype="int64"),
        "segment": pd.Series([], dtype=object), "rows": pd.Series([], dtype="int64"),
        "payload": pd.Series([], dtype=object),
    })


def piece_partials(piece: Piece, fs, scan: Scan, fields: list[str], partition_rows: int) -> pd.DataFrame:
    """One piece's partials (merged by key) and counts, as a `result_meta()` frame: read on the worker
    (its row groups and `fields` columns only) and folded `partition_rows` rows at a time."""
    result, _ = fold_piece(fs, piece, scan, fields, partition_rows, where=f"piece-{piece.parts[0].path}")
    return to_frame(result.partials, result.counts + Counter(read=0))


def to_frame(partials: list[PartialRow], counts: Counter) -> pd.DataFrame:
    """Partials and counts as one small frame (the form a partition's result crosses the network in)."""
    rows = [(PARTIAL, p.model_version, pd.Timestamp(p.bucket_start), p.bucket_seconds, p.segment, p.rows,
             p.payload) for p in partials]
    rows.append((COUNTS, "", pd.NaT, 0, "", 0, json.dumps(dict(counts), sort_keys=True).encode()))
    frame = pd.DataFrame(rows, columns=list(RESULT_COLUMNS))
    frame["bucket_start"] = pd.to_datetime(frame["bucket_start"], utc=True)  # naive when all NaT
    return frame.astype(result_meta().dtypes.to_dict())


def from_frame(frame: pd.DataFrame) -> ChunkResult:
    """The partials and summed counts of gathered partition frames."""
    partials = frame[frame["kind"] == PARTIAL]
    counts: Counter = Counter()
    for payload in frame.loc[frame["kind"] == COUNTS, "payload"]:
        counts.update(json.loads(payload))
    rows = [PartialRow(v, ts.to_pydatetime(), int(s), seg, int(n), bytes(p)) for v, ts, s, seg, n, p in zip(
        partials["model_version"], partials["bucket_start"], partials["bucket_seconds"], partials["segment"],
        partials["rows"], partials["payload"], strict=True)]
    return ChunkResult(rows, +counts)


@contextmanager
def client_for(scheduler: str | None, n_workers: int) -> Iterator:
    """A Dask client on the cluster at `scheduler`, or on a LocalCluster of `n_workers` single-threaded
    worker processes that is closed on exit."""
    from distributed import Client, LocalCluster

    if scheduler:
        with Client(scheduler) as client:
            yield client
        return
    # One thread per process: fold is numpy-bound and holds the GIL between calls.
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        yield client


def scan(dataset: str, scan: Scan, client, partition_rows: int = DEFAULT_PARTITION_ROWS,
         storage_options: dict | None = None, observe: Observer | None = None) -> ScanResult:
    """Fold the dataset piece by piece on `client`'s cluster; partials gathered, merged by key.

    The pieces are planned here from the files' footers (`local.plan`: row groups of one or more files,
    at most `partition_rows` rows each), so a task's memory is bounded by `partition_rows` whatever the
    file layout; `dd.read_parquet` would make a task of each file or row group, however large.
    `observe` is told the rows to fold before and the rows folded after (the cluster folds them at once).
    """
    import dask
    import dask.dataframe as dd

    started = time.perf_counter()
    data = open_dataset(dataset, storage_options)
    if scan.timed != bool(stage_columns(data.schema.names)):
        raise ValueError(f"scan.timed={scan.timed} but the dataset {'lacks' if scan.timed else 'has'} stage columns")
    fs, _ = filesystem(dataset, storage_options)
    pieces, columns = scan_plan(dataset, scan, partition_rows, storage_options)
    if not pieces:
        return ScanResult([], Counter(), 0, 0, time.perf_counter() - started)
    total = sum(piece.rows for piece in pieces)
    if observe is not None:
        observe(0, total)
    # Payloads are bytes: dask's default conversion of object columns to Arrow strings would decode them.
    with dask.config.set({"dataframe.convert-string": False}):
        parts = dd.from_map(piece_partials, pieces, fs=fs, scan=scan, fields=columns,
                            partition_rows=partition_rows, meta=result_meta(), enforce_metadata=False,
                            label="tailwatch-fold")
        frame = client.compute(parts).result()
    if observe is not None:
        observe(total, total)
    gathered = int(sum(len(p) for p in frame["payload"]))
    result = from_frame(frame)
    return ScanResult(merge_rows(result.partials), result.counts, len(pieces), gathered,
                      time.perf_counter() - started)

