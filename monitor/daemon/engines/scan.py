"""A scan: fold a Parquet dataset with the configured engine, store its partials, score its windows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from monitor.aggregate.profile import stored_profile
from monitor.config import Config, Engine, Service
from monitor.daemon.engines import local
from monitor.daemon.engines.local import Scan, ScanResult, store_partials
from monitor.ingest.sources.batch import Observer
from monitor.verdicts.stage import load_anchors
from monitor.verdicts.windows import Scored, floor_to, score, store_scored
from storage.store import Store


@dataclass(frozen=True)
class ScanReport:
    """What a scan folded and found."""

    result: ScanResult
    scored: list[Scored]
    findings: int  # findings written


def fold_dataset(dataset: str, scan: Scan, engine: Engine, client=None,
                 storage_options: dict | None = None, observe: Observer | None = None) -> ScanResult:
    """The dataset's merged partials from the engine `engine.kind` (dask: on `client`, or on the cluster
    `engine` names, or on a LocalCluster started and closed here); `observe`: rows folded, rows to fold."""
    if engine.kind == "local":
        return local.scan(dataset, scan, engine.partition_rows, storage_options, observe)
    from monitor.daemon.engines import dask as dask_engine

    if client is not None:
        return dask_engine.scan(dataset, scan, client, engine.partition_rows, storage_options, observe)
    with dask_engine.client_for(engine.scheduler, engine.n_workers) as own:
        return dask_engine.scan(dataset, scan, own, engine.partition_rows, storage_options, observe)


def run_scan(config: Config, service: Service, store: Store, dataset: str, now: datetime,
             since: datetime | None = None, until: datetime | None = None, engine: Engine | None = None,
             client=None, storage_options: dict | None = None, observe: Observer | None = None) -> ScanReport:
    """Fold `dataset` (rows with ts in [since, until)), add its partials to the store, and score and store
    every closed window of each configured length that its partials fall in. `observe` is told the rows
    folded and the rows to fold as the engine goes."""
    engine = engine or config.engine
    profile, _ = stored_profile(store, service)
    timed = local.dataset_timed(local.open_dataset(dataset, storage_options))
    scan = Scan.of(service, config.limits, profile, now, timed, since, until)
    result = fold_dataset(dataset, scan, engine, client, storage_options, observe)
    store_partials(store, service.name, result.partials)
    scored: list[Scored] = []
    if result.partials:
        first = min(p.bucket_start for p in result.partials)
        last = max(p.bucket_start for p in result.partials) + service.buckets.size
        scored = score(store, service.name, profile,
                       [w for size in service.buckets.windows for w in windows_between(first, last, size, now)],
                       anchors=load_anchors(service, store))
    return ScanReport(result, scored, store_scored(store, service.name, scored, None))


def windows_between(first: datetime, last: datetime, size: timedelta, now: datetime) -> list[tuple[datetime, datetime]]:
    """The closed windows (ending by `now`) of length `size` that overlap [first, last)."""
    out = []
    start = floor_to(first, size)
    while start < last and start + size <= now:
        out.append((start, start + size))
        start += size
    return out
