"""The chunk function on Spark: `mapInPandas` over a DataFrame of joined prediction rows, returning
serialized partials (the Dask engine's result frame), collected and merged on the driver.

    spark = SparkSession.builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()
    rows = spark.read.parquet("s3a://bucket/predictions_joined/")
    result = fold_spark(rows, scan)        # merged PartialRows and counts
    store_partials(store, scan.service, result.partials)

Needs `pip install 'tailwatch[spark]'`, Java 17, and executors running a Python with tailwatch
(`PYSPARK_PYTHON`); tested on `local[2]` only (tests/engines/test_spark_engine.py). Spark hands `mapInPandas` its rows in Arrow
batches (`spark.sql.execution.arrow.maxRecordsPerBatch`, 10,000 by default); they are folded
`partition_rows` at a time, merged per Spark partition, and only the partials leave the executor.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pandas as pd
import pyarrow as pa

from monitor.aggregate.keys import STAGE_PREFIX
from monitor.daemon.engines.dask import from_frame, to_frame
from monitor.daemon.engines.local import DEFAULT_PARTITION_ROWS, Scan, ScanResult, chunk_partials, merge_rows

# Spark reads a dot in a column name as a struct field: stage columns travel as `stage__<name>`.
SPARK_STAGE_PREFIX = "stage__"
RESULT_SCHEMA = ("kind string, model_version string, bucket_start timestamp, bucket_seconds long, "
                 "segment string, rows long, payload binary")


def fold_batches(scan: Scan, partition_rows: int = DEFAULT_PARTITION_ROWS):
    """The `mapInPandas` function: a Spark partition's pandas batches -> one frame of its merged partials
    and counts (the schema RESULT_SCHEMA)."""

    def fold(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        partials, counts, pending, size = [], Counter(read=0), [], 0

        def flush() -> None:
            nonlocal pending, size
            if pending:
                result = chunk_partials(pa.concat_tables(pending, promote_options="permissive"), scan, "spark")
                partials.extend(result.partials)
                counts.update(result.counts)
            pending, size = [], 0

        for frame in batches:
            frame.columns = [STAGE_PREFIX + c.removeprefix(SPARK_STAGE_PREFIX) if c.startswith(SPARK_STAGE_PREFIX)
                             else c for c in frame.columns]
            pending.append(pa.Table.from_pandas(frame, preserve_index=False))
            size += len(frame)
            if size >= partition_rows:
                flush()
        flush()
        out = to_frame(merge_rows(partials), counts)
        # Spark takes naive timestamps in the session time zone: UTC, as the docs require.
        out["bucket_start"] = out["bucket_start"].dt.tz_localize(None)
        yield out

    return fold


def fold_spark(rows, scan: Scan, partition_rows: int = DEFAULT_PARTITION_ROWS) -> ScanResult:
    """Fold a Spark DataFrame of joined prediction rows on its executors; partials merged on the driver."""
    started = time.perf_counter()
    if rows.sparkSession.conf.get("spark.sql.session.timeZone") != "UTC":
        raise ValueError("set spark.sql.session.timeZone to UTC: bucket starts are UTC")
    rows = rows.toDF(*[SPARK_STAGE_PREFIX + c.removeprefix(STAGE_PREFIX) if c.startswith(STAGE_PREFIX) else c
                        for c in rows.columns])
    collected = rows.mapInPandas(fold_batches(scan, partition_rows), schema=RESULT_SCHEMA).toPandas()
    collected["bucket_start"] = pd.to_datetime(collected["bucket_start"]).dt.tz_localize("UTC")
    result = from_frame(collected)
    gathered = int(sum(len(p) for p in collected["payload"]))
    return ScanResult(merge_rows(result.partials), result.counts, rows.rdd.getNumPartitions(), gathered,
                      time.perf_counter() - started)
