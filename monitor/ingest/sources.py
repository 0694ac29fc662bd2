"""Sources: read new rows incrementally from a growing directory of files or from a SQL table.

Each read yields `Batch`es of at most `limits.chunk_rows` rows (memory stays bounded whatever the
backlog) together with the offset state that marks them consumed. The caller commits a batch's results
and its offsets in one transaction, so a restart reads every row exactly once.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import json
import os
import re
import stat
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from monitor.config import FileSource, Limits, SqlSource
from monitor.contract import Reason, Reject, excerpt
from monitor.ingest.frame import is_text
from storage.store import OffsetState

LINE = "_line"  # column carrying each row's 1-based line (or row) number within its file
OVERSIZE = "_oversize"  # present, and true on a row, when one of its text fields passes limits.max_field_chars
FILE = "_file"  # column naming each row's file, in a batch of small files read together
FINGERPRINT_BYTES = 256  # a fingerprint covers at least this many first bytes (see _fingerprint_of)
_MAX_FP = 64 << 10  # ...and at most this many; a file no longer than this is read whole in one call
_SMALL_FILES = 4096  # small files parsed (and their offsets committed) together, at most
_JSON_BLOCK_LINES = 4096  # lines per parse call; a bad line costs a re-parse of at most this many lines
_ERROR_ROW = re.compile(r"in row (\d+)$")
_WORKERS = max(1, min(4, os.cpu_count() or 1))  # pyarrow releases the GIL while parsing a block
# JSON Lines chunks a read holds at once: the next batch's, and the one read and queued while it parses.
_CHUNKS_AHEAD = 2
_SCAN_BYTES = 64 << 10  # bytes per numpy call when scanning a buffer (see _scan)
_BOM = b"\xef\xbb\xbf"
_ROTATED = re.compile(r"(\.\d+)?(\.gz)?$")
# Deeper JSON is quarantined as oversize_field (see _parse_json_lines); real records nest 2-3 levels.
MAX_JSON_DEPTH = 64
# pyarrow parsed 4,000 levels and crashed the process at 10,000 (on a thread, pyarrow 26): a line shorter
# than this, which cannot open more levels than it has bytes, is safe to hand to it before its depth is known.
_SAFE_LINE_BYTES = 1024


# Waits for a JSON Lines chunk's blocks: (rows in one Arrow table, the few rows of other types, rejects).
_Parsed = Callable[[], tuple[pa.Table | None, pd.DataFrame, list[Reject]]]


@dataclass
class Batch:
    """Rows parsed from one stretch of one file (or one query), not yet validated against the contract."""

    source: str
    file: str  # file name (or table name) used in quarantine positions
    frame: pd.DataFrame  # raw parsed rows, with LINE (with `table`: the few rows whose types differ from it)
    rejects: list[Reject]
    offset: OffsetState | None  # the state to commit once this batch's results are stored (None: nothing read)
    events: list[str] = field(default_factory=list)  # e.g. "truncated", "replaced"
    table: pa.Table | None = None  # raw parsed rows kept in Arrow (JSONL, Parquet), with LINE
    more: list[OffsetState] = field(default_factory=list)  # the other files' states, for small files read together

    @property
    def offsets(self) -> list[OffsetState]:
        """Every offset state this batch consumed."""
        return ([self.offset] if self.offset is not None else []) + self.more

    @property
    def rows_read(self) -> int:
        return len(self.frame) + len(self.rejects) + (self.table.num_rows if self.table is not None else 0)


def file_format(path: Path, declared: str) -> str:
    """jsonl / csv / parquet / otlp for a file, from the config or from its name."""
    return _format_of(path.name, declared)


def _format_of(name: str, declared: str) -> str:
    if declared != "auto":
        return declared
    # Rotated copies keep their type: app.jsonl.1, app.jsonl.2.gz.
    name = name.lower()
    if name[-1:].isdigit() or name.endswith(".gz"):  # the only names _ROTATED changes
        name = _ROTATED.sub("", name)
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if name.endswith((".csv", ".tsv")):
        return "csv"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    return "unknown"


@dataclass(slots=True)
class _Plan:
    """One file of a listing: where it is, what it is, and the state its read starts from."""

    where: str  # its path as listed (a Path is made only for the files read on their own)
    name: str
    # From its one fstat: bytes and modification time (ns), and its identity `<device>:<inode>`. The stat
    # result itself is not kept: one object fewer per file for the garbage collector to scan, many times.
    size: int
    mtime_ns: int
    key: str
    fmt: str
    head: bytes  # the first bytes (decompressed for .gz; the whole file when `whole`)
    whole: bool  # `head` holds the entire (decompressed) file
    fingerprint: str | None
    claims: str | None = None  # the stored state it continues (its own key, or the file it is a copy of)
    state: OffsetState | None = None
    events: tuple[str, ...] = ()  # (a tuple: most files have none, and an empty tuple is no object of its own)
    parquet: pq.ParquetFile | None = None
    error: str | None = None  # why a Parquet file could not be opened

    @property
    def path(self) -> Path:
        return Path(self.where)

    @property
    def gz(self) -> bool:
        return self.name.endswith(".gz")


class DirectorySource:
    """A directory of growing files, each known by its identity (device, inode and a fingerprint of its
    first bytes), so a rename, a link, a compressed rotation or a copy is never read twice."""

    def __init__(self, name: str, config: FileSource, limits: Limits):
        self.name, self.config, self.limits = name, config, limits

    def files(self) -> list[Path]:
        """Matching files, oldest first (mtime, then name); links leaving the directory left out unless
        the source follows them."""
        found = []
        for path, name, _ in self._listing()[0]:
            try:
                found.append((os.stat(path).st_mtime_ns, name, Path(path)))
            except OSError:
                continue
        return [path for _, _, path in sorted(found, key=lambda f: f[:2])]

    def _listing(self) -> tuple[list[tuple[str, str, bool]], list[tuple[Path, str]]]:
        """(path, name, is a link) of each matching regular file (or link to one), in directory order; and
        the names left out with the reason (a link out of the directory, a link that cannot be followed).
        No file but a link is stat'ed here: a file's one stat is the `fstat` of its read."""
        root, pattern = self.config.path, self.config.pattern
        real_root = os.path.realpath(root)
        found: list[tuple[str, str, bool]] = []
        skipped: list[tuple[Path, str]] = []
        if "/" in pattern or "**" in pattern:
            entries = [(str(p), p.name, p.is_symlink(), p.is_file()) for p in root.glob(pattern)]
        else:
            # One directory read: os.scandir knows which entries are links and which are files for free.
            match = re.compile(fnmatch.translate(pattern)).match
            with os.scandir(root) as it:
                entries = [e for e in it if match(e.name)]
            plain = [e for e in entries if e.is_file(follow_symlinks=False)]
            if len(plain) == len(entries):  # the usual directory: no link to look at
                return [(e.path, e.name, False) for e in plain], skipped
            entries = [(e.path, e.name, e.is_symlink(), e.is_file(follow_symlinks=False)) for e in entries]
        for path, name, link, regular in entries:
            if link:
                if not self.config.follow_links:
                    target = os.path.realpath(path)
                    if os.path.commonpath([real_root, target]) != real_root:
                        skipped.append((Path(path), f"a link out of the source directory, not followed: {target}"))
                        continue
                try:
                    regular = stat.S_ISREG(os.stat(path).st_mode)
                except FileNotFoundError:
                    continue  # a dangling link points nowhere: nothing to read
                except OSError as exc:
                    skipped.append((Path(path), _os_error(exc)))
                    continue
            if regular:
                found.append((path, name, link))
        return found, skipped

    def read(self, offsets: dict[str, OffsetState]) -> Iterator[Batch]:
        """New rows of every file since `offsets`, chunk by chunk; a file that cannot be read is reported as
        a `source_error` batch (no offset: retried next read) and the others are read."""
        own: set[int] = set()  # the pool's threads
        pool = ThreadPoolExecutor(_WORKERS, thread_name_prefix="tailwatch-parse",
                                  initializer=lambda: own.add(threading.get_ident()))
        try:
            saved: set[str] = set()  # keys whose state a batch carried
            listed, skipped = self._listing()
            for path, why in skipped:
                yield self._problem(path, why)
            plans: list[_Plan] = []
            keys: set[str] = set()
            for path, name, _ in listed:
                try:
                    plan = self._plan(path, name)
                except OSError as exc:  # unreadable, or vanished since the listing
                    yield self._problem(Path(path), _os_error(exc))
                    continue
                if plan.key in keys:
                    continue  # another name (a link) of a file already read: one read per identity
                keys.add(plan.key)
                plans.append(plan)
            plans.sort(key=lambda p: (p.mtime_ns, p.name))  # oldest first
            claimed = _claim(plans, offsets)
            for batch in self._read_claimed(claimed, offsets, pool):
                saved.update(s.file_key for s in batch.offsets)
                yield batch
            # A file whose state changed without a row to read (a compressed rotation or a copy that holds
            # nothing new, a rename, a longer fingerprint) keeps it: next time it is known as itself.
            for plan in claimed:
                if plan.key not in saved and plan.state != offsets.get(plan.key):
                    yield Batch(self.name, plan.name, _empty_frame(), [], plan.state, list(plan.events))
        finally:
            # The caller stopped early or a parse failed: blocks still queued are dropped, running ones
            # (a block each) are waited for, so no thread outlives the read. Closed on one of its own
            # threads (the garbage collector runs wherever it is triggered), the read cannot wait for that
            # thread: the others end after their block.
            pool.shutdown(wait=threading.get_ident() not in own, cancel_futures=True)

    def _read_claimed(self, claimed: list[_Plan], offsets: dict[str, OffsetState],
                      pool: ThreadPoolExecutor) -> Iterator[Batch]:
        """The batches of the files to read, small files together."""
        small: list[_Plan] = []
        held_bytes = held_lines = 0  # of `small`
        group = None  # the format (and CSV header) of `small`
        max_bytes, max_lines = self.limits.chunk_bytes, self.limits.chunk_rows
        for plan in claimed:
            size = self._small_size(plan)
            if size is not None:
                mine = _group(plan)
                if small and (len(small) >= _SMALL_FILES or mine != group or held_bytes + size[0] > max_bytes
                              or held_lines + size[1] > max_lines):
                    yield from self._small_batches(small, pool)
                    small, held_bytes, held_lines = [], 0, 0
                small.append(plan)
                group = mine
                held_bytes += size[0]
                held_lines += size[1]
                continue
            if small:
                yield from self._small_batches(small, pool)
                small, held_bytes, held_lines = [], 0, 0
            try:
                yield from self._read_file(plan, offsets, pool)
            except OSError as exc:
                yield self._problem(plan.path, _os_error(exc))
        if small:
            yield from self._small_batches(small, pool)

    def _problem(self, path: Path, why: str) -> Batch:
        """A file that could not be read: one `source_error` reject with its path and the OS error."""
        reject = Reject(str(path), Reason.source_error, excerpt(why))
        return Batch(self.name, path.name, _empty_frame(), [reject], None, [])

    def _plan(self, path: str, name: str) -> _Plan:
        """Open the file once: its identity (fstat), its first bytes (all of a small file) for its fingerprint,
        and its rows if small. OSError when it cannot be opened or read."""
        fmt = _format_of(name, self.config.format)
        gz = name.endswith(".gz")
        if fmt != "parquet" and not gz:
            # A bare descriptor: no file object to build and tear down for the many small files of a directory.
            fd = os.open(path, os.O_RDONLY)
            try:
                st = os.fstat(fd)
                head = os.read(fd, min(st.st_size, _MAX_FP) + 1)
            finally:
                os.close(fd)
            head, whole = head[:_MAX_FP], len(head) <= _MAX_FP
            return _Plan(path, name, st.st_size, st.st_mtime_ns, f"{st.st_dev}:{st.st_ino}", fmt, head, whole,
                         _fingerprint_of(head))
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            identity = (st.st_size, st.st_mtime_ns, f"{st.st_dev}:{st.st_ino}")
            if fmt != "parquet":
                head, whole = _gzip_head(fh)
                return _Plan(path, name, *identity, fmt, head, whole, _fingerprint_of(head))
            # A compressed rotation is decompressed in memory: Parquet needs random access.
            source = pa.BufferReader(gzip.decompress(fh.read())) if gz else path
        try:
            pf = _open_parquet(source)
        except (pa.ArrowInvalid, OSError, EOFError, zlib.error) as exc:
            # No footer yet (still being written), or not Parquet at all: see _read_parquet.
            return _Plan(path, name, *identity, fmt, b"", False, None, error=str(exc))
        return _Plan(path, name, *identity, fmt, b"", False, None, parquet=pf)

    def _small_size(self, plan: _Plan) -> tuple[int, int] | None:
        """Bytes and lines left to read in a file held whole, when they fit in one batch (else None)."""
        if not plan.whole or plan.fmt not in ("jsonl", "csv") or plan.events:
            return None
        rest = len(plan.head) - plan.state.offset
        if rest > self.limits.chunk_bytes:
            return None
        lines = plan.head.count(b"\n", plan.state.offset)
        return (rest, lines) if lines <= self.limits.chunk_rows else None

    def _read_file(self, plan: _Plan, offsets: dict[str, OffsetState], pool: ThreadPoolExecutor) -> Iterator[Batch]:
        path, state, events, fmt = plan.path, plan.state, list(plan.events), plan.fmt
        if fmt == "parquet":
            yield from self._read_parquet(plan, offsets)
        elif fmt in ("jsonl", "csv", "otlp"):
            yield from self._read_lines(path, state, events, fmt, pool)
        # Files of an unknown type are skipped: the pattern chose them, so say so once per read.
        elif state.offset == 0 and state.line == 0:
            size = plan.size
            yield Batch(self.name, path.name, pd.DataFrame({LINE: []}),
                        [Reject(path.name, Reason.unparseable, f"unknown file type: {path.name}")],
                        replace(state, offset=size, line=1, size=size), events)

    def _small_batches(self, plans: list[_Plan], pool: ThreadPoolExecutor) -> Iterator[Batch]:
        """Small files of one format (and CSV header) parsed together: one parse and one validation for many
        files. Rows carry FILE and their own line numbers; each file's offset goes with the batch."""
        fmt = plans[0].fmt
        csv = fmt == "csv"
        header = _header(plans[0].head) if csv else None
        if csv and header is None:
            return  # header not complete yet (the files of a group share it)
        parts: list[bytes] = []
        names: list[str] = []
        starts: list[int] = []  # first line of each piece within the joined buffer (0-based)
        bases: list[int] = []  # line number in its file just before its piece's first line
        states: list[OffsetState] = []
        total = 0
        for plan in plans:
            state = plan.state
            start = state.offset
            end = plan.head.rfind(b"\n", start) + 1  # after the last whole line
            if end <= start:
                continue
            body = plan.head[start:end]
            lines = body.count(b"\n")
            base = state.line
            if not start:
                if body.startswith(_BOM):
                    body = body[len(_BOM):]
                if csv:
                    body, base = body[body.index(b"\n") + 1:], base + 1
            names.append(plan.name)
            starts.append(total)
            bases.append(base)
            parts.append(body)
            total += lines - (base - state.line)  # the header line is no row
            states.append(OffsetState(state.file_key, state.path, end, state.line + lines, state.cursor,
                                      state.fingerprint, end))
        if not states:
            return
        buf = b"".join(parts)
        if fmt == "jsonl":
            parsed, _ = _start_jsonl(buf, 0, "", self.limits, pool)
            table, frame, rejects = parsed()
        else:
            frame, rejects, _ = parse_csv(buf, header, False, 0, "", self.limits)
            table = None
        first, where = np.asarray(starts, dtype=np.int64), np.asarray(bases, dtype=np.int64)

        def locate(lines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            piece = np.searchsorted(first, lines - 1, side="right") - 1
            return piece, lines - first[piece] + where[piece]

        dictionary = pa.array(names, pa.string())
        if table is not None:
            piece, lines = locate(table[LINE].to_numpy())
            table = table.set_column(table.column_names.index(LINE), LINE, pa.array(lines, pa.int64()))
            table = table.append_column(FILE, pa.DictionaryArray.from_arrays(pa.array(piece, pa.int32()), dictionary))
        if len(frame):
            piece, lines = locate(frame[LINE].to_numpy())
            frame[LINE] = lines
            frame[FILE] = pd.Categorical.from_codes(piece, categories=names)
        moved = []
        for r in rejects:
            piece, line = locate(np.array([int(r.position.rsplit(":", 1)[1])]))
            moved.append(Reject(f"{names[piece[0]]}:{line[0]}", r.reason, r.excerpt))
        yield Batch(self.name, names[0] if len(names) == 1 else "", frame, moved, states[0], [], table, states[1:])

    def _read_parquet(self, plan: _Plan, offsets: dict[str, OffsetState]) -> Iterator[Batch]:
        path, state, events, pf = plan.path, plan.state, list(plan.events), plan.parquet
        seen = plan.claims in offsets
        size = plan.size
        if pf is None:
            # No footer yet: a Parquet file still being written is read once it is complete. One that stays
            # unreadable at the same size from one tick to the next is broken: quarantined once, as a file.
            if not seen:
                yield Batch(self.name, path.name, pd.DataFrame({LINE: []}), [], replace(state, size=size), events)
            elif state.size == size and state.offset < size:
                reject = Reject(path.name, Reason.unparseable, excerpt(f"not a readable Parquet file: {plan.error}"))
                yield Batch(self.name, path.name, pd.DataFrame({LINE: []}), [reject],
                            replace(state, offset=size, size=size), events)
            elif state.size != size:
                yield Batch(self.name, path.name, pd.DataFrame({LINE: []}), [], replace(state, size=size), events)
            return
        if state.line >= pf.metadata.num_rows:
            return
        row = 0
        for rb in pf.iter_batches(batch_size=self.limits.chunk_rows):
            start, row = row, row + rb.num_rows
            if row <= state.line:
                continue
            table = pa.Table.from_batches([rb]).slice(max(0, state.line - start))
            first = max(start, state.line)
            table = _flag_oversize(table, self.limits.max_field_chars)
            table = table.append_column(LINE, pa.array(np.arange(first + 1, row + 1, dtype=np.int64)))
            yield Batch(self.name, path.name, _empty_frame(), [],
                        replace(state, line=row, offset=size, size=size), events, table)
            events = []

    def _read_lines(self, path: Path, state: OffsetState, events: list[str], fmt: str,
                    pool: ThreadPoolExecutor) -> Iterator[Batch]:
        header = None
        if fmt == "csv":
            header = _first_line(path)
            if header is None:
                return  # header not complete yet
        # JSON Lines: a chunk's blocks are queued on `pool` and the next chunk is read and queued while they
        # parse, so reading, pre-checks and parsing overlap; batches still come out in order, each with the
        # offsets of its own chunk, and at most _CHUNKS_AHEAD chunks are held at once.
        ahead: deque[tuple[OffsetState, _Parsed]] = deque()
        for buf, offset, newlines in _line_chunks(path, state.offset, self.limits.chunk_bytes,
                                                  self.limits.chunk_rows):
            if state.offset == 0 and buf.startswith(_BOM):
                buf, newlines = buf[len(_BOM):], None
            first_line = state.line
            skip_header = fmt == "csv" and state.offset == 0
            if fmt == "jsonl":
                parsed, lines = _start_jsonl(buf, first_line, path.name, self.limits, pool, newlines)
                state = replace(state, offset=offset, line=first_line + lines, size=offset)
                ahead.append((state, parsed))
                if len(ahead) < _CHUNKS_AHEAD:
                    continue
                yield self._parsed_batch(path, *ahead.popleft(), events)
            else:
                if fmt == "otlp":
                    frame, rejects, lines = parse_otlp_lines(buf, first_line, path.name)
                else:
                    frame, rejects, lines = parse_csv(buf, header, skip_header, first_line, path.name, self.limits)
                state = replace(state, offset=offset, line=first_line + lines, size=offset)
                yield Batch(self.name, path.name, frame, rejects, state, events)
            events = []
        while ahead:
            yield self._parsed_batch(path, *ahead.popleft(), events)
            events = []

    def _parsed_batch(self, path: Path, state: OffsetState, parsed: _Parsed, events: list[str]) -> Batch:
        table, frame, rejects = parsed()
        return Batch(self.name, path.name, frame, rejects, state, events, table)


def _os_error(exc: OSError) -> str:
    return f"{type(exc).__name__}: {exc.strerror or exc}"


def _group(plan: _Plan) -> tuple[str, bytes | None]:
    """Small files parsed together share a format and, for CSV, a header."""
    return plan.fmt, _header(plan.head) if plan.fmt == "csv" else None


def _header(head: bytes) -> bytes | None:
    end = head.find(b"\n")
    return head[:end + 1] if end >= 0 else None


def _claim(plans: list[_Plan], offsets: dict[str, OffsetState]) -> list[_Plan]:
    """Give each file the state its read starts from; returns the files to read this time, in order.

    A file continues its own stored state while its first bytes are unchanged (grown, renamed). A file
    that is new (or whose inode now holds other bytes) continues the stored state whose fingerprint its
    first bytes match: a compressed rotation or a copytruncate copy of a file read before resumes at the
    offset reached. Each stored state is continued by one file per read; a second copy waits.
    """
    taken: set[str] = set()
    fresh: list[_Plan] = []
    for plan in plans:
        mine = offsets.get(plan.key)
        if mine is not None and _continues(plan, mine):
            plan.claims = plan.key
            taken.add(plan.key)
        else:
            if mine is not None:
                plan.events += ("truncated" if _shrunk(plan, mine) else "replaced",)
            fresh.append(plan)
    # Every stored state, those continued by their own file too: a copy of a file read this time waits.
    lengths: dict[int, dict[str, OffsetState]] = {}
    for state in offsets.values():
        if state.fingerprint and not state.fingerprint.startswith(_ROWS):
            lengths.setdefault(_fp_len(state.fingerprint), {})[state.fingerprint] = state
    rows_fp = {s.fingerprint: s for s in offsets.values() if s.fingerprint and s.fingerprint.startswith(_ROWS)}
    longest_first = sorted(lengths.items(), reverse=True)
    out = []
    for plan in plans:
        if plan.claims is None:
            match = _match(plan, longest_first, rows_fp)
            if match is not None and match.file_key in taken:
                continue  # the file it copies is read this time (as itself or as another copy)
            if match is not None:
                plan.claims = match.file_key
                taken.add(match.file_key)
                plan.events += (f"continues {os.path.basename(match.path)}",)
                plan.state = replace(match, file_key=plan.key, path=plan.where)
            elif plan.gz and not plan.whole and len(plan.head) < _MAX_FP:
                continue  # a compressed copy still being written: its start may yet match a file read before
            else:
                plan.state = _fresh(plan)
        else:
            own = offsets[plan.key]
            plan.state = OffsetState(own.file_key, plan.where, own.offset, own.line, own.cursor, own.fingerprint,
                                     own.size)
        if plan.fingerprint is not None and plan.fingerprint != plan.state.fingerprint:
            plan.state = replace(plan.state, fingerprint=plan.fingerprint)
        out.append(plan)
    return out


_ROWS = "rows"  # prefix of a Parquet fingerprint: a hash of its first row, not of its bytes


def _fresh(plan: _Plan) -> OffsetState:
    return OffsetState(plan.key, plan.where, 0, 0, None, plan.fingerprint, plan.size)


def _shrunk(plan: _Plan, state: OffsetState) -> bool:
    """Shorter than the offset read: truncated (a Parquet file only while it has no footer: emptied)."""
    if plan.gz or plan.fmt == "parquet" and plan.parquet is not None:
        return False
    return plan.size < state.offset


def _continues(plan: _Plan, state: OffsetState) -> bool:
    """Whether the file at a stored state's inode is still the file read (grown, or renamed), not a new one."""
    if _shrunk(plan, state):
        return False
    if plan.fmt == "parquet":
        plan.fingerprint = _parquet_fingerprint(plan.parquet) if plan.parquet is not None else None
        if plan.fingerprint is None or not state.fingerprint or not state.fingerprint.startswith(_ROWS):
            return plan.fingerprint is None or state.fingerprint is None or plan.size >= (state.size or 0)
        return plan.fingerprint == state.fingerprint and plan.parquet.metadata.num_rows >= state.line
    if not state.fingerprint or state.fingerprint.startswith(_ROWS) or plan.fingerprint == state.fingerprint:
        return True  # (the same fingerprint: the same first bytes, hashed when the file was opened)
    n = _fp_len(state.fingerprint)
    return len(plan.head) >= n and _hash(plan.head[:n]) == state.fingerprint


def _match(plan: _Plan, longest_first: list[tuple[int, dict[str, OffsetState]]],
           rows_fp: dict[str, OffsetState]) -> OffsetState | None:
    """The stored state (of another file) whose fingerprint this file's first bytes match, longest first
    (`longest_first`: the stored fingerprints by length, longest first)."""
    if plan.fmt == "parquet":
        if plan.parquet is None:
            return None
        plan.fingerprint = _parquet_fingerprint(plan.parquet)
        state = rows_fp.get(plan.fingerprint)
        return state if state is not None and plan.parquet.metadata.num_rows >= state.line else None
    for n, states in longest_first:
        if n > len(plan.head) or n == 0:
            continue
        state = states.get(_hash(plan.head[:n]))
        # A plain copy holds at least the bytes read from the file it copies; a .gz's size says nothing.
        if state is not None and (plan.gz or plan.size >= state.offset):
            return state
    return None


def _fp_len(fingerprint: str) -> int:
    return int(fingerprint.split(":", 1)[0])


def _hash(head: bytes) -> str:
    return f"{len(head)}:{hashlib.sha1(head).hexdigest()}"


def _fingerprint_of(head: bytes) -> str:
    """`<n>:<sha1 of the first n bytes>`: the first two lines (a CSV header and its first row), at least
    FINGERPRINT_BYTES and at most _MAX_FP; tells a replaced or copied file from a grown one."""
    first = head.find(b"\n")
    second = head.find(b"\n", first + 1) if first >= 0 else -1
    end = second + 1 if second >= 0 else len(head)
    return _hash(head[:min(max(FINGERPRINT_BYTES, end), len(head), _MAX_FP)])


def _parquet_fingerprint(pf: pq.ParquetFile) -> str | None:
    """`rows1:<sha1 of the first row>`: a Parquet file rewritten with more rows keeps its first row, while
    its first bytes (page headers, dictionaries) change. None for a file without rows."""
    if pf.metadata.num_rows == 0:
        return None
    first = next(pf.iter_batches(batch_size=1))
    row = pa.Table.from_batches([first.slice(0, 1)])
    return f"{_ROWS}1:{hashlib.sha1(json.dumps(row.to_pylist(), default=str, sort_keys=True).encode()).hexdigest()}"


def _gzip_head(fh) -> tuple[bytes, bool]:
    """The first _MAX_FP decompressed bytes of a .gz file, and whether that is all of it (every member read to
    its end)."""
    parts: list[bytes] = []
    got, partial = 0, False
    decomp = zlib.decompressobj(wbits=47)
    data = b""
    while got <= _MAX_FP:
        if not data:
            data = fh.read(1 << 16)
            if not data:
                break
        piece = decomp.decompress(data, _MAX_FP + 1 - got)
        parts.append(piece)
        got += len(piece)
        partial = True
        if decomp.eof:  # concatenated gzip members
            data, partial = decomp.unused_data, False
            decomp = zlib.decompressobj(wbits=47)
        else:
            data = decomp.unconsumed_tail
    head = b"".join(parts)
    return head[:_MAX_FP], got <= _MAX_FP and not partial


def _first_line(path: Path) -> bytes | None:
    with _open(path) as fh:
        line = fh.readline(1 << 20)
    return line if line.endswith(b"\n") else None


def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _complete_chunks(path: Path, offset: int, chunk_bytes: int,
                     chunk_rows: int | None = None) -> Iterator[tuple[bytes, int]]:
    """Stretches of whole lines after byte `offset` (decompressed offset for .gz), with the end offset.

    A stretch holds at most `chunk_bytes` bytes (unless one line is longer) and `chunk_rows` lines.
    A last line without its newline is left for a later read: it may still be being written.
    """
    for buf, end, _ in _line_chunks(path, offset, chunk_bytes, chunk_rows):
        yield buf, end


def _line_chunks(path: Path, offset: int, chunk_bytes: int,
                 chunk_rows: int | None = None) -> Iterator[tuple[bytes, int, np.ndarray | None]]:
    """`_complete_chunks`, with the position of each newline in the stretch when it was found (else None)."""
    for buf, end in _byte_chunks(path, offset, chunk_bytes):
        if chunk_rows is None or len(buf) <= chunk_rows:  # each line holds a newline: no more lines than bytes
            yield buf, end, None
            continue
        newlines = _newlines(buf)
        if len(newlines) <= chunk_rows:
            yield buf, end, newlines
            continue
        # Narrow lines: cut after every chunk_rows-th newline.
        ends = newlines[chunk_rows - 1::chunk_rows] + 1
        start = end - len(buf)
        prev = 0
        for cut in ends.tolist():
            yield buf[prev:cut], start + cut, None
            prev = cut
        if prev < len(buf):
            yield buf[prev:], end, None


def _newlines(buf: bytes) -> np.ndarray:
    return _scan(np.frombuffer(buf, dtype=np.uint8), lambda piece: piece == 10)


def _scan(arr: np.ndarray, hit: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Positions in `arr` (bytes) where `hit` is true.

    Scanned in pieces of _SCAN_BYTES: temporaries this small are reused from the heap and stay in cache,
    while buffer-sized ones get pages of their own every time, which cost as much to fault in as the scan.
    """
    if not len(arr):
        return np.empty(0, dtype=np.intp)
    return np.concatenate([np.flatnonzero(hit(arr[p:p + _SCAN_BYTES])) + p for p in range(0, len(arr), _SCAN_BYTES)])


def _byte_chunks(path: Path, offset: int, chunk_bytes: int) -> Iterator[tuple[bytes, int]]:
    """`_complete_chunks` by bytes only."""
    if path.suffix != ".gz":
        yield from _plain_chunks(path, offset, chunk_bytes)
        return
    pieces = _gzip_pieces(path, offset)
    # Pieces are gathered in a list and joined once per chunk: `carry += piece` would copy the growing
    # chunk again for every piece.
    parts: list[bytes] = []
    size = 0
    for piece in pieces:
        parts.append(piece)
        size += len(piece)
        if size < chunk_bytes:
            continue
        carry = b"".join(parts)
        while len(carry) >= chunk_bytes:
            cut = carry.rfind(b"\n", 0, chunk_bytes) + 1
            if cut == 0:  # one line longer than a chunk: hand it over whole, the parser quarantines it
                cut = carry.find(b"\n") + 1
                if cut == 0:
                    break
            offset += cut
            yield carry[:cut], offset
            carry = carry[cut:]
        parts, size = [carry], len(carry)
    carry = b"".join(parts)
    cut = carry.rfind(b"\n") + 1
    if cut:
        yield carry if cut == len(carry) else carry[:cut], offset + cut


def _plain_chunks(path: Path, offset: int, chunk_bytes: int) -> Iterator[tuple[bytes, int]]:
    """`_byte_chunks` of an uncompressed file: each chunk read once, at its size, where it starts.

    The end of a chunk (its last newline within `chunk_bytes`) is found in a short read of its tail first,
    so the chunk is read straight into its own buffer: no joining of pieces, no copy of a carried-over rest.
    """
    probe = min(chunk_bytes, 1 << 16)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        while offset < size:
            span = min(chunk_bytes, size - offset)
            fh.seek(offset + span - probe if span > probe else offset)
            tail = fh.read(min(probe, span))
            if len(tail) < min(probe, span):  # the file shrank meanwhile: the next read sees it
                return
            k = tail.rfind(b"\n")
            if k >= 0:
                cut = span - len(tail) + k + 1
                fh.seek(offset)
                buf = fh.read(cut)
                if len(buf) < cut:  # the file shrank meanwhile: the next read sees it
                    return
            else:
                fh.seek(offset)
                buf = fh.read(span)
                cut = buf.rfind(b"\n") + 1
                if cut == 0:
                    if span < chunk_bytes:
                        return  # an unfinished last line: it waits for a later read
                    # One line longer than a chunk: hand it over whole, the parser quarantines it.
                    parts = [buf]
                    while True:
                        more = fh.read(chunk_bytes)
                        if not more:
                            return
                        j = more.find(b"\n")
                        if j >= 0:
                            parts.append(more[:j + 1])
                            break
                        parts.append(more)
                    buf = b"".join(parts)
                    cut = len(buf)
                elif cut < len(buf):
                    buf = buf[:cut]
            offset += cut
            yield buf, offset


def _gzip_pieces(path: Path, offset: int, size: int = 4 << 20) -> Iterator[bytes]:
    """Decompressed bytes after `offset`; a stream still being written yields what is complete so far."""
    skip = offset
    with open(path, "rb") as fh:
        decomp = zlib.decompressobj(wbits=47)
        while raw := fh.read(size):
            while raw:
                out = decomp.decompress(raw)
                raw = b""
                if decomp.eof:  # concatenated gzip members
                    raw = decomp.unused_data
                    decomp = zlib.decompressobj(wbits=47)
                if skip:
                    dropped = min(skip, len(out))
                    out, skip = out[dropped:], skip - dropped
                if out:
                    yield out


def _line_bounds(buf: bytes, newlines: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive, without the newline) of every complete line in `buf`."""
    ends = _newlines(buf) if newlines is None else newlines
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    return starts, ends


def _is_utf8(buf: bytes | memoryview) -> bool:
    """Whether all of `buf` is UTF-8, checked by Arrow's validator (no decoded copy of the buffer)."""
    data = pa.py_buffer(buf)
    offsets = pa.py_buffer(np.array([0, len(buf)], dtype=np.int64).tobytes())
    try:
        pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, data]).cast(pa.large_string())
    except pa.ArrowInvalid:
        return False
    return True


def _bad_utf8_lines(buf: bytes, starts: np.ndarray) -> set[int]:
    """Indexes of lines holding bytes that are not UTF-8 (decoding stops at each and resumes after its line)."""
    bad: set[int] = set()
    pos = 0
    while True:
        try:
            buf[pos:].decode("utf-8")
            return bad
        except UnicodeDecodeError as exc:
            idx = int(np.searchsorted(starts, pos + exc.start, side="right")) - 1
            bad.add(idx)
            if idx + 1 >= len(starts):
                return bad
            pos = int(starts[idx + 1])


def parse_jsonl(buf: bytes, first_line: int, file: str, limits: Limits) -> tuple[pd.DataFrame, list[Reject], int]:
    """Parse whole JSON Lines with pyarrow; a bad line is isolated by the row pyarrow names, not by a slow path.

    Returns the rows (with LINE), the rejected lines, and the number of lines consumed.
    """
    with ThreadPoolExecutor(_WORKERS) as pool:
        parsed, n = _start_jsonl(buf, first_line, file, limits, pool)
        table, odd, rejects = parsed()
    if table is None:
        return odd, rejects, n
    frame = table.to_pandas()
    if len(odd):
        frame = pd.concat([frame, odd], ignore_index=True).sort_values(LINE, kind="stable", ignore_index=True)
    return frame, rejects, n


def _start_jsonl(buf: bytes, first_line: int, file: str, limits: Limits, pool: ThreadPoolExecutor,
                 newlines: np.ndarray | None = None) -> tuple[_Parsed, int]:
    """Queue the blocks of whole JSON Lines on `pool`; returns a function that waits for the blocks and gives
    (rows in one Arrow table, the few rows whose field types differ from it, rejects), and the number of lines.

    Rows and rejects keep the order of their lines. `newlines`: the position of every newline in `buf`, when
    the caller has it already. Everything that scans a block's bytes runs with its block, on `pool`.
    """
    starts, ends = _line_bounds(buf, newlines)
    n = len(ends)
    lengths = ends - starts
    rejects: list[Reject] = []
    skip = np.zeros(n, dtype=bool)
    # Blank lines hold no row; pyarrow drops them, so they are dropped here too to keep line numbers right.
    short = np.flatnonzero(lengths <= 2)
    for i in short:
        if not buf[starts[i]:ends[i]].strip():
            skip[i] = True
    line_cap = limits.max_field_chars * 4 + 1024
    for i in np.flatnonzero(lengths > line_cap):
        skip[i] = True
        rejects.append(Reject(f"{file}:{first_line + i + 1}", Reason.oversize_field, excerpt(buf[starts[i]:starts[i] + 400])))

    blocks = [idx[~skip[idx]] for idx in
              (np.arange(b, min(n, b + _JSON_BLOCK_LINES)) for b in range(0, n, _JSON_BLOCK_LINES))]
    view = memoryview(buf)
    futures = [pool.submit(_parse_json_lines, buf, view, starts, ends, idx, first_line, file)
               for idx in blocks if len(idx)]

    def parsed() -> tuple[pa.Table | None, pd.DataFrame, list[Reject]]:  # on the reading thread, in order
        tables: list[pa.Table] = []
        for future in futures:
            block_tables, bad = future.result()
            tables += block_tables
            rejects.extend(bad)
        return *_combine(tables, limits.max_field_chars), rejects

    return parsed, n


def _parse_json_lines(buf: bytes, view: memoryview, starts: np.ndarray, ends: np.ndarray, idx: np.ndarray,
                      first_line: int, file: str) -> tuple[list[pa.Table], list[Reject]]:
    """One block of lines `idx` (increasing): lines of invalid UTF-8 or nested too deep are rejected, the rest
    parsed into tables (with LINE). Returns the tables and the rejects, in line order within each kind."""
    rejects: list[Reject] = []
    lo, hi = int(starts[idx[0]]), int(ends[idx[-1]])
    if not _is_utf8(view[lo:hi]):
        first = int(idx[0])
        bad = np.isin(idx, [first + i for i in _bad_utf8_lines(buf[lo:hi], starts[first:idx[-1] + 1] - lo)])
        rejects += [Reject(f"{file}:{first_line + i + 1}", Reason.invalid_encoding, excerpt(buf[starts[i]:ends[i]]))
                    for i in idx[bad]]
        idx = idx[~bad]
    # Only lines long enough to crash pyarrow are scanned for their depth first. A shorter line nesting
    # deeper than MAX_JSON_DEPTH shows in the parsed types (or among the lines pyarrow refuses): only then
    # is every line of the block scanned, and the block parsed again without the deep ones.
    deep = _too_deep(buf, starts, ends, idx[ends[idx] - starts[idx] >= _SAFE_LINE_BYTES])
    dropped: list[int] = []
    for exact in (False, True):
        if deep:
            dropped += deep
            idx = idx[~np.isin(idx, deep)]
        tables: list[pa.Table] = []
        refused: list[Reject] = []
        _parse_json_block(buf, view, starts, ends, idx, first_line, file, tables, refused)
        if exact or not refused and all(_nesting(t.schema) <= MAX_JSON_DEPTH for t in tables):
            break
        deep = _too_deep(buf, starts, ends, idx)
        if not deep:  # refused for another reason: what was parsed stands
            break
    rejects += [Reject(f"{file}:{first_line + i + 1}", Reason.oversize_field, excerpt(buf[starts[i]:ends[i]]))
                for i in sorted(dropped)]
    return tables, rejects + refused


def _nesting(schema: pa.Schema) -> int:
    """How deep the JSON objects read as `schema` nest: 1 for the object, one more per struct or list level."""
    deepest = 1
    todo = [(f.type, 2) for f in schema]
    while todo:
        typ, level = todo.pop()
        if pa.types.is_struct(typ):
            deepest = max(deepest, level)
            todo += [(typ.field(i).type, level + 1) for i in range(typ.num_fields)]
        elif pa.types.is_list(typ) or pa.types.is_large_list(typ):
            deepest = max(deepest, level)
            todo.append((typ.value_type, level + 1))
    return deepest


def _too_deep(buf: bytes, starts: np.ndarray, ends: np.ndarray, idx: np.ndarray) -> list[int]:
    """Lines of `idx` (increasing) whose JSON nests deeper than MAX_JSON_DEPTH.

    pyarrow's reader and its conversion to pandas recurse per level and crash the process (a segfault, not
    an exception) somewhere past a few thousand levels, so such lines never reach them.
    """
    if not len(idx):
        return []
    lo, hi = int(starts[idx[0]]), int(ends[idx[-1]])
    if hi - lo <= MAX_JSON_DEPTH:  # each level takes a byte
        return []
    arr = np.frombuffer(buf, dtype=np.uint8, count=hi - lo, offset=lo)
    # '[' (0x5B) and '{' (0x7B) are the only bytes that OR 0x20 makes 0x7B: one comparison instead of two.
    opens = _scan(arr, lambda piece: (piece | 0x20) == 0x7B)
    if len(opens) <= MAX_JSON_DEPTH:
        return []
    # Cheap bound first: a line with few brackets cannot nest deep; only the rest is scanned exactly. (The
    # brackets of a line left out of `idx` count towards the next line of `idx`: that only costs a scan.)
    per_line = np.bincount(np.searchsorted(ends[idx] - lo, opens, side="right"), minlength=len(idx) + 1)
    return [int(i) for i in idx[per_line[:len(idx)] > MAX_JSON_DEPTH]
            if _depth(buf[starts[i]:ends[i]]) > MAX_JSON_DEPTH]


def _depth(line: bytes) -> int:
    """The deepest nesting of arrays and objects in one JSON text (brackets inside strings ignored)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in line:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _read_block(data) -> pa.Table:
    # One block per call, read on this thread: pyarrow's "in row N" then counts from the first line given.
    return pajson.read_json(pa.BufferReader(data), read_options=pajson.ReadOptions(
        use_threads=False, block_size=max(len(data) + 1, 1 << 16)))


def _parse_json_block(buf, view, starts, ends, idx, first_line, file, tables, rejects) -> None:
    """Parse lines `idx`; a line pyarrow refuses is set aside (parsed alone or rejected) and the rest go on."""
    while len(idx):
        contiguous = idx[-1] - idx[0] + 1 == len(idx)
        data = (view[starts[idx[0]]:ends[idx[-1]] + 1] if contiguous
                else b"\n".join(buf[starts[i]:ends[i]] for i in idx) + b"\n")
        try:
            table = _read_block(data)
        except pa.ArrowInvalid as exc:
            if len(idx) == 1:
                i = int(idx[0])
                rejects.append(_reject_line(buf[starts[i]:ends[i]], first_line + i + 1, file, exc))
                return
            found = _ERROR_ROW.search(str(exc))
            row = int(found.group(1)) if found else -1
            if not 0 <= row < len(idx):
                _bisect_json_block(buf, view, starts, ends, idx, first_line, file, tables, rejects)
                return
            # The rows before it parsed; the named row alone either parses (its field types differ from
            # its neighbours': validation decides) or is rejected; parsing resumes after it.
            if row:
                _parse_json_block(buf, view, starts, ends, idx[:row], first_line, file, tables, rejects)
            _parse_json_block(buf, view, starts, ends, idx[row:row + 1], first_line, file, tables, rejects)
            idx = idx[row + 1:]
            continue
        if table.num_rows != len(idx):
            _bisect_json_block(buf, view, starts, ends, idx, first_line, file, tables, rejects)
            return
        tables.append(table.append_column(LINE, pa.array(idx + first_line + 1, type=pa.int64())))
        return


def _bisect_json_block(buf, view, starts, ends, idx, first_line, file, tables, rejects) -> None:
    """Halves until each half parses with one row per line (pyarrow named no row, or rows went missing)."""
    if len(idx) == 1:
        i = int(idx[0])
        rejects.append(_reject_line(buf[starts[i]:ends[i]], first_line + i + 1, file, None))
        return
    half = len(idx) // 2
    _parse_json_block(buf, view, starts, ends, idx[:half], first_line, file, tables, rejects)
    _parse_json_block(buf, view, starts, ends, idx[half:], first_line, file, tables, rejects)


def _reject_line(line: bytes, number: int, file: str, exc: Exception | None) -> Reject:
    """The Reject for one line pyarrow refused (or read as no row)."""
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return Reject(f"{file}:{number}", Reason.invalid_encoding, excerpt(line))
    reason = Reason.unparseable if exc is None else _classify_json(line, exc)
    return Reject(f"{file}:{number}", reason, excerpt(line))


def _classify_json(line: bytes, exc: Exception) -> Reason:
    try:
        value = json.loads(line)
    except ValueError:
        return Reason.unparseable
    if not isinstance(value, dict):
        return Reason.unparseable
    # A JSON object pyarrow refuses alone: a repeated key or a number beyond float range.
    return Reason.wrong_type if "too big" in str(exc) else Reason.unparseable


def _empty_frame() -> pd.DataFrame:
    return pd.DataFrame({LINE: pd.Series([], dtype=np.int64)})


def _to_frame(tables: list[pa.Table], max_chars: int) -> pd.DataFrame:
    """One DataFrame from parsed blocks whose inferred column types may differ, oversize rows flagged."""
    if not tables:
        return _empty_frame()
    try:
        return _flag_oversize(pa.concat_tables(tables, promote_options="permissive"), max_chars).to_pandas()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        # Blocks disagree on a column's type (number here, string there): object columns; validation sorts it
        # out. Made object before the concat, so that no column's type depends on which blocks held only
        # nulls; a column every block holds in one type keeps it.
        frames = [_flag_oversize(t, max_chars).to_pandas() for t in tables]
        types: dict[str, set] = {}
        for f in frames:
            for c in f.columns:
                types.setdefault(c, set()).add(f[c].dtype)
        mixed = {c for c, seen in types.items() if c != LINE and (len(seen) > 1 or any(c not in f for f in frames))}
        return pd.concat([f.astype({c: object for c in f.columns if c in mixed}) for f in frames], ignore_index=True)


def _combine(tables: list[pa.Table], max_chars: int) -> tuple[pa.Table | None, pd.DataFrame]:
    """Parsed blocks as one Arrow table, and apart (as pandas) the few whose column types do not merge with it.

    A line whose field has another type than in its neighbours ends up in a table of its own; it is
    kept apart so that one odd line does not turn a whole column into Python objects.
    """
    if not tables:
        return None, _empty_frame()
    try:
        return _flag_oversize(pa.concat_tables(tables, promote_options="permissive"), max_chars), _empty_frame()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    main: list[pa.Table] = []
    odd: list[pa.Table] = []
    schema = None
    for t in sorted(tables, key=lambda t: -t.num_rows):  # the biggest blocks set the types
        try:
            merged = t.schema if schema is None else pa.unify_schemas([schema, t.schema], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            odd.append(t)
            continue
        schema = merged
        main.append(t)
    main.sort(key=lambda t: t[LINE][0].as_py())
    try:
        table = _flag_oversize(pa.concat_tables(main, promote_options="permissive"), max_chars)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None, _to_frame(tables, max_chars).sort_values(LINE, kind="stable", ignore_index=True)
    return table, _to_frame(odd, max_chars).sort_values(LINE, kind="stable", ignore_index=True)


def _open_parquet(source) -> pq.ParquetFile:
    """The file, its text columns but `request_id` read as dictionaries.

    A dictionary column decodes each distinct text once (most repeat: versions, statuses, categories) and
    reaches fold as category codes, with no text hashed per row; ids are distinct and stay plain text.
    pyarrow takes `read_dictionary` only when a file is opened: the footer read first is handed on.
    """
    metadata = pq.read_metadata(source)
    schema = metadata.schema.to_arrow_schema()
    return pq.ParquetFile(source, metadata=metadata,
                          read_dictionary=[f.name for f in schema if is_text(f.type) and f.name != "request_id"])


def _flag_oversize(table: pa.Table, max_chars: int) -> pa.Table:
    """Add OVERSIZE when a text cell is longer than `max_chars` bytes (checked in Arrow: no Python loop)."""
    over = None
    for col in table.columns:
        t = col.type
        if is_text(t):
            lengths = pc.binary_length(col)
            longest = pc.max(lengths).as_py()
        elif pa.types.is_dictionary(t) and is_text(t.value_type):
            # Each distinct text measured once; the rows' lengths are taken only when one is too long.
            longest = max((pc.max(pc.binary_length(c.dictionary)).as_py() or 0 for c in col.chunks), default=0)
            if longest > max_chars:
                lengths = pa.chunked_array([pc.take(pc.binary_length(c.dictionary), c.indices) for c in col.chunks])
        else:
            continue
        if longest is None or longest <= max_chars:
            continue  # the usual case: no cell to flag, no mask to build
        # A null cell is not oversize; without fill_null a null would hide a hit in another column.
        hit = pc.fill_null(pc.greater(lengths, max_chars), False)
        over = hit if over is None else pc.or_(over, hit)
    if over is None or not pc.any(over).as_py():
        return table
    return table.append_column(OVERSIZE, over)


def parse_csv(buf: bytes, header: bytes, skip_header: bool, first_line: int, file: str,
              limits: Limits) -> tuple[pd.DataFrame, list[Reject], int]:
    """Parse whole CSV lines (header from the file's first line); rows of the wrong width are rejected.

    Values are read as text; validation converts them to their declared types.
    """
    n = buf.count(b"\n")
    if skip_header:
        buf, first_line = buf[buf.index(b"\n") + 1:], first_line + 1
    starts, ends = _line_bounds(buf)
    rejects = [Reject(f"{file}:{first_line + i + 1}", Reason.invalid_encoding, excerpt(buf[starts[i]:ends[i]]))
               for i in sorted(_bad_utf8_lines(buf, starts))]
    keep = np.arange(len(ends), dtype=np.int64)
    # Blank lines hold no row, and pyarrow skips them: dropped here so its row numbers map back to lines.
    blank = [int(i) for i in np.flatnonzero(ends - starts <= 2) if not buf[starts[i]:ends[i]].strip()]
    if rejects or blank:
        keep = np.setdiff1d(keep, [int(r.position.rsplit(":", 1)[1]) - first_line - 1 for r in rejects] + blank)
        buf = b"".join(buf[starts[i]:ends[i] + 1] for i in keep)
    if not len(keep):
        return _empty_frame(), rejects, n
    names = [c.strip() for c in header.decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r\n").split(",")]
    invalid: list[tuple[int, str]] = []

    def on_invalid(row) -> str:
        invalid.append((row.number, row.text or ""))
        return "skip"

    table = pacsv.read_csv(
        io.BytesIO(buf),
        read_options=pacsv.ReadOptions(column_names=names, block_size=8 << 20, use_threads=False),
        parse_options=pacsv.ParseOptions(invalid_row_handler=on_invalid, newlines_in_values=False),
        convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in names}, strings_can_be_null=True),
    )
    # pyarrow numbers the rows of this buffer from 1; map them back to lines of the file.
    dropped = np.array([number - 1 for number, _ in invalid], dtype=np.int64)
    rejects += [Reject(f"{file}:{first_line + int(keep[number - 1]) + 1}", Reason.unparseable, excerpt(text))
                for number, text in invalid]
    frame = _to_frame([table], limits.max_field_chars)
    frame[LINE] = np.delete(keep, dropped) + first_line + 1
    return frame, rejects, n


def parse_otlp_lines(buf: bytes, first_line: int, file: str) -> tuple[pd.DataFrame, list[Reject], int]:
    """Stage timings from OTLP-JSON trace documents (one per line, or one pretty-printed document)."""
    from monitor.ingest.otlp import parse_otlp

    n = buf.count(b"\n")
    frame, rejects = parse_otlp(buf, source=file)
    frame[LINE] = np.arange(first_line + 1, first_line + 1 + len(frame), dtype=np.int64)
    return frame, rejects, n


class SqlTableSource:
    """A SQL table read in `cursor_column` order; the last cursor value read is the offset.

    A run of rows sharing one cursor value is never split across chunks, so `>` never skips a row.
    """

    def __init__(self, name: str, config: SqlSource, limits: Limits):
        self.name, self.config, self.limits = name, config, limits
        self._engine = None

    def engine(self):
        if self._engine is None:
            from sqlalchemy import create_engine
            from sqlalchemy.engine import make_url

            url = make_url(self.config.url)
            if self.config.password is not None:
                url = url.set(password=self.config.password.resolve())
            self._engine = create_engine(url, pool_pre_ping=True)
        return self._engine

    def read(self, offsets: dict[str, OffsetState]) -> Iterator[Batch]:
        import sqlalchemy as sa

        key = f"sql:{self.config.table}"
        state = offsets.get(key) or OffsetState(file_key=key, path=self.config.table, offset=0, line=0,
                                                cursor=None, fingerprint=None, size=None)
        schema, _, name = self.config.table.rpartition(".")
        table = sa.Table(name, sa.MetaData(), schema=schema or None, autoload_with=self.engine())
        col = table.c[self.config.cursor_column]
        limit = self.limits.chunk_rows
        while True:
            query = sa.select(table).order_by(col).limit(limit + 1)
            if state.cursor is not None:
                query = query.where(col > _decode_cursor(state.cursor))
            with self.engine().connect() as conn:
                frame = pd.read_sql(query, conn)
                more = len(frame) > limit
                if more:
                    cursor = frame[self.config.cursor_column]
                    if cursor.iloc[0] == cursor.iloc[limit]:
                        # One cursor value fills the chunk: read all of its rows at once.
                        frame = pd.read_sql(sa.select(table).where(col == cursor.iloc[0]), conn)
                    else:
                        frame = frame[cursor != cursor.iloc[limit]]
            if frame.empty:
                return
            frame[LINE] = np.arange(state.line + 1, state.line + 1 + len(frame), dtype=np.int64)
            state = replace(state, cursor=_encode_cursor(frame[self.config.cursor_column].iloc[-1]),
                            line=state.line + len(frame))
            yield Batch(self.name, self.config.table, frame, [], state, [])
            if not more:
                return


def _encode_cursor(value) -> str:
    if isinstance(value, pd.Timestamp):
        return json.dumps({"t": value.isoformat()})
    if isinstance(value, np.integer | int):
        return json.dumps({"i": int(value)})
    if isinstance(value, np.floating | float):
        return json.dumps({"f": float(value)})
    return json.dumps({"s": str(value)})


def _decode_cursor(text: str):
    (tag, value), = json.loads(text).items()
    return {"t": pd.Timestamp, "i": int, "f": float, "s": str}[tag](value)


def open_source(name: str, config: FileSource | SqlSource, limits: Limits) -> DirectorySource | SqlTableSource:
    """The reader for a configured source."""
    return DirectorySource(name, config, limits) if config.kind == "files" else SqlTableSource(name, config, limits)

