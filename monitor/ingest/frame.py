"""Frame: join predictions with their stage timings by request_id, waiting (bounded) for late arrivals.

Rows that cannot be joined yet wait in a buffer that the ingest stage (monitor.ingest.stage) persists with the source offsets.
A prediction leaves the buffer when a timing of its request arrives, or unmatched when `lateness` has
passed since it was read; a timing whose prediction never arrives within `lateness` becomes an orphan.
A request folded with timings is remembered (its key, bucket keys and stages) for twice `lateness`: a timing
of it that arrives within `lateness` of its prediction joins it (and is folded into its bucket on its own),
a later one is late, and one repeating a stage it has is a duplicate.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from monitor.aggregate.keys import STAGE_PREFIX

ARRIVED = "_arrived"  # when the row was read (the tick's clock): the lateness bound counts from here
KEY = "_key"  # a remembered request's request_id as key_hashes gives it
FOLD_KEYS = ("ts", "model_version", "cache_hit")  # what folding a request's later timings needs of its row


@dataclass(frozen=True)
class Joined:
    """One join step's output and the rows left waiting."""

    ready: pd.DataFrame  # predictions to fold, with `joined`, `stage_rows` and `stage.<name>` columns
    pending_predictions: pd.DataFrame
    pending_timings: pd.DataFrame
    orphans: pd.DataFrame  # timings whose prediction did not arrive within lateness
    duplicates: int  # repeated request_ids among predictions (the first was kept)
    duplicate_timings: int  # repeated (request_id, stage) among timings, or of a remembered request (the first was kept)
    late: pd.DataFrame = field(default_factory=pd.DataFrame)  # remembered requests' new timings, one row each, to fold with `only_stages`
    late_timings: pd.DataFrame = field(default_factory=pd.DataFrame)  # timings of a remembered request read after its lateness
    remember: pd.DataFrame = field(default_factory=pd.DataFrame)  # rows to add to the remembered requests (see `join`'s `folded`)


def join(predictions: pd.DataFrame, timings: pd.DataFrame | None, now: datetime,
         lateness: timedelta, expire: bool = True, folded: pd.DataFrame | None = None,
         segments: tuple[str, ...] = ()) -> Joined:
    """Join buffered + new predictions with buffered + new timings (None: no timing source).

    `expire`: let rows whose lateness has passed leave unmatched; False while the tick still has
    chunks to read, since their partners may be in the next chunk.
    `folded`: the requests already folded with timings (the `remember` rows of earlier joins, several rows
    per request as it gains stages; None: none are remembered, a timing without a prediction waits);
    `segments`: the segment columns their rows keep, for their later timings' fold.
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
    late = late_timings = remember_late = empty
    if folded is not None and len(folded) and len(waiting_t):
        waiting_t, late, late_timings, remember_late, repeated_t = _join_folded(waiting_t, folded, lateness)
        duplicate_timings += repeated_t
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
    ready = ready.reset_index(drop=True)
    remember = empty
    if folded is not None:
        joined_now = ready[ready["joined"].to_numpy(dtype=bool)] if len(ready) else ready
        remember = concat_remembered([_remembered(joined_now, segments), remember_late])
    return Joined(
        ready=ready,
        pending_predictions=predictions[~leave].reset_index(drop=True),
        pending_timings=waiting_t[~orphan_mask].reset_index(drop=True),
        orphans=waiting_t[orphan_mask].reset_index(drop=True),
        duplicates=duplicates,
        duplicate_timings=duplicate_timings,
        late=late,
        late_timings=late_timings,
        remember=remember,
    )


def _remembered(ready: pd.DataFrame, segments: tuple[str, ...]) -> pd.DataFrame:
    """The `folded` rows of requests folded with timings: key, arrival, bucket keys, a bool per stage."""
    if not len(ready):
        return pd.DataFrame()
    keep = [c for c in (ARRIVED, *FOLD_KEYS, *segments) if c in ready]
    out = ready[list(dict.fromkeys(keep))].copy()
    for c in ready.columns:
        if c.startswith(STAGE_PREFIX):
            out[c] = ready[c].notna().to_numpy()
    out.insert(0, KEY, key_hashes(ready["request_id"]))
    return out.reset_index(drop=True)


def concat_remembered(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Remembered rows as one frame; a stage some rows lack is False there."""
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame()
    out = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    stages = [c for c in out.columns if c.startswith(STAGE_PREFIX)]
    if stages and len(frames) > 1:
        out[stages] = out[stages].eq(True)  # missing (NaN) is False
    return out


def forget(folded: pd.DataFrame, now: datetime, lateness: timedelta) -> pd.DataFrame:
    """The remembered requests whose prediction was read less than twice `lateness` before `now`: a timing
    of one is joined within lateness and told late after it; an older request's timing is an orphan."""
    if not len(folded):
        return folded
    return folded[(folded[ARRIVED] > pd.Timestamp(now) - 2 * lateness).to_numpy()].reset_index(drop=True)


def _join_folded(waiting: pd.DataFrame, folded: pd.DataFrame, lateness: timedelta):
    """Split timings without a prediction by the remembered requests: (still waiting, the late rows to fold,
    those read after their request's lateness, the rows to remember, repeats of a stage a request has)."""
    empty = pd.DataFrame()
    keys = key_hashes(waiting["request_id"])
    hit = pd.Series(keys).isin(folded[KEY]).to_numpy()
    if not hit.any():
        return waiting, empty, empty, empty, 0
    found = waiting[hit].reset_index(drop=True)
    found[KEY] = keys[hit]
    known = folded[folded[KEY].isin(found[KEY]).to_numpy()]
    first = known.drop_duplicates(KEY).set_index(KEY)  # a request's keys are the same in each of its rows
    stages = [c for c in known.columns if c.startswith(STAGE_PREFIX)]
    column = STAGE_PREFIX + found["stage"].astype(str)
    if stages:
        has = known.groupby(KEY)[stages].any().stack()
        has = has[has.to_numpy(dtype=bool)].index
        repeated = pd.MultiIndex.from_arrays([found[KEY], column]).isin(has)
    else:
        repeated = np.zeros(len(found), bool)
    opened = first[ARRIVED].reindex(found[KEY]).reset_index(drop=True)
    too_late = ((found[ARRIVED] - opened) > pd.Timedelta(lateness)).to_numpy(dtype=bool) & ~repeated
    joins = found[~repeated & ~too_late]
    late = remember = empty
    if len(joins):
        wide = joins.set_index([KEY, "stage"])["duration_ms"].unstack("stage")
        wide.columns = [STAGE_PREFIX + str(c) for c in wide.columns]
        carried = [c for c in first.columns if not c.startswith(STAGE_PREFIX)]
        late = first.loc[wide.index, carried].join(wide)
        late["stage_rows"] = joins.groupby(KEY).size().reindex(wide.index).to_numpy(dtype="int64")
        late["joined"] = True
        late = late.rename_axis(KEY).reset_index()
        remember = late[[KEY, *carried]].copy()
        for c in wide.columns:
            remember[c] = late[c].notna().to_numpy()
    return (waiting[~hit].reset_index(drop=True), late, found[too_late].drop(columns=KEY).reset_index(drop=True),
            remember, int(repeated.sum()))


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
