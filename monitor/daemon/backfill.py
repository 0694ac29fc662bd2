"""`tailwatch backfill --since --until [--step]`: replay the history in the configured file sources as live
ticks would have seen it, with a clock stepping by `--step` (default: the smallest configured window).

Each source file is rebuilt in a staging directory as it grew: at clock t a line is there when it and every
line before it in its file were written by t. A line's write time is its event time: `ts` for a prediction;
`start_ts` for a timing, else its prediction's `ts` (by request_id); `label_ts` for a label, else its
prediction's `ts`. A line with neither is visible with the line before it. Labels are staged for services
with a `quality:` section (the only ones whose ticks read labels). Each step appends what became visible and
runs the same tick job as the daemon (`jobs.tick_job`) against the staged files, then records the clock it
reached; a rerun with the same arguments resumes after the last recorded step (redoing a step reads nothing
new, so nothing counts twice). At the end the staged files' offsets are handed to the real files in one
transaction, so the daemon goes on with the rows after `until` exactly once.

OTLP-JSON span files are rewritten span by span: each span is visible from its own end time, whatever file
or line it was written in (`backfill_spans`). Files that cannot be cut by line (Parquet, gzip) are visible
whole from the latest event time their rows hold (by the same rules): a file written at once exists from when
its last row was written. SQL sources are not replayed: the daemon reads them by cursor.
"""

from __future__ import annotations

import gzip
import logging
import shutil
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from monitor.config import Config, FileSource, Service
from monitor.daemon import backfill_spans, jobs
from monitor.durations import duration_text
from monitor.ingest.otlp import parse_otlp
from monitor.ingest.shape import column_of, to_contract
from monitor.ingest.sources.batch import LINE, Observer, file_format
from monitor.ingest.sources.chunks import BOM
from monitor.ingest.sources.csvlines import parse_csv
from monitor.ingest.sources.files import DirectorySource
from monitor.ingest.sources.jsonl import parse_jsonl
from monitor.ingest.validate import _from_epoch
from storage.database import Session
from storage.store import Store

log = logging.getLogger(__name__)

TIME_FIELD = {"predictions": "ts", "timings": "start_ts", "labels": "label_ts"}
KINDS = ("predictions", "timings", "labels")
EPOCH = np.datetime64("1970-01-01", "ns")


class BackfillError(ValueError):
    """A backfill that cannot start or resume; the message says what to do."""


@dataclass(frozen=True)
class StagedFile:
    """One real source file and its staged copy: at clock `times[i]` the copy holds bytes [0, ends[i])."""

    source: str  # offsets source name, e.g. churn/predictions
    real: Path
    staged: Path
    times: np.ndarray  # datetime64[ns] UTC, non-decreasing, one per cut point
    ends: np.ndarray  # byte offsets, increasing
    released: backfill_spans.Released | None = None  # a span file: the copy grows from its released spans

    def cut(self, now: datetime) -> int:
        """Bytes of the real file visible at `now`."""
        i = int(np.searchsorted(self.times, np.datetime64(pd.Timestamp(now).tz_convert(None)), side="right"))
        return int(self.ends[i - 1]) if i else 0


@dataclass(frozen=True)
class Result:
    run_id: int
    steps: int  # steps run by this call
    reached: datetime
    resumed_from: datetime | None
    done: bool
    step: timedelta


@dataclass(frozen=True)
class Summary:
    """What one service's ticks of a backfill run did, over all its steps (a resumed run's earlier ones too);
    counts are rows."""

    service: str
    read: dict[str, int]  # per record kind
    joined: int  # predictions folded with their timings
    unmatched: int  # predictions folded without any (their lateness passed)
    quarantined: dict[str, int]  # per reason code; `orphan_timing`: timings whose prediction had left
    incidents: list[int]  # ids of the incidents opened at the run's clocks
    failed_steps: int

    @property
    def orphan_timings(self) -> int:
        return self.quarantined.get("orphan_timing", 0)


def summarize(config: Config, store: Store, run_id: int) -> list[Summary]:
    """Per service, what the ticks of backfill run `run_id` read, joined and quarantined, and the incidents
    they opened."""
    with store.transaction() as session:
        run = store.backfills.get(session, run_id)
        if run is None or run["reached"] is None:
            return [Summary(s.name, {}, 0, 0, {}, [], 0) for s in config.services]
        out = []
        for service in config.services:
            ticks = [t for t in store.ticks.search(session, service.name, run["since"],
                                                   run["reached"] + timedelta(microseconds=1))
                     if t.started_at >= run["started_at"]]
            read, quarantined = {}, {}
            for t in ticks:
                for key, into in (("read", read), ("quarantined", quarantined)):
                    for k, n in ((t.summary or {}).get(key) or {}).items():
                        into[k] = into.get(k, 0) + int(n)
            opened = store.incidents.search(session, service.name, run["since"],
                                            run["reached"] + timedelta(microseconds=1))
            out.append(Summary(service.name, read, sum(t.counts["joined"] for t in ticks),
                               sum(t.counts["unmatched"] for t in ticks), quarantined,
                               [i["id"] for i in opened], sum(t.status != "ok" for t in ticks)))
    return out


def default_staging(store: Store) -> Path:
    """`<database file>.backfill` for SQLite, `./tailwatch-backfill` otherwise."""
    if store.url.get_backend_name() == "sqlite" and store.url.database not in (None, "", ":memory:"):
        db = Path(store.url.database).expanduser().resolve()
        return db.with_name(db.name + ".backfill")
    return Path("tailwatch-backfill").resolve()


def default_step(config: Config) -> timedelta:
    """The smallest window any service scores: a step never skips a window's close."""
    return min(w for service in config.services for w in service.buckets.windows)


def staged_kinds(service: Service) -> tuple[str, ...]:
    """The record kinds a tick of `service` reads from its sources (labels only with a `quality:` section)."""
    return tuple(kind for kind in KINDS if getattr(service.sources, kind) is not None
                 and (kind != "labels" or service.quality is not None))


def run(config: Config, store: Store, since: datetime, until: datetime, *, step: timedelta | None = None,
        staging: Path | None = None, observe: Observer | None = None, max_steps: int | None = None) -> Result:
    """Replay [since, until) by `step` (default `default_step`), resuming an unfinished run with the same
    range and step; `max_steps` stops early (tests, or a long backfill split over several runs). The caller
    holds the leader lock. `observe` is told the steps done (a resumed run's earlier ones included) and
    the steps in all, after each step."""
    step = step if step is not None else default_step(config)
    if step < timedelta(seconds=1) or step % timedelta(seconds=1):
        raise BackfillError(f"--step must be a whole number of seconds, at least 1s; got {step}")
    if until <= since:
        raise BackfillError(f"--until {until.isoformat()} must be after --since {since.isoformat()}")
    for service in config.services:
        for kind in staged_kinds(service):
            source = getattr(service.sources, kind)
            if not isinstance(source, FileSource):
                raise BackfillError(f"service {service.name}: the {kind} source is SQL; backfill replays file "
                                    "sources only (the daemon reads a SQL source by its cursor)")
    clocks = _clocks(since, until, step)
    with store.transaction() as session:
        open_run = store.backfills.open(session)
    if open_run is not None:
        if (open_run["since"], open_run["until"], open_run["step_seconds"]) != (since, until, int(step.total_seconds())):
            raise BackfillError(
                f"an unfinished backfill of {open_run['since'].isoformat()} .. {open_run['until'].isoformat()} "
                f"(--step {duration_text(timedelta(seconds=open_run['step_seconds']))}) exists; rerun it with those "
                "arguments to resume it")
        staging = Path(open_run["staging"])
        if not staging.is_dir():
            raise BackfillError(f"the unfinished backfill's staging directory {staging} is gone; it cannot resume")
        run_id, resumed = open_run["id"], open_run["reached"]
        plan = _plan(config, staging, store, clocks)
    else:
        staging = (staging or default_staging(store)).resolve()
        if staging.exists():
            shutil.rmtree(staging)  # left by a run that never committed its start
        plan = _plan(config, staging, store, clocks)
        run_id = _start(store, plan, since, until, step, staging)
        resumed = None

    todo = [t for t in clocks if resumed is None or t > resumed]
    if max_steps is not None:
        todo = todo[:max_steps]
    staged_config = _staged_config(config, staging)
    unsynced = _Unsynced(store)
    synced_at = time.monotonic()
    reached = resumed or since
    stepped = len([t for t in clocks if resumed is not None and t <= resumed])
    if observe is not None:
        observe(stepped, len(clocks))
    for now in todo:
        for f in plan:
            _extend(f, f.cut(now))
        reports = jobs.tick_job(staged_config, unsynced, now)
        # A durable commit syncs every commit before it: an OS crash rewinds to a recorded step.
        durable = time.monotonic() - synced_at >= SYNC_SECONDS
        with store.transaction(durable=durable) as session:
            store.backfills.advance(session, run_id, now)
        synced_at = time.monotonic() if durable else synced_at
        reached = now
        failed = [r for r in reports if r.status != "ok"]
        if failed:
            log.error("backfill step failed", extra={"now": now.isoformat(), "errors": [r.error for r in failed]})
        stepped += 1
        if observe is not None:
            observe(stepped, len(clocks))
    done = reached >= clocks[-1]
    if done:
        _hand_over(store, plan, run_id, reached)
        shutil.rmtree(staging, ignore_errors=True)
    return Result(run_id, len(todo), reached, resumed, done, step)


SPANS = ".spans"  # under the staging directory: the span files' released copies (backfill_spans)
SYNC_SECONDS = 10.0  # at most this much replay is redone after an OS crash or power cut


class _Unsynced:
    """`store` whose transactions do not wait for the disk: a step's commits are atomic and survive a crash
    of the process; an OS crash can undo the last ones, the step's recorded clock with them, and a rerun
    replays them (waiting for the disk at every commit was the largest fixed cost of a small step)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @contextmanager
    def transaction(self, durable: bool = True) -> Iterator[Session]:
        with self._store.transaction(durable=False) as session:
            yield session


def _clocks(since: datetime, until: datetime, step: timedelta) -> list[datetime]:
    n = -(-(until - since) // step)
    return [min(since + (i + 1) * step, until) for i in range(n)]


def _staged_config(config: Config, staging: Path) -> Config:
    services = []
    for service in config.services:
        sources = {kind: getattr(service.sources, kind).model_copy(update={"path": staging / service.name / kind})
                   for kind in staged_kinds(service)}
        services.append(service.model_copy(update={"sources": service.sources.model_copy(update=sources)}))
    return config.model_copy(update={"services": services})


def _plan(config: Config, staging: Path, store: Store, clocks: list[datetime]) -> list[StagedFile]:
    """Each source file's staged copy and its cut points, for a replay stepping through `clocks`."""
    steps = np.array([np.datetime64(pd.Timestamp(t).tz_convert(None), "ns") for t in clocks])
    plan = []
    for service in config.services:
        kinds = staged_kinds(service)
        files = {}
        for kind in kinds:
            source = getattr(service.sources, kind)
            (staging / service.name / kind).mkdir(parents=True, exist_ok=True)
            reader = DirectorySource(f"{service.name}/{kind}", source, config.limits)
            files[kind] = (reader.name, [(path, file_format(path, source.format)) for path in reader.files()])
        spans = files.get("timings", ("", []))
        if spans[1]:
            with store.transaction() as session:
                read = store.offsets.load(session, spans[0])
            for path, fmt in spans[1]:
                if fmt == "otlp" and path.suffix != ".gz":
                    released = backfill_spans.release(path, staging / SPANS / service.name / path.name, steps,
                                                      read.get(_key(path)))
                    plan.append(StagedFile(spans[0], path, staging / service.name / "timings" / path.name,
                                           released.times, released.ends, released))
            files["timings"] = (spans[0], [(p, f) for p, f in spans[1] if f != "otlp" or p.suffix == ".gz"])
        # Predictions first: timings and labels without a time of their own take their prediction's.
        read = {path: _event_rows(path, fmt, "predictions", config, service.sources.predictions)
                for path, fmt in files["predictions"][1]}
        prediction_ts = _first_time_by_request([rows for rows, _ in read.values()])
        for kind in kinds:
            name, paths = files[kind]
            for path, fmt in paths:
                rows, ends = (read.pop(path) if kind == "predictions"
                              else _event_rows(path, fmt, kind, config, getattr(service.sources, kind)))
                if kind != "predictions" and len(rows):
                    rows["time"] = rows["time"].fillna(rows["request_id"].map(prediction_ts))
                times, ends = _visibility(path, rows, ends)
                plan.append(StagedFile(name, path, staging / service.name / kind / path.name, times, ends))
    return plan


def _start(store: Store, plan: list[StagedFile], since: datetime, until: datetime, step: timedelta,
           staging: Path) -> int:
    """Seed each staged file with what the real file's stored offset says was read already, and record the
    run, in one transaction."""
    with store.transaction() as session:
        for source in {f.source for f in plan}:
            stored = store.offsets.load(session, source)
            seeded = []
            for f in (f for f in plan if f.source == source and f.released is None):
                state = stored.get(_key(f.real))
                if state is not None:
                    _extend(f, state.offset, create=True)
                    seeded.append(replace(state, file_key=_key(f.staged), path=str(f.staged)))
            store.offsets.save(session, source, seeded)
        return store.backfills.start(session, since, until, int(step.total_seconds()), str(staging))


def _hand_over(store: Store, plan: list[StagedFile], run_id: int, reached: datetime) -> None:
    """Move the staged files' offsets to the real files and close the run, in one transaction."""
    with store.transaction() as session:
        for source in {f.source for f in plan}:
            stored = store.offsets.load(session, source)
            staged = [f for f in plan if f.source == source and f.staged.exists()]
            moved = []
            for f in staged:
                state = stored.get(_key(f.staged))
                if state is not None and f.released is None:
                    moved.append(replace(state, file_key=_key(f.real), path=str(f.real)))
            for f in (f for f in plan if f.source == source and f.released is not None):
                # A span file's copy is no prefix of it: the daemon goes on after its last replayed line.
                state = backfill_spans.handover(f.real, f.released, stored.get(_key(f.real)))
                if state is not None:
                    moved.append(state)
            store.offsets.delete(session, source, [_key(f.staged) for f in staged])
            store.offsets.save(session, source, moved)
        store.backfills.advance(session, run_id, reached, status="done")


def _key(path: Path) -> str:
    st = path.stat()
    return f"{st.st_dev}:{st.st_ino}"  # the key DirectorySource stores offsets under


def _extend(f: StagedFile, size: int, create: bool = False) -> None:
    """Grow the staged copy to the first `size` bytes of the real file (never shrinks it). Nothing is created
    before it has a byte (unless `create`): an empty Parquet or gzip file is not a file of its type."""
    have = f.staged.stat().st_size if f.staged.exists() else -1
    if have >= size and (have >= 0 or not create):
        return
    with open(f.released.copy if f.released else f.real, "rb") as src, open(f.staged, "ab") as dst:
        src.seek(max(have, 0))
        dst.write(src.read(size - max(have, 0)))


def _visibility(path: Path, rows: pd.DataFrame, ends: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Cut points of a file: (time each prefix is complete, its end in bytes), times non-decreasing.

    `rows` holds each row's `line` and event `time`; `ends` the byte end of each whole line, or None for a
    file that cannot be cut: it is visible whole from the latest time its rows hold (from the start if none)."""
    if ends is None:
        latest = rows["time"].max() if len(rows) else pd.NaT
        at = EPOCH if pd.isna(latest) else np.datetime64(latest.tz_convert(None), "ns")
        return np.array([at]), np.array([path.stat().st_size])
    times = np.full(len(ends), np.datetime64("NaT", "ns"))
    inside = rows[rows["line"] < len(ends)]  # a last line without its newline waits
    times[inside["line"].to_numpy()] = inside["time"].dt.tz_convert(None).to_numpy("datetime64[ns]")
    # A line is visible once every line before it is: the running maximum; no time = as the line before.
    filled = pd.Series(times).ffill().fillna(pd.Timestamp(EPOCH))
    return filled.cummax().to_numpy("datetime64[ns]"), ends


def _event_rows(path: Path, fmt: str, kind: str, config: Config,
                source: FileSource) -> tuple[pd.DataFrame, np.ndarray | None]:
    """Each row's `line` (0-based, in the file), `request_id` (text) and event `time` (UTC, NaT when it has
    none), parsed and put in the contract's shape as the tick does; and the byte end of each whole line, None
    for a file that cannot be cut by line (Parquet, gzip, OTLP)."""
    field = TIME_FIELD[kind]
    wanted = {column_of(source, "request_id"), column_of(source, field)}
    cuttable = fmt in ("jsonl", "csv") and path.suffix != ".gz"
    if fmt == "parquet":
        try:
            names = set(pq.read_schema(path).names)
            frame = to_contract(pq.read_table(path, columns=[c for c in wanted if c in names]).to_pandas(), source)
        except (pa.ArrowInvalid, OSError):  # unreadable: the tick quarantines it, from the first step
            frame = pd.DataFrame()
        frame[LINE] = np.arange(1, len(frame) + 1)
        return _normalized(frame, field), None
    data = path.read_bytes()
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error):
            data = b""
    bom = data.startswith(BOM)
    if bom:
        data = data[len(BOM):]  # as the reader drops it: the first line stays line 1
    if fmt == "jsonl":
        frame = parse_jsonl(data, 0, path.name, config.limits)[0]
    elif fmt == "csv" and b"\n" in data:
        frame = parse_csv(data, data[:data.index(b"\n") + 1], True, 0, path.name, config.limits)[0]
    elif fmt == "otlp":
        frame = parse_otlp(data, source=path.name)[0]
        frame[LINE] = np.arange(1, len(frame) + 1)
    else:
        frame = pd.DataFrame({LINE: []})
    frame = to_contract(frame, source)
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10) + 1 if cuttable else None
    if ends is not None and bom:
        ends = ends + len(BOM)
    return _normalized(frame, field), ends


def _normalized(frame: pd.DataFrame, field: str) -> pd.DataFrame:
    ids = frame["request_id"] if "request_id" in frame else pd.Series(None, index=frame.index, dtype=object)
    return pd.DataFrame({
        "line": frame[LINE].to_numpy(np.int64) - 1,
        "request_id": _request_ids(ids),
        "time": _to_times(frame[field]) if field in frame else pd.Series(pd.NaT, index=frame.index,
                                                                           dtype="datetime64[ns, UTC]"),
    }).reset_index(drop=True)


def _request_ids(ids: pd.Series) -> pd.Series:
    """Request ids as text (None where missing); a column of text is kept as it is."""
    ids = ids.astype(object).where(ids.notna(), None)
    if pd.api.types.infer_dtype(ids, skipna=True) in ("string", "empty"):
        return ids
    return ids.map(_text, na_action="ignore")


def _text(value) -> str:
    """A request id as the validator keeps it: text, integral floats without `.0`."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _first_time_by_request(frames: list[pd.DataFrame]) -> pd.Series:
    """request_id -> the event time of its first timed prediction (an index lookup for `Series.map`)."""
    rows = pd.concat([f for f in frames if len(f)] or [pd.DataFrame({"request_id": [], "time": []})])
    rows = rows[rows["time"].notna() & rows["request_id"].notna()]
    rows = rows.drop_duplicates("request_id", keep="first")
    return pd.Series(rows["time"].to_numpy(), index=rows["request_id"].to_numpy(), dtype="datetime64[ns, UTC]")


def _to_times(raw: pd.Series) -> pd.Series:
    """RFC 3339 text, epoch seconds or parsed timestamps -> UTC timestamps (NaT where unreadable)."""
    raw = raw.reset_index(drop=True)
    if isinstance(raw.dtype, pd.ArrowDtype):
        raw = raw.astype(object)
    if pd.api.types.is_datetime64_any_dtype(raw):
        return raw.dt.tz_localize("UTC") if raw.dt.tz is None else raw.dt.tz_convert("UTC")
    values = raw.astype(object)
    # Columns of one type take one vectorized path; a column that mixes them is sorted value by value.
    inferred = pd.api.types.infer_dtype(values, skipna=True)
    stamps = (values.map(lambda v: isinstance(v, datetime)) if inferred not in ("string", "floating", "integer")
              else pd.Series(False, index=values.index))
    numeric = pd.to_numeric(values.where(~stamps), errors="coerce")
    # The contract's own epoch conversion: pandas' unit="s" path can raise on NaN (it rounds unset memory).
    as_epoch = _from_epoch(numeric.astype(float))
    if inferred in ("floating", "integer"):
        return as_epoch
    text = values if inferred == "string" else values.where(values.map(lambda v: isinstance(v, str)))
    as_text = pd.to_datetime(text, utc=True, format="ISO8601", errors="coerce")
    out = as_text.fillna(as_epoch)
    if stamps.any():
        out[stamps] = pd.to_datetime(values[stamps].tolist(), utc=True)
    return out
