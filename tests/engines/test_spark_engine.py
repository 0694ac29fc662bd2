"""The chunk function under Spark's mapInPandas (local[2]) against the local engine, on the same dataset.

Slow: a Spark session takes 15-45 s to start on the shared machine; about 35 s in all when it is quiet.
Needs `pip install 'tailwatch[spark]'` and Java 17; skipped without them.
"""

from __future__ import annotations

import shutil
import sys

import pytest

from monitor.aggregate.partial import Partial
from monitor.config import Engine
from monitor.daemon.engines.local import Scan
from monitor.daemon.engines.scan import fold_dataset

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("no Java runtime for Spark")
    from pyspark.sql import SparkSession

    mp = pytest.MonkeyPatch()
    mp.setenv("PYSPARK_PYTHON", sys.executable)  # executors import tailwatch from this environment
    session = (SparkSession.builder.master("local[2]").appName("tailwatch-test")
               .config("spark.sql.session.timeZone", "UTC").config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.local.dir", str(tmp_path_factory.mktemp("spark"))).getOrCreate())
    yield session
    session.stop()
    mp.undo()


def test_spark_partials_equal_local_engine(world, spark):
    from monitor.daemon.engines.spark import fold_spark

    config = world["config"]
    service = config.services[0]
    scan = Scan.of(service, config.limits, None, world["now"], timed=True)
    expected = fold_dataset(world["dataset"], scan, Engine(kind="local", partition_rows=3_000))
    got = fold_spark(spark.read.parquet(world["dataset"]), scan, partition_rows=3_000)
    assert got.counts == expected.counts and got.counts["folded"] == world["rows"]
    assert [(p.model_version, p.bucket_start, p.segment, p.rows) for p in got.partials] == \
        [(p.model_version, p.bucket_start, p.segment, p.rows) for p in expected.partials]
    for a, b in zip(expected.partials, got.partials, strict=True):
        pa_, pb = Partial.from_bytes(a.payload), Partial.from_bytes(b.payload)
        assert pa_.counts == pb.counts and pa_.hists == pb.hists
        assert {k: (s.pos, s.count) for k, s in pa_.sketches.items()} == {k: (s.pos, s.count) for k, s in pb.sketches.items()}


def test_spark_needs_a_utc_session(world, spark):
    from monitor.daemon.engines.spark import fold_spark

    config = world["config"]
    scan = Scan.of(config.services[0], config.limits, None, world["now"], timed=True)
    spark.conf.set("spark.sql.session.timeZone", "Europe/Paris")
    try:
        with pytest.raises(ValueError, match="UTC"):
            fold_spark(spark.read.parquet(world["dataset"]), scan)
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
