"""Write the engines' input layout: prediction rows with their stage timings as `stage.<name>` columns,
as a Parquet dataset partitioned by the hour of `ts` (hive style: `hour=2026-11-02T03/part-0.parquet`).

For the simulator's logs and for tests; a data lake builds the same layout with one pivot and one left
join by request_id (docs/scale.md).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from monitor.frame import STAGE_PREFIX

PARTITION = "hour"
HOUR_FORMAT = "%Y-%m-%dT%H"  # partition values sort as text in time order


def read_jsonl(folder: Path) -> pd.DataFrame:
    """Every `*.jsonl` file of a folder, values as written (timestamps stay text)."""
    frames = [pd.read_json(path, lines=True, dtype=False, convert_dates=False, precise_float=True) for path in sorted(Path(folder).glob("*.jsonl"))]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def joined_rows(predictions: pd.DataFrame, timings: pd.DataFrame | None) -> pd.DataFrame:
    """Predictions with one `stage.<name>` column (ms) per stage; the first timing of a repeated
    (request_id, stage) is kept, as the runner's join keeps it."""
    if timings is None or timings.empty:
        return predictions
    first = timings.drop_duplicates(["request_id", "stage"], keep="first")
    wide = first.pivot(index="request_id", columns="stage", values="duration_ms")
    wide.columns = [STAGE_PREFIX + str(c) for c in wide.columns]
    return predictions.merge(wide, how="left", left_on="request_id", right_index=True)


def write_dataset(rows: pd.DataFrame | pa.Table, out: Path, rows_per_file: int = 250_000) -> None:
    """Write `rows` under `out`, one hive partition per hour of `ts` (RFC 3339 text or a timestamp), in
    files of at most `rows_per_file` rows (the engines cut files into pieces of `partition_rows` rows
    along row groups, so the file size does not bound their memory: docs/scale.md)."""
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pandas(rows, preserve_index=False)
    ts = table["ts"].to_pandas()
    hours = (pd.to_datetime(ts, utc=True, format="ISO8601") if ts.dtype == object else ts).dt.strftime(HOUR_FORMAT)
    table = table.append_column(PARTITION, pa.array(hours.to_numpy(dtype=object), pa.string()))
    ds.write_dataset(table, out, format="parquet", partitioning=[PARTITION], partitioning_flavor="hive",
                     max_rows_per_file=rows_per_file, max_rows_per_group=min(rows_per_file, 256 * 1024),
                     existing_data_behavior="delete_matching")
