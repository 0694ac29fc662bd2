"""Reading a growing text file (plain or gzip) in stretches of whole lines, and scanning a buffer's lines
(newlines, UTF-8) without a decoded copy."""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from monitor.contract import EXCERPT_CHARS, RAW_BYTES, Reason, Reject, excerpt

_SCAN_BYTES = 64 << 10  # bytes per numpy call when scanning a buffer (see scan)
_STEP = 1 << 20  # bytes per read while passing over a long line
BOM = b"\xef\xbb\xbf"


def first_line_of(path: Path) -> bytes | None:
    with _open(path) as fh:
        line = fh.readline(1 << 20)
    return line if line.endswith(b"\n") else None


def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


@dataclass(frozen=True, slots=True)
class LongLine:
    """A line longer than a chunk and than limits.max_line_bytes, passed over without being held whole.

    `start`..`end` (byte offsets, decompressed for .gz) is the stretch passed over: the line and its newline
    when `ended`; else as far as the read went (the end of the file, or of the tick's bytes), its rest
    to be passed over by the next read. `new`: the line starts here (quarantine it, count it); false when
    a read resumes inside a line an earlier read quarantined. `length`: its bytes so far, newline excluded.
    """

    start: int
    end: int
    length: int
    head: bytes  # its first bytes (at most RAW_BYTES; empty unless `new`)
    ended: bool
    new: bool


Chunk = tuple[bytes, int] | LongLine


def oversize_line(position: str, length: int, head: bytes, limit: int, ended: bool = True) -> Reject:
    """The `oversize_line` reject of a line of `length` bytes (at least, unless `ended`) starting `head`."""
    size = f"{length:,} bytes" if ended else f"at least {length:,} bytes"
    return Reject(position, Reason.oversize_line,
                  excerpt(f"a line of {size}, over limits.max_line_bytes ({limit:,}): "
                          + head[:EXCERPT_CHARS].decode("utf-8", errors="replace")),
                  raw=head[:RAW_BYTES])


def complete_chunks(path: Path, offset: int, chunk_bytes: int,
                     chunk_rows: int | None = None, **bounds) -> Iterator[tuple[bytes, int]]:
    """Stretches of whole lines after byte `offset` (decompressed offset for .gz), with the end offset.

    A stretch holds at most `chunk_bytes` bytes (unless one line is longer: up to `max_line` bytes, see
    `byte_chunks`) and `chunk_rows` lines. A last line without its newline is left for a later read: it
    may still be being written. Lines passed over as too long are not among them.
    """
    for item in line_chunks(path, offset, chunk_bytes, chunk_rows, **bounds):
        if not isinstance(item, LongLine):
            yield item[0], item[1]


def line_chunks(path: Path, offset: int, chunk_bytes: int, chunk_rows: int | None = None,
                 **bounds) -> Iterator[tuple[bytes, int, np.ndarray | None] | LongLine]:
    """`complete_chunks`, with the position of each newline in the stretch when it was found (else None),
    and the lines passed over (`LongLine`) in their place."""
    for item in byte_chunks(path, offset, chunk_bytes, **bounds):
        if isinstance(item, LongLine):
            yield item
            continue
        buf, end = item
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
    return scan(np.frombuffer(buf, dtype=np.uint8), lambda piece: piece == 10)


def scan(arr: np.ndarray, hit: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Positions in `arr` (bytes) where `hit` is true.

    Scanned in pieces of _SCAN_BYTES: temporaries this small are reused from the heap and stay in cache,
    while buffer-sized ones get pages of their own every time, which cost as much to fault in as the scan.
    """
    if not len(arr):
        return np.empty(0, dtype=np.intp)
    return np.concatenate([np.flatnonzero(hit(arr[p:p + _SCAN_BYTES])) + p for p in range(0, len(arr), _SCAN_BYTES)])


def byte_chunks(path: Path, offset: int, chunk_bytes: int, max_line: int | None = None,
                budget: int | None = None, inside: bool = False) -> Iterator[Chunk]:
    """`complete_chunks` by bytes only, and the lines passed over.

    A line longer than `chunk_bytes` is handed over whole up to `max_line` bytes (None: any length); a
    longer one is passed over in bounded reads and given as a `LongLine`. `inside`: `offset` is inside a
    line an earlier read passed over, whose rest is passed over first. `budget`: for .gz, the decompressed
    bytes past `offset` this read may take (None: all); the read stops at the last whole line (or inside
    a long line) past it.
    """
    max_line = max_line if max_line is not None else 1 << 62
    if path.suffix != ".gz":
        yield from _plain_chunks(path, offset, chunk_bytes, max_line, inside)
        return
    pieces = gzip_pieces(path, offset)
    if budget is not None:
        pieces = _within(pieces, budget)

    def more() -> bytes:
        return next(pieces, b"")

    carry = b""
    if inside:
        _, long, carry = _pass_over(more, offset, b"", max_line, new=False)
        yield long
        if not long.ended:
            return
        offset = long.end
    # Pieces are gathered in a list and joined once per chunk: `carry += piece` would copy the growing
    # chunk again for every piece.
    parts: list[bytes] = [carry]
    size = len(carry)
    for piece in pieces:
        parts.append(piece)
        size += len(piece)
        if size < chunk_bytes:
            continue
        carry = b"".join(parts)
        while len(carry) >= chunk_bytes:
            cut = carry.rfind(b"\n", 0, chunk_bytes) + 1
            if cut == 0:  # one line longer than a chunk
                k = carry.find(b"\n")
                if 0 <= k <= max_line:  # not too long: handed over whole, the parser decides
                    cut = k + 1
                elif k > max_line:
                    yield LongLine(offset, offset + k + 1, k, carry[:RAW_BYTES], True, True)
                    offset, carry = offset + k + 1, carry[k + 1:]
                    continue
                else:
                    whole, long, carry = _pass_over(more, offset, carry, max_line)
                    if whole is not None:
                        offset += len(whole)
                        yield whole, offset
                        continue
                    if long is None:
                        return  # an unfinished last line, not too long yet: it waits for a later read
                    yield long
                    if not long.ended:
                        return
                    offset = long.end
                    continue
            offset += cut
            yield carry[:cut], offset
            carry = carry[cut:]
        parts, size = [carry], len(carry)
    carry = b"".join(parts)
    cut = carry.rfind(b"\n") + 1
    if cut:
        yield carry if cut == len(carry) else carry[:cut], offset + cut


def _pass_over(more: Callable[[], bytes], start: int, first: bytes, max_line: int,
               new: bool = True) -> tuple[bytes | None, LongLine | None, bytes]:
    """Read on to the end of a line whose first bytes `first` (at `start`) hold no newline, by `more()`
    (b"" at the end of what may be read). Returns (the line with its newline while no longer than
    `max_line`, or None; else the LongLine passed over; the bytes read after the line's newline). Both None
    at the end of what may be read before the line passed `max_line`: it waits for a later read."""
    parts = [first] if new else []
    length = len(first)
    held = new and length <= max_line
    head = first[:RAW_BYTES]
    while True:
        piece = more()
        if not piece:
            if held:
                return None, None, b""
            return None, LongLine(start, start + length, length, head, False, new), b""
        k = piece.find(b"\n")
        length += len(piece) if k < 0 else k
        if new and len(head) < RAW_BYTES:
            head += piece[:RAW_BYTES - len(head)]
        if held and length > max_line:
            held, parts = False, []  # too long: nothing more of it is kept
        if k < 0:
            if held:
                parts.append(piece)
            continue
        if held:
            parts.append(piece[:k + 1])
            return b"".join(parts), None, piece[k + 1:]
        return None, LongLine(start, start + length + 1, length, head if new else b"", True, new), piece[k + 1:]


def _plain_chunks(path: Path, offset: int, chunk_bytes: int, max_line: int, inside: bool) -> Iterator[Chunk]:
    """`byte_chunks` of an uncompressed file: each chunk read once, at its size, where it starts.

    The end of a chunk (its last newline within `chunk_bytes`) is found in a short read of its tail first,
    so the chunk is read straight into its own buffer: no joining of pieces, no copy of a carried-over rest.
    """
    probe = min(chunk_bytes, 1 << 16)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size

        def more() -> bytes:  # a long line is read on in steps, never past the size seen at the start
            return fh.read(max(0, min(_STEP, size - fh.tell())))

        if inside:
            fh.seek(offset)
            _, long, _ = _pass_over(more, offset, b"", max_line, new=False)
            yield long
            if not long.ended:
                return
            offset = long.end
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
                    # One line longer than a chunk: handed over whole while not too long (the parser
                    # decides), else passed over.
                    whole, long, _ = _pass_over(more, offset, buf, max_line)
                    if whole is None and long is None:
                        return  # unfinished, not too long yet: it waits for a later read
                    if long is not None:
                        yield long
                        if not long.ended:
                            return
                        offset = long.end
                        continue
                    buf = whole
                    cut = len(buf)
                elif cut < len(buf):
                    buf = buf[:cut]
            offset += cut
            yield buf, offset


def _within(pieces: Iterator[bytes], budget: int) -> Iterator[bytes]:
    """The first `budget` bytes of `pieces`."""
    left = budget
    for piece in pieces:
        if len(piece) >= left:
            yield piece[:left]
            return
        yield piece
        left -= len(piece)


def gzip_pieces(path: Path, offset: int, size: int = 4 << 20) -> Generator[bytes, None, bool]:
    """Decompressed bytes after `offset`, at most `size` at a time whatever the compression ratio; a stream
    still being written yields what is complete so far. Returns whether the file ended at the end of a
    stream (complete), not inside one."""
    skip = offset
    with open(path, "rb") as fh:
        decomp = zlib.decompressobj(wbits=47)
        raw, pending, complete = b"", False, False
        while True:
            if not raw and not pending:
                raw = fh.read(1 << 20)
                if not raw:
                    return complete
            complete = False
            out = decomp.decompress(raw, size)
            # A full piece may leave output inside the decompressor with no input left: asked for again.
            pending = len(out) == size
            if decomp.eof:  # concatenated gzip members
                raw, pending, complete = decomp.unused_data, False, True
                decomp = zlib.decompressobj(wbits=47)
            else:
                raw = decomp.unconsumed_tail
            if skip:
                dropped = min(skip, len(out))
                out, skip = out[dropped:], skip - dropped
            if out:
                yield out


def line_bounds(buf: bytes, newlines: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive, without the newline) of every complete line in `buf`."""
    ends = _newlines(buf) if newlines is None else newlines
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    return starts, ends


def is_utf8(buf: bytes | memoryview) -> bool:
    """Whether all of `buf` is UTF-8, checked by Arrow's validator (no decoded copy of the buffer)."""
    data = pa.py_buffer(buf)
    offsets = pa.py_buffer(np.array([0, len(buf)], dtype=np.int64).tobytes())
    try:
        pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, data]).cast(pa.large_string())
    except pa.ArrowInvalid:
        return False
    return True


def bad_utf8_lines(buf: bytes, starts: np.ndarray) -> set[int]:
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
