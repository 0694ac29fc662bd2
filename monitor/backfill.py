"""`tailwatch backfill --since --until`: replay the history in the configured file sources as live ticks
would have seen it, with a clock stepping by `daemon.interval`.

Each source file is rebuilt in a staging directory as it grew: at clock t a line is there when it and every
line before it in its file were written by t (their event time: `ts`, or `start_ts` for timings). Each step
appends what became visible and runs the same tick job as the daemon (`jobs.tick_job`) against the staged
files, then records the clock it reached; a rerun with the same arguments resumes after the last recorded
step (redoing a step reads nothing new, so nothing counts twice). At the end the staged files' offsets are
handed to the real files in one transaction, so the daemon goes on with the rows after `until` exactly once.

Lines that carry no readable time are visible with the line before them. Files that cannot be cut by line
(Parquet, gzip, OTLP) are visible whole at the first step. SQL sources are not replayed: the daemon reads
them by cursor.
"""

from __future__ import annotations

import csv
import json
import logging
import shutil
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from monitor import jobs
from monitor.config import Config, FileSource
from monitor.sources import DirectorySource, file_format
from monitor.validate import _from_epoch
from storage.store import Store

log = logging.getLogger(__name__)

TIME_FIELD = {"predictions": "ts", "timings": "start_ts", "labels": "label_ts"}
KINDS = ("predictions", "timings")  # labels are read by the nightly job, not by ticks


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


def default_staging(store: Store) -> Path:
    """`<database file>.backfill` for SQLite, `./tailwatch-backfill` otherwise."""
    if store.url.get_backend_name() == "sqlite" and store.url.database not in (None, "", ":memory:"):
        db = Path(store.url.database).expanduser().resolve()
        return db.with_name(db.name + ".backfill")
    return Path("tailwatch-backfill").resolve()


def run(config: Config, store: Store, since: datetime, until: datetime, *, staging: Path | None = None,
        console: Console | None = None, max_steps: int | None = None) -> Result:
    """Replay [since, until) (resuming an unfinished run with the same range); `max_steps` stops early
    (tests, or a long backfill split over several runs). The caller holds the leader lock."""
    step = config.daemon.interval
    if until <= since:
        raise BackfillError(f"--until {until.isoformat()} must be after --since {since.isoformat()}")
    for service in config.services:
        for kind in KINDS:
            source = getattr(service.sources, kind)
            if source is not None and not isinstance(source, FileSource):
                raise BackfillError(f"service {service.name}: the {kind} source is SQL; backfill replays file "
                                    "sources only (the daemon reads a SQL source by its cursor)")
    with store.transaction() as session:
        open_run = store.open_backfill(session)
    if open_run is not None:
        if (open_run["since"], open_run["until"], open_run["step_seconds"]) != (since, until, int(step.total_seconds())):
            raise BackfillError(
                f"an unfinished backfill of {open_run['since'].isoformat()} .. {open_run['until'].isoformat()} "
                f"(step {open_run['step_seconds']}s) exists; rerun it with those arguments to resume it")
        staging = Path(open_run["staging"])
        if not staging.is_dir():
            raise BackfillError(f"the unfinished backfill's staging directory {staging} is gone; it cannot resume")
        run_id, resumed = open_run["id"], open_run["reached"]
        plan = _plan(config, staging, store)
    else:
        staging = (staging or default_staging(store)).resolve()
        if staging.exists():
            shutil.rmtree(staging)  # left by a run that never committed its start
        plan = _plan(config, staging, store)
        run_id = _start(store, plan, since, until, step, staging)
        resumed = None

    clocks = _clocks(since, until, step)
    todo = [t for t in clocks if resumed is None or t > resumed]
    if max_steps is not None:
        todo = todo[:max_steps]
    staged_config = _staged_config(config, staging)
    columns = (TextColumn("[bold]backfill[/] {task.fields[clock]}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("steps"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    reached = resumed or since
    with Progress(*columns, console=console, disable=console is None, transient=False) as progress:
        task = progress.add_task("backfill", total=len(clocks), completed=len(clocks) - len(
            [t for t in clocks if resumed is None or t > resumed]), clock=f"from {since:%Y-%m-%d %H:%M}")
        for now in todo:
            for f in plan:
                _extend(f, f.cut(now))
            reports = jobs.tick_job(staged_config, store, now)
            with store.transaction() as session:
                store.advance_backfill(session, run_id, now)
            reached = now
            failed = [r for r in reports if r.status != "ok"]
            if failed:
                log.error("backfill step failed", extra={"now": now.isoformat(), "errors": [r.error for r in failed]})
            progress.update(task, advance=1, clock=f"{now:%Y-%m-%d %H:%M}")
    done = reached >= clocks[-1]
    if done:
        _hand_over(store, plan, run_id, reached)
        shutil.rmtree(staging, ignore_errors=True)
    return Result(run_id, len(todo), reached, resumed, done)


def _clocks(since: datetime, until: datetime, step: timedelta) -> list[datetime]:
    n = -(-(until - since) // step)
    return [min(since + (i + 1) * step, until) for i in range(n)]


def _staged_config(config: Config, staging: Path) -> Config:
    services = []
    for service in config.services:
        sources = {kind: getattr(service.sources, kind).model_copy(update={"path": staging / service.name / kind})
                   for kind in KINDS if getattr(service.sources, kind) is not None}
        services.append(service.model_copy(update={"sources": service.sources.model_copy(update=sources)}))
    return config.model_copy(update={"services": services})


def _plan(config: Config, staging: Path, store: Store) -> list[StagedFile]:
    plan = []
    for service in config.services:
        for kind in KINDS:
            source = getattr(service.sources, kind)
            if source is None:
                continue
            (staging / service.name / kind).mkdir(parents=True, exist_ok=True)
            reader = DirectorySource(f"{service.name}/{kind}", source, config.limits)
            for path in reader.files():
                times, ends = _visibility(path, file_format(path, source.format), TIME_FIELD[kind])
                plan.append(StagedFile(reader.name, path, staging / service.name / kind / path.name, times, ends))
    return plan


def _start(store: Store, plan: list[StagedFile], since: datetime, until: datetime, step: timedelta,
           staging: Path) -> int:
    """Seed each staged file with what the real file's stored offset says was read already, and record the
    run, in one transaction."""
    with store.transaction() as session:
        for source in {f.source for f in plan}:
            stored = store.load_offsets(session, source)
            seeded = []
            for f in (f for f in plan if f.source == source):
                state = stored.get(_key(f.real))
                _extend(f, state.offset if state is not None else 0)
                if state is not None:
                    seeded.append(replace(state, file_key=_key(f.staged), path=str(f.staged)))
            store.save_offsets(session, source, seeded)
        return store.start_backfill(session, since, until, int(step.total_seconds()), str(staging))


def _hand_over(store: Store, plan: list[StagedFile], run_id: int, reached: datetime) -> None:
    """Move the staged files' offsets to the real files and close the run, in one transaction."""
    with store.transaction() as session:
        for source in {f.source for f in plan}:
            stored = store.load_offsets(session, source)
            moved = []
            for f in (f for f in plan if f.source == source):
                state = stored.get(_key(f.staged))
                if state is not None:
                    moved.append(replace(state, file_key=_key(f.real), path=str(f.real)))
            store.delete_offsets(session, source, [_key(f.staged) for f in plan if f.source == source])
            store.save_offsets(session, source, moved)
        store.advance_backfill(session, run_id, reached, status="done")


def _key(path: Path) -> str:
    st = path.stat()
    return f"{st.st_dev}:{st.st_ino}"  # the key DirectorySource stores offsets under


def _extend(f: StagedFile, size: int) -> None:
    """Grow the staged copy to the first `size` bytes of the real file (never shrinks it)."""
    have = f.staged.stat().st_size if f.staged.exists() else -1
    if have >= size and have >= 0:
        return
    with open(f.real, "rb") as src, open(f.staged, "ab") as dst:
        src.seek(max(have, 0))
        dst.write(src.read(size - max(have, 0)))


def _visibility(path: Path, fmt: str, field: str) -> tuple[np.ndarray, np.ndarray]:
    """Cut points of a file: (time each prefix is complete, its end in bytes), times non-decreasing."""
    size = path.stat().st_size
    if fmt not in ("jsonl", "csv") or path.suffix == ".gz":
        return np.array(["1970-01-01"], "datetime64[ns]"), np.array([size])
    data = path.read_bytes()
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10) + 1  # a line without newline waits
    lines = [data[a:b] for a, b in zip(np.r_[0, ends[:-1]], ends, strict=True)]
    if fmt == "jsonl":
        raw = [_json_time(line, field) for line in lines]
    else:
        raw = _csv_times(lines, field)
    times = _to_times(raw)
    # A line is visible once every line before it is: the running maximum; no time = as the line before.
    filled = pd.Series(times).ffill().fillna(pd.Timestamp("1970-01-01", tz="UTC"))
    cummax = filled.cummax().dt.tz_convert(None).to_numpy("datetime64[ns]")
    return cummax, ends


def _json_time(line: bytes, field: str):
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value.get(field) if isinstance(value, dict) else None


def _csv_times(lines: list[bytes], field: str) -> list:
    if not lines:
        return []
    header = next(csv.reader([lines[0].decode("utf-8", "replace").lstrip("\ufeff")]))
    if field not in header:
        return [None] * len(lines)
    idx = header.index(field)
    out: list = [None]  # the header: visible from the start
    for line in lines[1:]:
        row = next(csv.reader([line.decode("utf-8", "replace")]), [])
        out.append(row[idx] if idx < len(row) else None)
    return out


def _to_times(raw: list) -> pd.Series:
    """RFC 3339 text or epoch seconds -> UTC timestamps (NaT where unreadable)."""
    numeric = pd.to_numeric(pd.Series(raw, dtype=object), errors="coerce")
    # The contract's own epoch conversion: pandas' unit="s" path can raise on NaN (it rounds unset memory).
    as_epoch = _from_epoch(numeric.astype(float))
    text = pd.Series([r if isinstance(r, str) else None for r in raw], dtype=object)
    as_text = pd.to_datetime(text, utc=True, format="ISO8601", errors="coerce")
    return as_text.fillna(as_epoch)
