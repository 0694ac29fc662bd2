"""Pieces: whatever the file layout, an engine folds at most `partition_rows` rows at once, reads only the
columns a chunk uses, and the partials do not depend on the layout."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
from test_engines_agree import assert_same_partial

from monitor.aggregate.partial import Partial
from monitor.config import Engine
from monitor.daemon.engines.local import Scan, filesystem, open_dataset, plan, read_piece, scan_plan
from monitor.daemon.engines.scan import fold_dataset


def rewrite(world: dict, out, row_group_rows: int, files: int) -> int:
    """The world's rows (with an extra column no check uses) as `files` files of row groups of
    `row_group_rows` rows, without hive partitions; returns the row count."""
    table = pq.read_table(world["dataset"])
    table = table.append_column("unused_blob", pa.array(["x" * 50] * table.num_rows))
    out.mkdir()
    step = -(-table.num_rows // files)
    for i, a in enumerate(range(0, table.num_rows, step)):
        pq.write_table(table.slice(a, step), out / f"part-{i}.parquet", row_group_size=row_group_rows)
    return table.num_rows


def scan_of(world: dict) -> Scan:
    config = world["config"]
    return Scan.of(config.services[0], config.limits, None, world["now"], True)


def test_plan_packs_row_groups_up_to_partition_rows(world, tmp_path):
    rows = rewrite(world, tmp_path / "small", row_group_rows=700, files=3)
    pieces = plan(open_dataset(str(tmp_path / "small")), 2_000)
    assert all(p.rows <= 2_000 for p in pieces) and sum(p.rows for p in pieces) == rows
    assert any(len(p.parts) > 1 for p in pieces)  # a piece spans the end of one file and the start of the next
    groups = [(part.path, g) for p in pieces for part in p.parts for g in part.row_groups]
    assert len(groups) == len(set(groups)) == sum(pq.ParquetFile(tmp_path / "small" / f).num_row_groups
                                                  for f in ("part-0.parquet", "part-1.parquet", "part-2.parquet"))


def test_large_row_group_is_read_in_slices_of_needed_columns(world, tmp_path):
    rows = rewrite(world, tmp_path / "big", row_group_rows=1_000_000, files=1)
    dataset = str(tmp_path / "big")
    pieces, columns = scan_plan(dataset, scan_of(world), 1_500)
    assert len(pieces) == 1 and pieces[0].rows == rows > 1_500  # one row group: a piece larger than planned
    assert "unused_blob" not in columns and "request_id" in columns and "stage.model" in columns
    fs, _ = filesystem(dataset)
    tables = list(read_piece(fs, pieces[0], columns, 1_500))
    assert [t.num_rows for t in tables[:-1]] == [1_500] * (len(tables) - 1) and 0 < tables[-1].num_rows <= 1_500
    assert sum(t.num_rows for t in tables) == rows
    assert all(t.column_names == columns for t in tables)


def test_partials_do_not_depend_on_layout(world, tmp_path, cluster_client):
    rewrite(world, tmp_path / "big", row_group_rows=1_000_000, files=1)
    scan = scan_of(world)
    expected = fold_dataset(world["dataset"], scan, Engine(kind="local", partition_rows=3_000))
    one_file = fold_dataset(str(tmp_path / "big"), scan, Engine(kind="local", partition_rows=2_000))
    dask = fold_dataset(str(tmp_path / "big"), scan, Engine(kind="dask", partition_rows=2_000), cluster_client)
    assert dask.chunks == 1 and one_file.chunks > 3
    for got in (one_file, dask):
        assert Counter(expected.counts) == Counter(got.counts)
        assert [(p.model_version, p.bucket_start, p.segment, p.rows) for p in expected.partials] == \
            [(p.model_version, p.bucket_start, p.segment, p.rows) for p in got.partials]
        for a, b in zip(expected.partials, got.partials, strict=True):
            assert_same_partial(Partial.from_bytes(a.payload), Partial.from_bytes(b.payload))


def test_dask_tasks_follow_the_plan(world, tmp_path, cluster_client):
    rows = rewrite(world, tmp_path / "small", row_group_rows=700, files=3)
    result = fold_dataset(str(tmp_path / "small"), scan_of(world), Engine(kind="dask", partition_rows=2_000),
                          cluster_client)
    assert result.chunks == len(plan(open_dataset(str(tmp_path / "small")), 2_000)) >= rows // 2_000
    assert result.counts["read"] == rows


def test_plan_extremes(world):
    """One row group per piece when a row group exceeds partition_rows; one piece when all fit."""
    data = open_dataset(world["dataset"])
    single = plan(data, 1)
    assert all(len(p.parts) == 1 and len(p.parts[0].row_groups) == 1 for p in single) and len(single) > 1
    whole = plan(data, 10_000_000)
    assert len(whole) == 1 and len(whole[0].parts) == len(single)
    assert sum(p.rows for p in single) == whole[0].rows == world["rows"]
