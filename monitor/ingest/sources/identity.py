"""Which stored read state a file continues: its identity (device and inode) and a fingerprint of its
first bytes (of its first row for Parquet), so a rename, a link, a compressed rotation or a copy is never
read twice."""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from monitor.ingest.sources.chunks import gzip_pieces
from storage.offsets import OffsetState

FINGERPRINT_BYTES = 256  # a fingerprint covers at least this many first bytes (see fingerprint_of)
MAX_FP = 64 << 10  # ...and at most this many; a file no longer than this is read whole in one call
MAX_CSV_FP = 4 << 20  # a CSV's fingerprint covers its header and first row, up to this many bytes
# A compressed file's cursor once a read ran to the end of its bytes: `gz_end:<size on disk>`. While its
# size is that, it holds nothing new and is not decompressed again.
GZ_END = "gz_end:"


def gz_end(size: int) -> str:
    """The cursor of a compressed file read to its end while it is `size` bytes on disk."""
    return f"{GZ_END}{size}"


def read_to_end(plan: Plan, state: OffsetState) -> bool:
    """Whether `plan` is a .gz read to its end at `state`, and of the same size on disk since."""
    return plan.gz and state.cursor == gz_end(plan.size)


@dataclass(slots=True)
class Plan:
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


def parse_group(plan: Plan) -> tuple[str, bytes | None]:
    """Small files parsed together share a format and, for CSV, a header."""
    return plan.fmt, csv_header(plan.head) if plan.fmt == "csv" else None


def csv_header(head: bytes) -> bytes | None:
    end = head.find(b"\n")
    return head[:end + 1] if end >= 0 else None


def claim(plans: list[Plan], offsets: dict[str, OffsetState]) -> list[Plan]:
    """Give each file the state its read starts from; returns the files to read this time, in order.

    A file continues its own stored state while its first bytes are unchanged (grown, renamed). A file
    that is new (or whose inode now holds other bytes) continues the stored state whose fingerprint its
    first bytes match when it also holds the last bytes read of that state's file (its `tail`): a compressed
    rotation or a copytruncate copy of a file read before resumes at the offset reached. Each stored state
    is continued by one file per read; a second copy waits. A file with the same first bytes that is no
    copy (other bytes before the offset, or other bytes than the live file it matches) is read from its
    start, with an event saying so.
    """
    taken: set[str] = set()
    fresh: list[Plan] = []
    for plan in plans:
        mine = offsets.get(plan.key)
        if mine is not None and _continues(plan, mine):
            plan.claims = plan.key
            taken.add(plan.key)
        else:
            if mine is not None:
                plan.events += ("truncated" if _shrunk(plan, mine) else "replaced",)
            fresh.append(plan)
    live: dict[str, Plan] | None = None  # the files continuing their own state, by key (made when needed)
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
            if match is not None and match.file_key == plan.key:
                match = None  # its own state, which it does not continue (replaced): no copy of itself
            if match is not None and live is None:
                live = {p.key: p for p in plans if p.claims == p.key}
            copy = match is not None and _copies(plan, match, live.get(match.file_key))
            if copy is None:
                continue  # a compressed file still being written, not yet as long as the bytes read: next time
            if copy and match.file_key in taken:
                continue  # the file it copies is read this time (as itself or as another copy)
            if copy:
                plan.claims = match.file_key
                taken.add(match.file_key)
                plan.events += (f"continues {os.path.basename(match.path)}",)
                plan.state = replace(match, file_key=plan.key, path=plan.where)
            elif match is None and plan.gz and not plan.whole and len(plan.head) < MAX_FP:
                continue  # a compressed copy still being written: its start may yet match a file read before
            else:
                if match is not None:
                    plan.events += (f"distinct from {os.path.basename(match.path)}: its first bytes, other bytes "
                                    "after them; read from its start",)
                plan.state = _fresh(plan)
        else:
            own = offsets[plan.key]
            plan.state = OffsetState(own.file_key, plan.where, own.offset, own.line, own.cursor, own.fingerprint,
                                     own.size, own.tail if own.tail is not None else _own_tail(plan, own))
        if plan.fingerprint is not None and plan.fingerprint != plan.state.fingerprint:
            plan.state = replace(plan.state, fingerprint=plan.fingerprint)
        out.append(plan)
    return out


def _copies(plan: Plan, state: OffsetState, live: Plan | None) -> bool | None:
    """Whether `plan`, whose first bytes match `state`'s, is a copy of its file: it holds the last bytes read
    (`state.tail`), and, while that file is still there (`live`), the same bytes as it where they both end.
    None: not yet known (a compressed file still being written that does not reach the tail yet). Only a
    state stored without a tail (before tails were kept, for a file gone since) leaves the first bytes to
    decide."""
    if plan.fmt != "parquet":
        holds = _holds_tail(plan, state)
        if holds is False:
            return False
        if holds is None and state.tail is not None and plan.gz:
            return None
    # A .gz's decompressed length is known only when it is held whole: else the tail alone decides.
    if live is not None and plan.fmt != "parquet" and _length(plan) is not None and _length(live) is not None:
        end = min(_length(plan), _length(live))
        start = max(0, end - TAIL_BYTES)
        mine, theirs = _bytes(plan, start, end), _bytes(live, start, end)
        if mine is not None and theirs is not None and mine != theirs:
            return False
    return True


TAIL_BYTES = 512  # a tail covers the last bytes read, at most this many (see tail_of)


def tail_of(buf: bytes, end: int, stop: int | None = None) -> str | None:
    """`<start>-<end>:<sha1>` of the last TAIL_BYTES (or fewer) of `buf[:stop]`, which ends at byte `end` of
    its file; None within its first FINGERPRINT_BYTES, which its fingerprint covers."""
    if end <= FINGERPRINT_BYTES:
        return None
    stop = len(buf) if stop is None else stop
    piece = buf[max(0, stop - TAIL_BYTES):stop]
    return f"{end - len(piece)}-{end}:{hashlib.sha1(piece).hexdigest()}"


def _own_tail(plan: Plan, state: OffsetState) -> str | None:
    """The tail of a state stored without one, from the plain file that continues it: once per file, so a
    file that later starts like it is told apart by its bytes too."""
    if plan.gz or plan.fmt == "parquet" or state.offset <= FINGERPRINT_BYTES or state.cursor is not None:
        return None
    got = _bytes(plan, max(0, state.offset - TAIL_BYTES), state.offset)
    return None if got is None else tail_of(got, state.offset)


def _length(plan: Plan) -> int | None:
    """Bytes of the file as read: decompressed for a .gz held whole (None for one that is not), else its
    size on disk."""
    if plan.gz:
        return len(plan.head) if plan.whole else None
    return plan.size


def _bytes(plan: Plan, start: int, end: int) -> bytes | None:
    """Bytes [start, end) of the file (decompressed for .gz), or None when they are not all there. A
    complete .gz shorter than `end` gives the bytes it has; one still being written, None."""
    if end <= len(plan.head):
        return plan.head[start:end]
    if plan.whole:
        return plan.head[start:end] if plan.gz else None
    if plan.gz:
        return _gz_bytes(plan.where, start, end)
    if end > plan.size:
        return None
    try:
        with open(plan.where, "rb") as fh:
            got = os.pread(fh.fileno(), end - start, start)
    except OSError:
        return None
    return got if len(got) == end - start else None


def _gz_bytes(path: str, start: int, end: int) -> bytes | None:
    """Decompressed bytes [start, end) of a .gz file, streamed a piece at a time: fewer when the file ends
    complete before `end`, None when it ends inside a stream (still being written) or cannot be read."""
    pieces = gzip_pieces(Path(path), start)
    got, n = [], 0
    try:
        while n < end - start:
            piece = next(pieces)[:end - start - n]
            got.append(piece)
            n += len(piece)
    except StopIteration as stop:
        if not stop.value:
            return None
    except (OSError, EOFError, zlib.error):
        return None
    finally:
        pieces.close()
    return b"".join(got)


_ROWS = "rows"  # prefix of a Parquet fingerprint: a hash of its first row, not of its bytes


def _fresh(plan: Plan) -> OffsetState:
    return OffsetState(plan.key, plan.where, 0, 0, None, plan.fingerprint, plan.size)


def _shrunk(plan: Plan, state: OffsetState) -> bool:
    """Shorter than the offset read: truncated (a Parquet file only while it has no footer: emptied)."""
    if plan.gz or plan.fmt == "parquet" and plan.parquet is not None:
        return False
    return plan.size < state.offset


def _continues(plan: Plan, state: OffsetState) -> bool:
    """Whether the file at a stored state's inode is still the file read (grown, or renamed), not a new one."""
    if _shrunk(plan, state):
        return False
    if plan.fmt == "parquet":
        plan.fingerprint = _parquet_fingerprint(plan.parquet) if plan.parquet is not None else None
        if plan.fingerprint is None or not state.fingerprint or not state.fingerprint.startswith(_ROWS):
            return plan.fingerprint is None or state.fingerprint is None or plan.size >= (state.size or 0)
        return plan.fingerprint == state.fingerprint and plan.parquet.metadata.num_rows >= state.line
    if state.fingerprint and not state.fingerprint.startswith(_ROWS) and plan.fingerprint != state.fingerprint \
            and _prefix_hash(plan, _fp_len(state.fingerprint)) != state.fingerprint:
        return False
    # The same first bytes: still the file read unless the bytes before the offset changed (a new file
    # that starts the same, at an inode the file read left free). A .gz read to its end and of the same
    # size since is not decompressed again to tell.
    if read_to_end(plan, state):
        return True
    return state.tail is None or _holds_tail(plan, state) is not False


def _holds_tail(plan: Plan, state: OffsetState) -> bool | None:
    """Whether the file holds the last bytes read at `state` (its `tail`); None when that cannot be told (no
    tail stored, or the bytes are past what can be read of a compressed file)."""
    if state.tail is None:
        return None
    span, digest = state.tail.split(":", 1)
    start, end = (int(x) for x in span.split("-", 1))
    got = _bytes(plan, start, end)
    return None if got is None else hashlib.sha1(got).hexdigest() == digest


def _prefix_hash(plan: Plan, n: int) -> str | None:
    """The fingerprint of the first `n` bytes (read again past MAX_FP: a CSV header longer than that), or
    None when the file has fewer."""
    got = plan.head[:n] if n <= len(plan.head) else _bytes(plan, 0, n)
    return _hash(got) if got is not None and len(got) == n else None


def _match(plan: Plan, longest_first: list[tuple[int, dict[str, OffsetState]]],
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
        if n > (len(plan.head) if n <= MAX_FP or plan.gz else plan.size) or n == 0:
            continue
        state = states.get(_prefix_hash(plan, n))
        # A plain copy holds at least the bytes read from the file it copies; a .gz's size says nothing.
        if state is not None and (plan.gz or plan.size >= state.offset):
            return state
    return None


def _fp_len(fingerprint: str) -> int:
    return int(fingerprint.split(":", 1)[0])


def _hash(head: bytes) -> str:
    return f"{len(head)}:{hashlib.sha1(head).hexdigest()}"


def fingerprint_of(head: bytes) -> str:
    """`<n>:<sha1 of the first n bytes>`: the first two lines (a CSV header and its first row), at least
    FINGERPRINT_BYTES and at most MAX_FP; tells a replaced or copied file from a grown one."""
    first = head.find(b"\n")
    second = head.find(b"\n", first + 1) if first >= 0 else -1
    end = second + 1 if second >= 0 else len(head)
    return _hash(head[:min(max(FINGERPRINT_BYTES, end), len(head), MAX_FP)])


def csv_fingerprint(fd: int, head: bytes, size: int) -> str:
    """The fingerprint of a CSV file whose header and first row do not fit in its first MAX_FP bytes
    (`head`): `<n>:<sha1>` of its bytes up to the end of its second line, of at most MAX_CSV_FP bytes, read
    from descriptor `fd`. It tells a copy (the header and the first row) from a truncated and rewritten
    file (the header and another row)."""
    digest = hashlib.sha1(head)
    n, newlines = len(head), head.count(b"\n")
    while newlines < 2 and n < min(size, MAX_CSV_FP):
        piece = os.pread(fd, min(1 << 16, MAX_CSV_FP - n), n)
        if not piece:
            break
        cut = -1
        while newlines < 2 and (cut := piece.find(b"\n", cut + 1)) >= 0:
            newlines += 1
        if newlines == 2:
            piece = piece[:cut + 1]
        digest.update(piece)
        n += len(piece)
    return f"{n}:{digest.hexdigest()}"


def _parquet_fingerprint(pf: pq.ParquetFile) -> str | None:
    """`rows1:<sha1 of the first row>`: a Parquet file rewritten with more rows keeps its first row, while
    its first bytes (page headers, dictionaries) change. None for a file without rows."""
    if pf.metadata.num_rows == 0:
        return None
    first = next(pf.iter_batches(batch_size=1))
    row = pa.Table.from_batches([first.slice(0, 1)])
    return f"{_ROWS}1:{hashlib.sha1(json.dumps(row.to_pylist(), default=str, sort_keys=True).encode()).hexdigest()}"


def gzip_head(fh) -> tuple[bytes, bool]:
    """The first MAX_FP decompressed bytes of a .gz file, and whether that is all of it (every member read to
    its end)."""
    parts: list[bytes] = []
    got, partial = 0, False
    decomp = zlib.decompressobj(wbits=47)
    data = b""
    while got <= MAX_FP:
        if not data:
            data = fh.read(1 << 16)
            if not data:
                break
        piece = decomp.decompress(data, MAX_FP + 1 - got)
        parts.append(piece)
        got += len(piece)
        partial = True
        if decomp.eof:  # concatenated gzip members
            data, partial = decomp.unused_data, False
            decomp = zlib.decompressobj(wbits=47)
        else:
            data = decomp.unconsumed_tail
    head = b"".join(parts)
    return head[:MAX_FP], got <= MAX_FP and not partial
