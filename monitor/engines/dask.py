"""The Dask engine: the chunk function of the local engine, run per partition of a Parquet dataset.

`dask.dataframe.read_parquet` reads the dataset (local path or fsspec URL) on the workers;
`map_partitions` validates, joins and folds each partition where it was read and returns only its
serialized partials (kilobytes per partition, never rows); the client gathers them, merges them by key
with `monitor.partials.merge_all` and stores them through `Store.upsert_partials` like the runner does.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pandas as pd
import pyarrow as pa

from monitor.engines.local import (
    DEFAULT_PARTITION_ROWS,
    ChunkResult,
    Scan,
    ScanResult,
    chunk_partials,
    merge_rows,
    partition_filters,
    stage_columns,
)
from storage.store import PartialRow

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


def partition_partials(frame: pd.DataFrame, scan: Scan, partition_rows: int = DEFAULT_PARTITION_ROWS,
                       partition_info: dict | None = None) -> pd.DataFrame:
    """One partition's rows -> its partials (merged by key) and counts, as a `result_meta()` frame.

    The partition is folded `partition_rows` rows at a time, so a worker's peak memory does not grow
    with a partition larger than planned.
    """
    where = f"partition-{partition_info['number']}" if partition_info else "partition"
    table = pa.Table.from_pandas(frame, preserve_index=False)
    del frame
    results = [chunk_partials(table.slice(a, partition_rows), scan, where)
               for a in range(0, table.num_rows, partition_rows)]
    return to_frame(merge_rows(r for res in results for r in res.partials),
                    sum((res.counts for res in results), Counter(read=0)))


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
         storage_options: dict | None = None) -> ScanResult:
    """Fold the dataset per partition on `client`'s cluster; partials gathered, merged by key."""
    import dask.dataframe as dd

    started = time.perf_counter()
    ddf = dd.read_parquet(dataset, storage_options=storage_options,
                          filters=partition_filters(_partition_columns(dataset, storage_options), scan.since, scan.until))
    if scan.timed != bool(stage_columns(ddf.columns)):
        raise ValueError(f"scan.timed={scan.timed} but the dataset {'lacks' if scan.timed else 'has'} stage columns")
    parts = ddf.map_partitions(partition_partials, scan, partition_rows, meta=result_meta(), enforce_metadata=False)
    frame = client.compute(parts).result()
    gathered = int(sum(len(p) for p in frame["payload"]))
    result = from_frame(frame)
    return ScanResult(merge_rows(result.partials), result.counts, ddf.npartitions, gathered,
                      time.perf_counter() - started)


def _partition_columns(dataset: str, storage_options: dict | None) -> list[str]:
    from monitor.engines.local import open_dataset

    partitioning = open_dataset(dataset, storage_options).partitioning
    return list(partitioning.schema.names) if partitioning is not None else []

