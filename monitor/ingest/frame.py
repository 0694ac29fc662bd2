"""Frame: join predictions with their stage timings by request_id, waiting (bounded) for late arrivals.

Rows that cannot be joined yet wait in a buffer that the ingest stage (monitor.ingest.stage) persists with the source offsets.
A prediction leaves the buffer when a timing of its request arrives, or unmatched when `lateness` has
passed since it was read; a timing whose prediction never arrives within `lateness` becomes an orphan.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from monitor.aggregate.keys import STAGE_PREFIX

ARRIVED = "_arrived"  # when the row was read (the tick's clock): the lateness bound counts from here


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
        repeated = _repeated(predictions["request_id"])
        if repeated is not None:
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


def _repeated(ids: pd.Series) -> np.ndarray | None:
    """Which ids repeat an earlier one (the first is kept); None when none does (the usual case)."""
    if isinstance(ids.dtype, pd.ArrowDtype) and _distinct_fixed_width(pa.chunked_array(pa.array(ids.array))):
        return None
    repeated = ids.duplicated(keep="first").to_numpy()
    return repeated if repeated.any() else None


_MIX = np.uint64(0x9E3779B97F4A7C15)


def _distinct_fixed_width(ids: pa.ChunkedArray) -> bool:
    """True when the ids are surely all distinct: same-length text (a usual id), in increasing order
    (sequence numbers, ULIDs, UUIDv7: no hashing needed) or else hashed in numpy.

    Equal ids hash alike, so distinct hashes prove distinct ids; a shared hash (or another kind of id)
    answers False, and the caller checks exactly.
    """
    if not is_text(ids.type) or ids.null_count or not len(ids):
        return False
    lengths = pc.binary_length(ids)
    width = pc.min_max(lengths)
    w = width["min"].as_py()
    if w != width["max"].as_py() or not 0 < w <= 64:
        return False
    words = -(-w // 8)
    blocks = []
    for chunk in ids.chunks:
        if not len(chunk):
            continue
        wide = np.dtype(np.int64 if pa.types.is_large_string(chunk.type) else np.int32)
        first = int(np.frombuffer(chunk.buffers()[1], dtype=wide)[chunk.offset])
        data = np.frombuffer(chunk.buffers()[2], dtype=np.uint8)[first:first + len(chunk) * w].reshape(len(chunk), w)
        if w != words * 8:
            padded = np.zeros((len(chunk), words * 8), dtype=np.uint8)
            padded[:, :w] = data
            data = padded
        blocks.append(np.ascontiguousarray(data).view(np.uint64))
    cells = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
    if _increasing(cells.view(">u8")):  # the bytes read big-endian compare as the texts do
        return True
    h = cells[:, 0].copy()
    for j in range(1, words):
        h *= _MIX
        h ^= cells[:, j]
    return len(pd.unique(h)) == len(h)


def _increasing(rows: np.ndarray) -> bool:
    """Whether each row of unsigned words is greater than the one before (compared word by word)."""
    greater = rows[1:, 0] > rows[:-1, 0]
    equal = rows[1:, 0] == rows[:-1, 0]
    for j in range(1, rows.shape[1]):
        greater |= equal & (rows[1:, j] > rows[:-1, j])
        equal &= rows[1:, j] == rows[:-1, j]
    return bool(greater.all())


def _wide(timings: pd.DataFrame) -> pd.DataFrame:
    """One row per request, one `stage.<name>` column per stage, values in ms."""
    if timings.empty:
        return pd.DataFrame(index=pd.Index([], name="request_id"))
    wide = timings.set_index(["request_id", "stage"])["duration_ms"].unstack("stage")
    wide.columns = [STAGE_PREFIX + str(c) for c in wide.columns]
    return wide


def is_text(t: pa.DataType) -> bool:
    """Whether an Arrow type is text (string or large_string)."""
    return pa.types.is_string(t) or pa.types.is_large_string(t)


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


_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_HASH_WIDTH = 64  # texts up to this many bytes are hashed in numpy; longer ones by pandas


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, in place: every input bit reaches every output bit."""
    h ^= h >> np.uint64(30)
    h *= _M1
    h ^= h >> np.uint64(27)
    h *= _M2
    h ^= h >> np.uint64(31)
    return h


def key_hashes(values: pd.Series) -> np.ndarray:
    """A 64-bit hash of each value's text (null as its own value): equal texts hash alike, and two distinct
    texts share a hash with odds of about 2^-64 per pair. Hashed in numpy, with no Python object per row."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        values = values.astype(object)
    arr = pa.array(values.array if hasattr(values.array, "__arrow_array__") else values.to_numpy(dtype=object),
                   from_pandas=True)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if not is_text(arr.type):
        arr = pc.cast(arr, pa.string())
    arr = pc.cast(arr, pa.large_string())
    n = len(arr)
    if not n:
        return np.zeros(0, np.uint64)
    lengths = pc.fill_null(pc.binary_length(arr), 0).to_numpy().astype(np.int64)
    h = np.zeros(n, np.uint64)
    short = lengths <= _HASH_WIDTH
    if short.all():
        h = _hash_texts(arr, lengths)
    else:
        # Long texts (rare for keys) one by one; a text is hashed the same way whatever its neighbours.
        rows = np.flatnonzero(short)
        if len(rows):
            h[rows] = _hash_texts(arr.take(pa.array(rows)), lengths[rows])
        for i in np.flatnonzero(~short).tolist():
            h[i] = int.from_bytes(hashlib.blake2b(arr[i].as_py().encode(), digest_size=8).digest(), "little")
    if arr.null_count:
        h[~arr.is_valid().to_numpy(zero_copy_only=False)] = np.uint64(0)
    return h


def _hash_texts(arr: pa.Array, lengths: np.ndarray) -> np.ndarray:
    """`key_hashes` of a large_string array whose texts are at most _HASH_WIDTH bytes long."""
    n = len(arr)
    width = int(lengths.max()) if n else 0
    words = max(1, -(-width // 8))
    starts = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset:arr.offset + n]
    raw = arr.buffers()[2]
    data = np.zeros((len(raw) if raw is not None else 0) + 8, np.uint8)  # 8 more: a word read past the end
    if raw is not None:
        data[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    # Every byte offset of the buffer as the start of a little-endian 8-byte word (a view, no copy).
    at = np.ndarray(shape=(len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))
    h = _mix(lengths.astype(np.uint64) + np.uint64(1))
    for j in range(words):
        left = np.clip(lengths - 8 * j, 0, 8)  # bytes of this word that belong to the text
        word = at[np.minimum(starts + 8 * j, len(at) - 1)]
        keep = np.where(left >= 8, np.uint64(0xFFFFFFFFFFFFFFFF),
                        (np.uint64(1) << (np.uint64(8) * left.astype(np.uint64))) - np.uint64(1))
        # A text mixes in only the words it has: its hash does not depend on how long its neighbours are.
        h = np.where(left > 0, _mix(h ^ (word & keep) ^ np.uint64(j + 1)), h)
    return h


def combined_hashes(columns: list[pd.Series]) -> np.ndarray:
    """`key_hashes` of several columns row by row: one 64-bit key per row of the tuple of values."""
    h = key_hashes(columns[0])
    for col in columns[1:]:
        h = _mix(h * np.uint64(31) ^ key_hashes(col))
    return h
