"""Write the engines' input layout: prediction rows with their stage timings as `stage.<name>` columns,
as a Parquet dataset partitioned by the hour of `ts` (hive style: `hour=2026-11-02T03/part-0.parquet`).

For the simulator's logs and for tests; a data lake builds the same layout with one pivot and one left
join by request_id (docs/scale.md).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from monitor.aggregate.keys import STAGE_PREFIX
from monitor.config import Limits
from monitor.contract import Reason, RecordKind
from monitor.ingest.sources.batch import LINE
from monitor.ingest.validate import validate
from monitor.schema import Schema

PARTITION = "hour"
HOUR_FORMAT = "%Y-%m-%dT%H"  # partition values sort as text in time order


def read_jsonl(folder: Path, kind: RecordKind | None = None, schema: Schema | None = None,
               now: datetime | None = None) -> pd.DataFrame:
    """Every `*.jsonl` file of a folder, values as written (timestamps stay text), without the rows a tick
    would quarantine (checked as `kind`, guessed from the columns when None, against `schema`'s fields).

    `frame.attrs["quarantined"]` counts the rows left out, by reason code.
    """
    frames, skipped = [], Counter()
    for path in sorted(Path(folder).glob("*.jsonl")):
        frame, reasons = _valid_rows(path, kind, schema or Schema(), now or datetime.now(UTC))
        frames.append(frame)
        skipped.update(reasons)
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    out.attrs["quarantined"] = dict(skipped)
    return out


def _valid_rows(path: Path, kind: RecordKind | None, schema: Schema, now: datetime) -> tuple[pd.DataFrame, Counter]:
    """One file's rows that meet the contract, as written, and the reasons of those that do not."""
    reasons: Counter = Counter()
    try:
        frame = pd.read_json(path, lines=True, dtype=False, convert_dates=False, precise_float=True)
    except ValueError:
        # A line that is not a JSON object: the others are read one by one, each bad line counted.
        records = []
        for number, line in enumerate(path.read_bytes().splitlines(), 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError:
                value = None
            if isinstance(value, dict):
                records.append(value | {LINE: number})
            else:
                reasons[Reason.unparseable.value] += 1
        frame = pd.DataFrame.from_records(records)
    else:
        frame[LINE] = range(1, len(frame) + 1)
    if frame.empty:
        return frame.drop(columns=[LINE], errors="ignore"), reasons
    kind = kind or _guess_kind(frame)
    _, rejects = validate(kind, frame, path.name, schema, Limits(), now)
    bad = {int(r.position.rsplit(":", 1)[1]) for r in rejects}
    reasons.update(r.reason.value for r in rejects)
    keep = ~frame[LINE].isin(bad)
    return frame[keep].drop(columns=[LINE]).reset_index(drop=True), reasons


def _guess_kind(frame: pd.DataFrame) -> RecordKind:
    if {"stage", "duration_ms"} <= set(frame.columns):
        return RecordKind.timings
    if "label" in frame and "ts" not in frame:
        return RecordKind.labels
    return RecordKind.predictions


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
