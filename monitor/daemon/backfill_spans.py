"""OTLP-JSON span files in a backfill: each export request released at its spans' own times, not with its file.

An OpenTelemetry Collector writes the spans of many requests and replicas into one export request per line,
and several instances write (and rotate) files side by side, so a line's place in a file says little about
when its spans were known: a file that spans an hour, released whole (or each line after the latest one
before it), reaches its predictions after their lateness. A backfill therefore rewrites each span file into a
released copy: its lines reordered by the step whose clock first reaches the latest end among a line's spans
(when the exporter could have written it; the spans of one export stay together, as a live tick reads them),
and the staged file grows from that copy as the clock moves. The join's lateness is then counted from the
spans' own times, as a live tick counts it from when it read them.

A file is handed over up to the first line holding a span after `until`: the daemon goes on from there, and
the spans before that line are replayed, those from it on left to the daemon (read once, as live).
Compressed span files are not rewritten: they appear whole (see `backfill`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from monitor.ingest.otlp import span_end
from monitor.ingest.sources.chunks import BOM
from monitor.ingest.sources.identity import MAX_FP, fingerprint_of
from storage.offsets import OffsetState


@dataclass(frozen=True)
class Released:
    """A span file's released copy and what the daemon reads of the real file after the backfill."""

    copy: Path  # the rewritten file the staged copy grows from
    times: np.ndarray  # datetime64[ns] clock at which each line of `copy` is visible, non-decreasing
    ends: np.ndarray  # byte end of each line of `copy`
    offset: int  # bytes of the real file replayed (whole lines): the daemon reads from here on
    lines: int  # lines of the real file replayed


def release(real: Path, copy: Path, clocks: np.ndarray, read: OffsetState | None) -> Released:
    """Rewrite `real` (OTLP-JSON, uncompressed) into `copy`, each line at the first of `clocks` (the steps'
    clocks, datetime64[ns], increasing) at or after the latest end of its spans; `read`: what the daemon
    read of it before."""
    data = real.read_bytes()
    start, line0 = (read.offset, read.line) if read is not None else (0, 0)
    if start == 0 and data.startswith(BOM):
        start = len(BOM)
    whole = data.rfind(b"\n") + 1  # a last line without its newline is not written yet
    units = _units(data, start, whole)
    until = int(clocks[-1].astype("datetime64[ns]").astype(np.int64))
    # A line (an export) is replayed when every span it holds ended by `until`; the first that did not,
    # and every line after it, are the daemon's.
    latest = [max((t for t in _times(doc) if t is not None), default=None) for _, _, doc in units]
    handed = next((i for i, t in enumerate(latest) if t is not None and t > until), len(units))
    steps = clocks.astype("datetime64[ns]").astype(np.int64)
    order, fill = [], int(steps[0])
    for i in range(handed):
        fill = latest[i] if latest[i] is not None else fill  # no time (or no JSON): with the line before
        order.append((_step(steps, fill), i))
    order.sort()
    copy.parent.mkdir(parents=True, exist_ok=True)
    with open(copy, "wb") as fh:
        fh.writelines(units[i][1].rstrip(b"\r") + b"\n" for _, i in order)
    ends = np.cumsum([len(units[i][1].rstrip(b"\r")) + 1 for _, i in order], dtype=np.int64)
    times = steps[[k for k, _ in order]].astype("datetime64[ns]")
    # The daemon goes on after the last replayed line (after the BOM or what it read before, if none).
    offset = units[handed - 1][0] if handed else start
    return Released(copy, times, ends, offset, line0 + data.count(b"\n", start, offset))


def handover(real: Path, released: Released, read: OffsetState | None) -> OffsetState | None:
    """The real file's offset state once the backfill is done (None when nothing of it was replayed)."""
    if released.offset <= (read.offset if read is not None else 0):
        return read
    fd = os.open(real, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        head = os.read(fd, min(st.st_size, MAX_FP))
    finally:
        os.close(fd)
    return OffsetState(f"{st.st_dev}:{st.st_ino}", str(real), released.offset, released.lines, None,
                       fingerprint_of(head), released.offset)


def _units(data: bytes, start: int, whole: int) -> list[tuple[int, bytes, object]]:
    """(byte end, the text, its parsed document or None when it is no JSON) per export request: each line,
    or the whole text when it is one pretty-printed document."""
    if start >= whole:
        return []
    body = data[start:whole]
    if body.count(b"\n") > 1:
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            doc = None
        if isinstance(doc, dict):
            return [(whole, body, doc)]
    units, at = [], start
    for raw in body.split(b"\n")[:-1]:
        at += len(raw) + 1
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            doc = None  # replayed as written, for the tick to quarantine
        units.append((at, raw, doc))
    return units


def _times(doc) -> list[int | None]:
    if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans"), list):
        return []
    return [span_end(span) for r in doc["resourceSpans"] if isinstance(r, dict)
            for key in ("scopeSpans", "instrumentationLibrarySpans") for s in (r.get(key) or ())
            if isinstance(s, dict) and isinstance(s.get("spans"), list) for span in s["spans"]]


def _step(steps: np.ndarray, nanos: int) -> int:
    """The index of the first step clock at or after `nanos` (the last one for a time past them all)."""
    return min(int(np.searchsorted(steps, nanos, side="left")), len(steps) - 1)
