"""The local engine, and the chunk function every engine runs: joined prediction rows -> bucket partials.

Input layout (docs/scale.md): a Parquet dataset (a file, or a directory of files, hive-partitioned or
not; a local path or an fsspec URL) of prediction rows, each with its stage timings already joined as
`stage.<name>` columns (ms; null: no timing of that stage), the wide form `monitor.ingest.frame.join` gives.
A chunk goes through the runner's own steps: contract validation (`monitor.ingest.validate`), the join
(`monitor.ingest.frame.join`, which derives `joined` / `stage_rows` and drops repeated request_ids), and
`monitor.aggregate.fold.fold`.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from monitor.aggregate.fold import fold
from monitor.aggregate.partial import Partial, merge_all, merge_bytes
from monitor.aggregate.profile import Profile
from monitor.config import Limits, Service
from monitor.contract import RecordKind
from monitor.daemon.engines.dataset import HOUR_FORMAT, PARTITION
from monitor.ingest.frame import ARRIVED, STAGE_PREFIX, join
from monitor.ingest.sources.batch import LINE, Observer
from monitor.ingest.sources.tables import flag_oversize  # the same oversize rule as the file sources
from monitor.ingest.validate import field_kinds, validate
from monitor.memory import release_memory
from monitor.schema import Schema
from storage.rows import PartialRow
from storage.store import Store

DEFAULT_PARTITION_ROWS = 250_000  # rows folded at once; bounds a process's peak memory (bench/scale.py)
BATCH_ROWS = 65_536  # rows decoded at once from a file: a slice is assembled from batches this size


@dataclass(frozen=True)
class Scan:
    """What folding a chunk needs. Small and picklable: it travels to every worker.

    `timed`: the dataset has `stage.<name>` columns, so `joined` / `unmatched` are counted (as the runner
    does when a timing source is configured). `since` / `until`: only rows with ts in [since, until).
    """

    service: str
    schema: Schema
    limits: Limits
    bucket: timedelta
    profile: Profile | None
    now: datetime
    timed: bool
    since: datetime | None = None
    until: datetime | None = None
    deadline_ms: float | None = None  # the service's request deadline (Service.deadline)

    @classmethod
    def of(cls, service: Service, limits: Limits, profile: Profile | None, now: datetime, timed: bool,
           since: datetime | None = None, until: datetime | None = None) -> Scan:
        return cls(service.name, service.schema_, limits, service.buckets.size, profile, now, timed, since, until,
                   service.deadline_ms)


@dataclass(frozen=True)
class ChunkResult:
    """One chunk's partials (one per bucket, model version and segment) and its row counts."""

    partials: list[PartialRow]
    counts: Counter  # read, accepted, quarantined:<reason>, timings_quarantined:<reason>, joined, ...


@dataclass(frozen=True)
class ScanResult:
    """A whole scan: its merged partials, row counts, and what it cost."""

    partials: list[PartialRow]  # merged: one per (model_version, bucket_start, bucket_seconds, segment)
    counts: Counter
    chunks: int  # slices of at most partition_rows rows folded (local), or pieces folded as tasks (dask)
    gathered_bytes: int  # serialized partial payloads brought to this process before merging
    seconds: float  # wall time of read, fold, gather and merge


def stage_columns(names: Iterable[str]) -> list[str]:
    """The `stage.<name>` duration columns among a dataset's column names."""
    return [c for c in names if c.startswith(STAGE_PREFIX)]


def chunk_partials(table: pa.Table, scan: Scan, where: str = "chunk") -> ChunkResult:
    """Validate, join and fold one chunk of joined prediction rows (`where` names it in reject counts).

    Every row is folded with the timings it carries: nothing waits for a later chunk, as in a tick whose
    lateness has passed. Repeated request_ids are dropped within the chunk only.
    """
    counts: Counter = Counter(read=table.num_rows)
    if not table.num_rows:
        return ChunkResult([], counts)
    table = flag_oversize(table, scan.limits.max_field_chars)
    table = table.append_column(LINE, pa.array(np.arange(1, table.num_rows + 1, dtype=np.int64)))
    stages = stage_columns(table.column_names)
    predictions, rejects = validate(RecordKind.predictions, table.drop_columns(stages), where, scan.schema,
                                    scan.limits, scan.now)
    counts["accepted"] = len(predictions)
    counts.update(f"quarantined:{r.reason.value}" for r in rejects)
    timings = None
    if scan.timed:
        long = _long_timings(table, stages)
        timings, t_rejects = validate(RecordKind.timings, long, where, scan.schema, scan.limits, scan.now)
        counts.update(f"timings_quarantined:{r.reason.value}" for r in t_rejects)
        timings[ARRIVED] = pd.Timestamp(scan.now)
    del table
    predictions[ARRIVED] = pd.Timestamp(scan.now)
    # Lateness 0 at the scan's clock: every prediction leaves the join now, with or without timings.
    joined = join(predictions, timings, scan.now, timedelta(0))
    del predictions, timings
    counts["duplicates"] = joined.duplicates
    counts["duplicate_timings"] = joined.duplicate_timings
    counts["orphan_timings"] = len(joined.orphans)  # timings of rejected predictions
    ready = _in_range(joined.ready, scan.since, scan.until)
    counts["outside"] = len(joined.ready) - len(ready)
    counts["folded"] = len(ready)
    if scan.timed and len(ready):
        counts["joined"] = int(ready["joined"].sum())
        counts["unmatched"] = len(ready) - counts["joined"]
    partials = fold(ready, scan.bucket, scan.schema.segments, timed=scan.timed, schema=scan.schema,
                    profile=scan.profile, deadline_ms=scan.deadline_ms)
    return ChunkResult(partials, +counts)


def _long_timings(table: pa.Table, stages: list[str]) -> pa.Table:
    """The wide `stage.<name>` columns as timing rows (request_id, stage, duration_ms, LINE); a null
    duration means the request has no timing of that stage and gives no row."""
    parts = []
    if "request_id" in table.column_names:  # without it every prediction is rejected: no timing to join
        for column in stages:
            part = table.select(["request_id", column, LINE]).filter(pc.is_valid(table[column]))
            stage = pa.repeat(pa.scalar(column.removeprefix(STAGE_PREFIX), pa.string()), part.num_rows)
            parts.append(pa.table({"request_id": part["request_id"], "stage": stage,
                                   "duration_ms": part[column], LINE: part[LINE]}))
    if not parts:
        return pa.table({"request_id": pa.array([], pa.string()), "stage": pa.array([], pa.string()),
                         "duration_ms": pa.array([], pa.float64()), LINE: pa.array([], pa.int64())})
    return pa.concat_tables(parts, promote_options="permissive")


def _in_range(frame: pd.DataFrame, since: datetime | None, until: datetime | None) -> pd.DataFrame:
    if frame.empty or (since is None and until is None):
        return frame
    ts = frame["ts"]
    keep = np.ones(len(frame), dtype=bool)
    if since is not None:
        keep &= (ts >= pd.Timestamp(since)).to_numpy()
    if until is not None:
        keep &= (ts < pd.Timestamp(until)).to_numpy()
    return frame if keep.all() else frame[keep].reset_index(drop=True)


def merge_rows(rows: Iterable[PartialRow]) -> list[PartialRow]:
    """One partial per (model_version, bucket_start, bucket_seconds, segment): the merge of its rows."""
    groups: dict[tuple, list[PartialRow]] = defaultdict(list)
    for row in rows:
        groups[(row.model_version, row.bucket_start, row.bucket_seconds, row.segment)].append(row)
    out = []
    for (version, start, seconds, segment), same in sorted(groups.items()):
        payload = same[0].payload if len(same) == 1 else \
            merge_all(Partial.from_bytes(r.payload) for r in same).to_bytes()
        out.append(PartialRow(version, start, seconds, segment, sum(r.rows for r in same), payload))
    return out


def store_partials(store: Store, service: str, rows: list[PartialRow]) -> None:
    """Add the partials to the store with the runner's merge (a stored key is merged, not replaced)."""
    if rows:
        with store.transaction() as session:
            store.partials.upsert(session, service, rows, merge_bytes)


def open_dataset(dataset: str, storage_options: dict | None = None) -> ds.Dataset:
    """The Parquet dataset at a local path or fsspec URL (hive partitions become columns, as in Dask)."""
    fs, path = filesystem(dataset, storage_options)
    return ds.dataset(path, filesystem=fs, format="parquet", partitioning="hive")


def partition_filters(partition_columns: list[str], since: datetime | None,
                      until: datetime | None) -> list[tuple] | None:
    """Filters that skip whole `hour=` partitions outside [since, until) (the layout of
    `monitor.daemon.engines.dataset`); None when the dataset is not partitioned so, or the scan is unbounded."""
    if PARTITION not in partition_columns or (since is None and until is None):
        return None
    out = []
    if since is not None:
        out.append((PARTITION, ">=", f"{since.astimezone(UTC):{HOUR_FORMAT}}"))
    if until is not None:
        out.append((PARTITION, "<=", f"{(until - timedelta(microseconds=1)).astimezone(UTC):{HOUR_FORMAT}}"))
    return out


@dataclass(frozen=True)
class Part:
    """Some row groups of one Parquet file (`path` as its fsspec filesystem names it) and the file's
    hive partition values, which become columns as in Dask."""

    path: str
    row_groups: tuple[int, ...]
    keys: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Piece:
    """One unit of work: row groups of one or more files, `rows` rows in all, at most the planned
    `partition_rows` unless a single row group is larger (it is then read in slices)."""

    parts: tuple[Part, ...]
    rows: int


def plan(dataset: ds.Dataset, rows: int, where: ds.Expression | None = None) -> list[Piece]:
    """The dataset cut into pieces of at most `rows` rows along row-group boundaries, from the files'
    footers, in file order: small files share a piece, large files are split across pieces."""
    pieces: list[Piece] = []
    parts: list[Part] = []
    size = 0
    for fragment in dataset.get_fragments(filter=where):
        keys = tuple(sorted((k, str(v)) for k, v in ds.get_partition_keys(fragment.partition_expression).items()))
        metadata = fragment.metadata
        groups: list[int] = []
        for i in range(metadata.num_row_groups):
            n = metadata.row_group(i).num_rows
            if size and size + n > rows:
                if groups:
                    parts.append(Part(fragment.path, tuple(groups), keys))
                pieces.append(Piece(tuple(parts), size))
                parts, groups, size = [], [], 0
            groups.append(i)
            size += n
        if groups:
            parts.append(Part(fragment.path, tuple(groups), keys))
    if parts:
        pieces.append(Piece(tuple(parts), size))
    return pieces


def columns_needed(scan: Scan, names: Iterable[str]) -> list[str]:
    """The columns a chunk uses, among `names`: the prediction contract's fields for this schema and the
    `stage.<name>` timings. Other columns are not read (Parquet is columnar: they cost no I/O)."""
    wanted = field_kinds(RecordKind.predictions, scan.schema)
    return [n for n in names if n in wanted or (scan.timed and n.startswith(STAGE_PREFIX))]


def read_piece(fs, piece: Piece, columns: list[str], rows: int) -> Iterator[pa.Table]:
    """A piece's rows (only `columns`, plus needed hive partition values) as tables of at most `rows`
    rows; `fs` is the dataset's fsspec filesystem. Files whose columns differ are unified with nulls."""
    batch_rows = min(rows, BATCH_ROWS)
    pending: list[pa.Table] = []
    size = 0
    for part in piece.parts:
        with fs.open(part.path, "rb") as handle:
            file = pq.ParquetFile(handle)
            present = set(file.schema_arrow.names)
            keys = [(k, v) for k, v in part.keys if k in columns and k not in present]
            for batch in file.iter_batches(batch_size=batch_rows, row_groups=list(part.row_groups),
                                           columns=[c for c in columns if c in present], use_threads=False):
                table = pa.Table.from_batches([batch])
                for name, value in keys:
                    table = table.append_column(name, pa.repeat(pa.scalar(value), table.num_rows))
                while table.num_rows:
                    take = min(rows - size, table.num_rows)
                    pending.append(table.slice(0, take))
                    size += take
                    table = table.slice(take)
                    if size == rows:
                        yield _concat(pending)
                        pending, size = [], 0
    if pending:
        yield _concat(pending)


def _concat(tables: list[pa.Table]) -> pa.Table:
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")


def fold_piece(fs, piece: Piece, scan: Scan, columns: list[str], rows: int, where: str) -> tuple[ChunkResult, int]:
    """Fold a piece `rows` rows at a time, merging partials as it goes (so what is held is one slice and
    one merged set of partials); its partials and counts, and the number of slices folded."""
    counts: Counter = Counter()
    merged: list[PartialRow] = []
    n = 0
    for n, table in enumerate(read_piece(fs, piece, columns, rows), start=1):
        result = chunk_partials(table, scan, where=f"{where}-{n}")
        del table
        counts.update(result.counts)
        merged = merge_rows([*merged, *result.partials])
        release_memory()
    return ChunkResult(merged, counts), n


def filesystem(dataset: str, storage_options: dict | None = None):
    """The fsspec filesystem of `dataset` (a local path or URL) and the path on it."""
    import fsspec

    return fsspec.core.url_to_fs(str(dataset), **(storage_options or {}))


def scan_plan(dataset: str, scan: Scan, partition_rows: int,
              storage_options: dict | None = None) -> tuple[list[Piece], list[str]]:
    """The pieces of the dataset in the scan's time range (whole `hour=` partitions outside it skipped)
    and the columns to read."""
    data = open_dataset(dataset, storage_options)
    names = list(data.partitioning.schema.names) if data.partitioning is not None else []
    filters = partition_filters(names, scan.since, scan.until)
    where = pq.filters_to_expression(filters) if filters else None
    return plan(data, partition_rows, where), columns_needed(scan, data.schema.names)


def scan(dataset: str, scan: Scan, partition_rows: int = DEFAULT_PARTITION_ROWS,
         storage_options: dict | None = None, observe: Observer | None = None) -> ScanResult:
    """Fold the dataset in this process, `partition_rows` rows at a time; partials merged as they come.
    `observe` is told the rows folded and the rows to fold (from the files' footers) after each piece."""
    started = time.perf_counter()
    fs, _ = filesystem(dataset, storage_options)
    pieces, columns = scan_plan(dataset, scan, partition_rows, storage_options)
    counts: Counter = Counter()
    merged: list[PartialRow] = []
    gathered = slices = folded = 0
    total = sum(piece.rows for piece in pieces)
    if observe is not None:
        observe(0, total)
    for i, piece in enumerate(pieces, start=1):
        result, n = fold_piece(fs, piece, scan, columns, partition_rows, where=f"chunk-{i}")
        slices += n
        counts.update(result.counts)
        gathered += sum(len(r.payload) for r in result.partials)
        merged = merge_rows([*merged, *result.partials])
        folded += piece.rows
        if observe is not None:
            observe(folded, total)
    return ScanResult(merged, +counts, slices, gathered, time.perf_counter() - started)


def dataset_timed(dataset: ds.Dataset) -> bool:
    """Whether the dataset carries stage timings (any `stage.<name>` column)."""
    return bool(stage_columns(dataset.schema.names))
