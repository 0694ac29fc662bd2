"""The engines against the runner: one simulated scenario ticked by the runner from its JSONL logs, and
the same rows (joined, as a Parquet dataset partitioned by hour) folded by the local engine and by the
Dask engine on a LocalCluster of two worker processes. Partials and findings must agree: exact counts
and histograms, sketches with the same bins, every finding's status and n equal.

About 20 s on two shared cores (most of it the cluster's start and the runner's tick).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pandas as pd
import pytest

from monitor.aggregate.partial import Partial
from monitor.aggregate.sketch import RELATIVE_ACCURACY
from monitor.config import Engine
from monitor.daemon.engines.local import Scan, dataset_timed, open_dataset
from monitor.daemon.engines.scan import fold_dataset, run_scan, windows_between
from monitor.verdicts.windows import score
from storage.store import Store

PARTITION_ROWS = 3_000  # several slices per hourly partition: partials of one bucket merge across slices


def engine_store(world: dict, kind: str, client=None) -> tuple[Store, object]:
    config = world["config"]
    store = Store(f"sqlite:///{world['root'] / f'{kind}.db'}")
    store.upgrade()
    report = run_scan(config, config.services[0], store, world["dataset"], world["now"],
                      engine=Engine(kind=kind, partition_rows=PARTITION_ROWS), client=client)
    return store, report


def stored(store: Store) -> dict:
    with store.transaction() as session:
        rows = store.partials.load(session, "churn", pd.Timestamp("2000-01-01", tz="UTC"),
                                   pd.Timestamp("2100-01-01", tz="UTC"))
    return {(r.model_version, r.bucket_start, r.bucket_seconds, r.segment): (r.rows, Partial.from_bytes(r.payload))
            for r in rows}


def assert_same_partial(a: Partial, b: Partial) -> None:
    assert a.counts == b.counts, {k: (a.counts[k], b.counts[k]) for k in a.counts.keys() | b.counts.keys()
                                  if a.counts[k] != b.counts[k]}
    assert a.hists == b.hists
    assert a.unseen == b.unseen
    assert a.profile == b.profile
    assert a.sketches.keys() == b.sketches.keys()
    for name, sa in a.sketches.items():
        sb = b.sketches[name]
        assert (sa.pos, sa.neg, sa.zero, sa.count, sa.min, sa.max) == (sb.pos, sb.neg, sb.zero, sb.count, sb.min, sb.max)
        # Sums differ only by float rounding: the engines add the same values in another order.
        assert sa.sum == pytest.approx(sb.sum, rel=1e-9) and sa.sumsq == pytest.approx(sb.sumsq, rel=1e-9)


def all_findings(store: Store, world: dict) -> dict:
    service = world["config"].services[0]
    keys = stored(store)
    first = min(k[1] for k in keys)
    last = max(k[1] for k in keys) + service.buckets.size
    from monitor.aggregate.profile import stored_profile

    profile, _ = stored_profile(store, service)
    out = {}
    for size in service.buckets.windows:
        for s in score(store, "churn", profile, windows_between(first, last, size, world["now"])):
            for f in s.findings:
                key = (s.start, s.end, s.model_version, f.check, tuple(sorted(f.labels.items())))
                assert key not in out
                out[key] = f
    return out


def assert_same_findings(expected: dict, got: dict) -> None:
    assert expected.keys() == got.keys()
    for key, f in expected.items():
        g = got[key]
        assert (f.status, f.n) == (g.status, g.n), key
        # Quantiles come from sketches with equal bins, so they are equal; the bound is the sketch's error.
        rel = RELATIVE_ACCURACY if f.check == "latency" else 1e-9
        for a, b in ((f.value, g.value), (f.baseline, g.baseline)):
            assert (a is None) == (b is None), key
            if a is not None:
                assert a == pytest.approx(b, rel=rel, abs=1e-12), key


def test_dataset_holds_every_row(world):
    assert world["folded"] == world["rows"] > 8_000
    assert dataset_timed(open_dataset(world["dataset"]))


def test_local_engine_matches_runner(world):
    store, report = engine_store(world, "local")
    try:
        assert report.result.counts["folded"] == world["folded"]
        assert report.result.chunks > 3
        expected, got = stored(world["runner"]), stored(store)
        assert expected.keys() == got.keys()
        for key, (rows, partial) in expected.items():
            assert got[key][0] == rows
            assert_same_partial(partial, got[key][1])
    finally:
        store.dispose()


def test_dask_engine_matches_runner_findings(world, cluster_client):
    store, report = engine_store(world, "dask", cluster_client)
    try:
        assert set(cluster_client.scheduler_info()["workers"]) and len(cluster_client.scheduler_info()["workers"]) == 2
        result = report.result
        assert result.chunks >= 2  # hourly partitions, folded on the workers
        assert result.counts["folded"] == world["folded"] == result.counts["joined"]
        # What crossed the network: serialized partials, a few KB each, far below the rows' size.
        assert 0 < result.gathered_bytes / len(result.partials) < 64 * 1024
        expected, got = stored(world["runner"]), stored(store)
        assert expected.keys() == got.keys()
        for key, (rows, partial) in expected.items():
            assert got[key][0] == rows
            assert_same_partial(partial, got[key][1])
        want, have = all_findings(world["runner"], world), all_findings(store, world)
        assert_same_findings(want, have)
        statuses = Counter(f.status for f in have.values())
        assert statuses["breach"] > 0 and statuses["ok"] > 0, statuses  # the comparison is not vacuous
        assert report.findings == len([f for s in report.scored for f in s.findings]) > 0
    finally:
        store.dispose()


def test_scan_filters_time_range(world, cluster_client):
    """since/until skip whole hour partitions and the rows outside; both engines fold the same rows."""
    config, service = world["config"], world["config"].services[0]
    start = min(k[1] for k in stored(world["runner"]))
    since, until = start + timedelta(minutes=35), start + timedelta(minutes=95)
    scan = Scan.of(service, config.limits, None, world["now"], True, since, until)
    local = fold_dataset(world["dataset"], scan, Engine(kind="local", partition_rows=PARTITION_ROWS))
    dask = fold_dataset(world["dataset"], scan, Engine(kind="dask", partition_rows=PARTITION_ROWS), cluster_client)
    assert local.counts == dask.counts
    assert 0 < local.counts["folded"] < world["rows"]
    assert all(since <= p.bucket_start < until for p in local.partials)
    assert [(p.model_version, p.bucket_start, p.segment, p.rows) for p in local.partials] == \
        [(p.model_version, p.bucket_start, p.segment, p.rows) for p in dask.partials]
