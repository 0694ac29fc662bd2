"""Frame: join predictions with their stage timings by request_id, waiting (bounded) for late arrivals.

Rows that cannot be joined yet wait in a buffer that the runner persists with the source offsets.
A prediction leaves the buffer when a timing of its request arrives, or unmatched when `lateness` has
passed since it was read; a timing whose prediction never arrives within `lateness` becomes an orphan.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pandas as pd

ARRIVED = "_arrived"  # when the row was read (the tick's clock): the lateness bound counts from here
STAGE_PREFIX = "stage."  # wide columns holding each stage's duration in ms


@dataclass(frozen=True)
class Joined:
    """One join step's output and the rows left waiting."""

    ready: pd.DataFrame  # predictions to fold, with `joined`, `stage_rows` and `stage.<name>` columns
    pending_predictions: pd.DataFrame
    pending_timings: pd.DataFrame
    orphans: pd.DataFrame  # timings whose prediction did not arrive within lateness
    duplicates: int  # repeated request_ids among predictions (the first was kept)
    duplicate_timings: int  # repeated (request_id, stage) among timings (the first was kept)


def join(predictions: pd.DataFrame, timings: pd.DataFrame | None, now: datetime,
         lateness: timedelta, expire: bool = True) -> Joined:
    """Join buffered + new predictions with buffered + new timings (None: no timing source).

    `expire`: let rows whose lateness has passed leave unmatched; False while the tick still has
    chunks to read, since their partners may be in the next chunk.
    """
    empty = pd.DataFrame()
    if "request_id" not in predictions:
        predictions = pd.DataFrame({"request_id": pd.Series(dtype=object), ARRIVED: pd.Series(dtype="datetime64[ns, UTC]")})
    if timings is not None and "request_id" not in timings:
        timings = pd.DataFrame({"request_id": pd.Series(dtype=object), "stage": pd.Series(dtype=object),
                                "duration_ms": pd.Series(dtype=float), ARRIVED: pd.Series(dtype="datetime64[ns, UTC]")})
    before = len(predictions)
    if before:
        # Filter (a copy of every column) only when there is a repeat: usually there is none.
        repeated = predictions["request_id"].duplicated(keep="first").to_numpy()
        if repeated.any():
            predictions = predictions[~repeated]
    duplicates = before - len(predictions)
    if timings is None:
        # A shallow copy: the new columns must not reach the caller's frame, the rows need no copy.
        ready = predictions.copy(deep=False)
        ready["joined"], ready["stage_rows"] = False, 0
        if not ready.index.equals(pd.RangeIndex(len(ready))):
            ready = ready.reset_index(drop=True)
        return Joined(ready, empty, empty, empty, duplicates, 0)

    before_t = len(timings)
    if before_t:
        timings = timings.drop_duplicates(["request_id", "stage"], keep="first")
    duplicate_timings = before_t - len(timings)
    # With expire=False nothing is old enough: every row waits for the tick's remaining chunks.
    expired_at = pd.Timestamp(now) - lateness if expire else pd.Timestamp.min.tz_localize("UTC")

    has_prediction = timings["request_id"].isin(predictions["request_id"]).to_numpy() if len(timings) else np.zeros(0, bool)
    matched_t = timings[has_prediction]
    waiting_t = timings[~has_prediction]
    orphan_mask = (waiting_t[ARRIVED] <= expired_at).to_numpy() if len(waiting_t) else np.zeros(0, bool)

    has_timing = predictions["request_id"].isin(matched_t["request_id"]).to_numpy() if len(predictions) else np.zeros(0, bool)
    expired_p = (predictions[ARRIVED] <= expired_at).to_numpy() if len(predictions) else np.zeros(0, bool)
    leave = has_timing | expired_p
    ready = predictions[leave]
    if len(ready):
        wide = _wide(matched_t)
        ready = ready.join(wide, on="request_id")
        counts = matched_t.groupby("request_id").size()
        ready["stage_rows"] = ready["request_id"].map(counts).fillna(0).astype("int64").to_numpy()
        ready["joined"] = ready["stage_rows"].to_numpy() > 0
    return Joined(
        ready=ready.reset_index(drop=True),
        pending_predictions=predictions[~leave].reset_index(drop=True),
        pending_timings=waiting_t[~orphan_mask].reset_index(drop=True),
        orphans=waiting_t[orphan_mask].reset_index(drop=True),
        duplicates=duplicates,
        duplicate_timings=duplicate_timings,
    )


def _wide(timings: pd.DataFrame) -> pd.DataFrame:
    """One row per request, one `stage.<name>` column per stage, values in ms."""
    if timings.empty:
        return pd.DataFrame(index=pd.Index([], name="request_id"))
    wide = timings.set_index(["request_id", "stage"])["duration_ms"].unstack("stage")
    wide.columns = [STAGE_PREFIX + str(c) for c in wide.columns]
    return wide


def to_blob(frame: pd.DataFrame) -> bytes | None:
    """Serialize a waiting buffer as Parquet (None when empty)."""
    if frame is None or frame.empty:
        return None
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return buf.getvalue()


def from_blobs(blobs: list[bytes]) -> pd.DataFrame:
    """The waiting buffer back from its Parquet blobs."""
    frames = [pd.read_parquet(io.BytesIO(b)) for b in blobs if b]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
