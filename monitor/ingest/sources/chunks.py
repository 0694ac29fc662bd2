"""Reading a growing text file (plain or gzip) in stretches of whole lines, and scanning a buffer's lines
(newlines, UTF-8) without a decoded copy."""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

_SCAN_BYTES = 64 << 10  # bytes per numpy call when scanning a buffer (see scan)
BOM = b"\xef\xbb\xbf"


def first_line_of(path: Path) -> bytes | None:
    with _open(path) as fh:
        line = fh.readline(1 << 20)
    return line if line.endswith(b"\n") else None


def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def complete_chunks(path: Path, offset: int, chunk_bytes: int,
                     chunk_rows: int | None = None) -> Iterator[tuple[bytes, int]]:
    """Stretches of whole lines after byte `offset` (decompressed offset for .gz), with the end offset.

    A stretch holds at most `chunk_bytes` bytes (unless one line is longer) and `chunk_rows` lines.
    A last line without its newline is left for a later read: it may still be being written.
    """
    for buf, end, _ in line_chunks(path, offset, chunk_bytes, chunk_rows):
        yield buf, end


def line_chunks(path: Path, offset: int, chunk_bytes: int,
                 chunk_rows: int | None = None) -> Iterator[tuple[bytes, int, np.ndarray | None]]:
    """`complete_chunks`, with the position of each newline in the stretch when it was found (else None)."""
    for buf, end in byte_chunks(path, offset, chunk_bytes):
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


def byte_chunks(path: Path, offset: int, chunk_bytes: int) -> Iterator[tuple[bytes, int]]:
    """`complete_chunks` by bytes only."""
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
    """`byte_chunks` of an uncompressed file: each chunk read once, at its size, where it starts.

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
