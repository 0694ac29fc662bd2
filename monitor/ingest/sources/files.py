"""A growing directory of JSON Lines, CSV, Parquet or OTLP-JSON files (gzip too), read incrementally."""

from __future__ import annotations

import fnmatch
import gzip
import os
import re
import stat
import threading
import zlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from monitor.config import FileSource, Limits
from monitor.contract import Reason, Reject, excerpt
from monitor.ingest.otlp import parse_otlp
from monitor.ingest.sources.batch import (
    FILE,
    LINE,
    Backlog,
    Batch,
    Observer,
    RawLines,
    empty_frame,
    format_of,
)
from monitor.ingest.sources.chunks import BOM, LongLine, first_line_of, line_chunks, oversize_line
from monitor.ingest.sources.csvlines import parse_csv
from monitor.ingest.sources.identity import (
    GZ_END,
    MAX_FP,
    Plan,
    claim,
    csv_fingerprint,
    csv_header,
    fingerprint_of,
    gz_end,
    gzip_head,
    parse_group,
    read_to_end,
    tail_of,
)
from monitor.ingest.sources.jsonl import WORKERS, Parsed, start_jsonl
from monitor.ingest.sources.tables import flag_oversize, open_parquet
from storage.offsets import OffsetState

_SMALL_FILES = 4096  # small files parsed (and their offsets committed) together, at most
# JSON Lines chunks a read holds at once: the next batch's, and the one read and queued while it parses.
_CHUNKS_AHEAD = 2
# A file's cursor while a read stopped inside a line too long to hold (see _passed_over).
INSIDE_LINE = "inside_line"


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

    def read(self, offsets: dict[str, OffsetState], observe: Observer | None = None) -> Iterator[Batch]:
        """New rows of every file since `offsets`, chunk by chunk; a file that cannot be read is reported as
        a `source_error` batch (no offset: retried next read) and the others are read. `observe` is told
        the rows read and the rows in all (estimated from the bytes left) after each batch."""
        own: set[int] = set()  # the pool's threads
        pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="tailwatch-parse",
                                  initializer=lambda: own.add(threading.get_ident()))
        try:
            saved: set[str] = set()  # keys whose state a batch carried
            listed, skipped = self._listing()
            for path, why in skipped:
                yield self._problem(path, why)
            plans: list[Plan] = []
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
            claimed = claim(plans, offsets)
            backlog = Backlog(observe, [_left(plan) for plan in claimed]) if observe is not None else None
            for batch in self._read_claimed(claimed, offsets, pool):
                saved.update(s.file_key for s in batch.offsets)
                if backlog is not None:
                    backlog.read(batch)
                yield batch
            # A file whose state changed without a row to read (a compressed rotation or a copy that holds
            # nothing new, a rename, a longer fingerprint) keeps it: next time it is known as itself.
            for plan in claimed:
                if plan.key not in saved and plan.state != offsets.get(plan.key):
                    yield Batch(self.name, plan.name, empty_frame(), [], plan.state, list(plan.events))
            if backlog is not None:
                backlog.finish()
        finally:
            # The caller stopped early or a parse failed: blocks still queued are dropped, running ones
            # (a block each) are waited for, so no thread outlives the read. Closed on one of its own
            # threads (the garbage collector runs wherever it is triggered), the read cannot wait for that
            # thread: the others end after their block.
            pool.shutdown(wait=threading.get_ident() not in own, cancel_futures=True)

    def _read_claimed(self, claimed: list[Plan], offsets: dict[str, OffsetState],
                      pool: ThreadPoolExecutor) -> Iterator[Batch]:
        """The batches of the files to read, small files together."""
        small: list[Plan] = []
        held_bytes = held_lines = 0  # of `small`
        group = None  # the format (and CSV header) of `small`
        max_bytes, max_lines = self.limits.chunk_bytes, self.limits.chunk_rows
        for plan in claimed:
            size = self._small_size(plan)
            if size is not None:
                mine = parse_group(plan)
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
        return Batch(self.name, path.name, empty_frame(), [reject], None, [])

    def _plan(self, path: str, name: str) -> Plan:
        """Open the file once: its identity (fstat), its first bytes (all of a small file) for its fingerprint,
        and its rows if small. OSError when it cannot be opened or read."""
        fmt = format_of(name, self.config.format)
        gz = name.endswith(".gz")
        if fmt != "parquet" and not gz:
            # A bare descriptor: no file object to build and tear down for the many small files of a directory.
            fd = os.open(path, os.O_RDONLY)
            try:
                st = os.fstat(fd)
                head = os.read(fd, min(st.st_size, MAX_FP) + 1)
                head, whole = head[:MAX_FP], len(head) <= MAX_FP
                # A CSV header longer than MAX_FP: its fingerprint reaches past it, to its first row.
                long = fmt == "csv" and not whole and head.count(b"\n") < 2
                fp = csv_fingerprint(fd, head, st.st_size) if long else fingerprint_of(head)
            finally:
                os.close(fd)
            return Plan(path, name, st.st_size, st.st_mtime_ns, f"{st.st_dev}:{st.st_ino}", fmt, head, whole, fp)
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            identity = (st.st_size, st.st_mtime_ns, f"{st.st_dev}:{st.st_ino}")
            if fmt != "parquet":
                head, whole = gzip_head(fh)
                return Plan(path, name, *identity, fmt, head, whole, fingerprint_of(head))
            # A compressed rotation is decompressed in memory: Parquet needs random access.
            source = pa.BufferReader(gzip.decompress(fh.read())) if gz else path
        try:
            pf = open_parquet(source)
        except (pa.ArrowInvalid, OSError, EOFError, zlib.error) as exc:
            # No footer yet (still being written), or not Parquet at all: see _read_parquet.
            return Plan(path, name, *identity, fmt, b"", False, None, error=str(exc))
        return Plan(path, name, *identity, fmt, b"", False, None, parquet=pf)

    def _small_size(self, plan: Plan) -> tuple[int, int] | None:
        """Bytes and lines left to read in a file held whole, when they fit in one batch (else None)."""
        if not plan.whole or plan.fmt not in ("jsonl", "csv") or plan.events or plan.state.cursor == INSIDE_LINE:
            return None
        rest = len(plan.head) - plan.state.offset
        if rest > self.limits.chunk_bytes:
            return None
        lines = plan.head.count(b"\n", plan.state.offset)
        return (rest, lines) if lines <= self.limits.chunk_rows else None

    def _read_file(self, plan: Plan, offsets: dict[str, OffsetState], pool: ThreadPoolExecutor) -> Iterator[Batch]:
        path, state, events, fmt = plan.path, plan.state, list(plan.events), plan.fmt
        if fmt == "parquet":
            yield from self._read_parquet(plan, offsets)
        elif fmt in ("jsonl", "csv", "otlp"):
            if read_to_end(plan, state):
                return  # read to its end, and the same size since: nothing new to decompress
            yield from self._read_lines(path, state, events, fmt, pool, plan.size if plan.gz else None)
        # Files of an unknown type are skipped: the pattern chose them, so say so once per read.
        elif state.offset == 0 and state.line == 0:
            size = plan.size
            yield Batch(self.name, path.name, pd.DataFrame({LINE: []}),
                        [Reject(path.name, Reason.unparseable, f"unknown file type: {path.name}")],
                        replace(state, offset=size, line=1, size=size), events)

    def _small_batches(self, plans: list[Plan], pool: ThreadPoolExecutor) -> Iterator[Batch]:
        """Small files of one format (and CSV header) parsed together: one parse and one validation for many
        files. Rows carry FILE and their own line numbers; each file's offset goes with the batch."""
        fmt = plans[0].fmt
        csv = fmt == "csv"
        header = csv_header(plans[0].head) if csv else None
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
                if body.startswith(BOM):
                    body = body[len(BOM):]
                if csv:
                    body, base = body[body.index(b"\n") + 1:], base + 1
            names.append(plan.name)
            starts.append(total)
            bases.append(base)
            parts.append(body)
            total += lines - (base - state.line)  # the header line is no row
            states.append(OffsetState(state.file_key, state.path, end, state.line + lines, state.cursor,
                                      state.fingerprint, end,
                                      tail_of(plan.head, end, end)))
        if not states:
            return
        buf = b"".join(parts)
        if fmt == "jsonl":
            parsed, _ = start_jsonl(buf, 0, "", self.limits, pool)
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
            moved.append(replace(r, position=f"{names[piece[0]]}:{line[0]}"))
        lines = RawLines({name: (part, base) for name, part, base in zip(names, parts, bases, strict=True)})
        yield Batch(self.name, names[0] if len(names) == 1 else "", frame, moved, states[0], [], table, states[1:],
                    lines)

    def _read_parquet(self, plan: Plan, offsets: dict[str, OffsetState]) -> Iterator[Batch]:
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
            table = flag_oversize(table, self.limits.max_field_chars)
            table = table.append_column(LINE, pa.array(np.arange(first + 1, row + 1, dtype=np.int64)))
            yield Batch(self.name, path.name, empty_frame(), [],
                        replace(state, line=row, offset=size, size=size), events, table)
            events = []

    def _read_lines(self, path: Path, state: OffsetState, events: list[str], fmt: str,
                    pool: ThreadPoolExecutor, gz_size: int | None = None) -> Iterator[Batch]:
        """The batches of a file of lines from its state on; `gz_size`: a compressed file's size on disk."""
        header = None
        if state.cursor is not None and state.cursor.startswith(GZ_END):
            state = replace(state, cursor=None)  # it grew (or is a copy that is no .gz): read on from the offset
        began = state.offset
        if fmt == "csv":
            header = first_line_of(path)
            if header is None:
                return  # header not complete yet
        # JSON Lines: a chunk's blocks are queued on `pool` and the next chunk is read and queued while they
        # parse, so reading, pre-checks and parsing overlap; batches still come out in order, each with the
        # offsets of its own chunk, and at most _CHUNKS_AHEAD chunks are held at once.
        ahead: deque[tuple[OffsetState, Parsed]] = deque()
        limits = self.limits
        for item in line_chunks(path, state.offset, limits.chunk_bytes, limits.chunk_rows,
                                max_line=limits.max_line_bytes, budget=limits.max_decompressed_bytes_per_tick,
                                inside=state.cursor == INSIDE_LINE):
            if isinstance(item, LongLine):
                if not (item.new or item.ended or item.end > item.start):
                    continue  # still inside the line passed over, and nothing more of it written
                while ahead:  # batches keep the order of their lines
                    yield self._parsed_batch(path, *ahead.popleft(), events)
                    events = []
                state, rejects = _passed_over(state, item, path.name, limits.max_line_bytes)
                yield Batch(self.name, path.name, empty_frame(), rejects, state, events)
                events = []
                continue
            buf, offset, newlines = item
            tail = tail_of(buf, offset)  # of the bytes as read, a BOM too
            if state.offset == 0 and buf.startswith(BOM):
                buf, newlines = buf[len(BOM):], None
            first_line = state.line
            skip_header = fmt == "csv" and state.offset == 0
            if fmt == "jsonl":
                parsed, lines = start_jsonl(buf, first_line, path.name, self.limits, pool, newlines)
                state = replace(state, offset=offset, line=first_line + lines, size=offset, tail=tail)
                ahead.append((state, parsed, RawLines({path.name: (buf, first_line)})))
                if len(ahead) < _CHUNKS_AHEAD:
                    continue
                yield self._parsed_batch(path, *ahead.popleft(), events)
            else:
                if fmt == "otlp":
                    frame, rejects, lines = parse_otlp_lines(buf, first_line, path.name)
                else:
                    frame, rejects, lines = parse_csv(buf, header, skip_header, first_line, path.name, self.limits)
                state = replace(state, offset=offset, line=first_line + lines, size=offset, tail=tail)
                raw = None if fmt == "otlp" else RawLines({path.name: (buf, first_line)})
                yield Batch(self.name, path.name, frame, rejects, state, events, lines=raw)
            events = []
        while ahead:
            yield self._parsed_batch(path, *ahead.popleft(), events)
            events = []
        # The read ran out of bytes, not out of its budget (what it took, plus a line it may have stopped
        # inside, stays below the budget): a compressed file of this size holds nothing more to read.
        if gz_size is not None and state.cursor is None \
                and state.offset - began + limits.max_line_bytes < limits.max_decompressed_bytes_per_tick:
            yield Batch(self.name, path.name, empty_frame(), [], replace(state, cursor=gz_end(gz_size)), events)

    def _parsed_batch(self, path: Path, state: OffsetState, parsed: Parsed, lines: RawLines,
                      events: list[str]) -> Batch:
        table, frame, rejects = parsed()
        return Batch(self.name, path.name, frame, rejects, state, events, table, lines=lines)


def _left(plan: Plan) -> tuple[str, int, int, int, bool]:
    """What a file has left to read, for a Backlog: (key, start, end, bytes, by rows). A Parquet file is
    measured in rows (its offset is its size from its first batch on); a large compressed one by its size
    on disk against decompressed offsets, which over-estimates the share of it read."""
    start = plan.state.offset
    if plan.fmt == "parquet":
        rows = plan.parquet.metadata.num_rows if plan.parquet is not None else 0  # no footer yet: not read
        return plan.key, plan.state.line, rows, plan.size * max(rows - plan.state.line, 0) // max(rows, 1), True
    end = len(plan.head) if plan.gz and plan.whole else plan.size
    return plan.key, start, end, max(end - start, 0), False


def _passed_over(state: OffsetState, line: LongLine, file: str, limit: int) -> tuple[OffsetState, list[Reject]]:
    """The state after a line passed over, and its `oversize_line` reject when it starts there. A line is
    counted (and quarantined) once, where it starts; a read that stops inside it leaves the state's cursor
    at INSIDE_LINE, so the next read passes over its rest first."""
    rejects = []
    number = state.line
    if line.new:
        number += 1
        rejects.append(oversize_line(f"{file}:{number}", line.length, line.head, limit, line.ended))
    cursor = None if line.ended else INSIDE_LINE
    return replace(state, offset=line.end, line=number, size=line.end, cursor=cursor), rejects


def _os_error(exc: OSError) -> str:
    return f"{type(exc).__name__}: {exc.strerror or exc}"


def parse_otlp_lines(buf: bytes, first_line: int, file: str) -> tuple[pd.DataFrame, list[Reject], int]:
    """Stage timings from OTLP-JSON trace documents (one per line, or one pretty-printed document)."""
    n = buf.count(b"\n")
    frame, rejects = parse_otlp(buf, source=file)
    frame[LINE] = np.arange(first_line + 1, first_line + 1 + len(frame), dtype=np.int64)
    return frame, rejects, n
