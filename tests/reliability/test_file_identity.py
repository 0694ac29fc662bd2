"""File identity under files built to fool it: two files with the same first lines, a file that replaces a
deleted one with the same first lines, and a CSV header longer than a fingerprint's bytes. What is stored
must equal what was written: no row lost, none counted twice, and every decision the fingerprint alone
could not make is an event of the tick.
"""

from __future__ import annotations

import gzip
import json
import shutil
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from tests_support import stored_rows, valid_row

from monitor import config as config_mod
from monitor.daemon.runner import tick
from monitor.ingest.sources.identity import MAX_FP
from storage.store import Store

pytestmark = pytest.mark.reliability

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
COLUMNS = ["request_id", "ts", "model_version", "status", "tenure", "Contract", "latency_ms"]


def jsonl(rows: range, shared: range = range(0)) -> str:
    """JSON Lines of `rows`, after the rows of `shared` (the first lines two files have in common)."""
    return "".join(json.dumps({c: valid_row(i)[c] for c in COLUMNS}) + "\n" for i in [*shared, *rows])


class Run:
    """Ticks of one service over a directory, a minute apart, with their reports."""

    def __init__(self, tmp_path, pattern: str, **limits):
        self.root = tmp_path / "logs"
        self.root.mkdir()
        source = {"kind": "files", "path": str(self.root), "pattern": pattern}
        extra = {"schema": {"features": {"tenure": "numeric", "Contract": "categorical"}},
                 "join": {"lateness": "0s"}}
        if pattern.endswith("csv"):
            extra["schema"]["extra_columns"] = "drop"
        self.cfg = config_mod.parse({"services": [{"name": "churn", "sources": {"predictions": source}, **extra}],
                                     **({"limits": limits} if limits else {})})
        self.store = Store(f"sqlite:///{tmp_path / 'tw.db'}")
        self.store.upgrade()
        self.reports = []

    def tick(self):
        [report] = tick(self.cfg, self.store, NOW + timedelta(minutes=len(self.reports)))
        assert report.status == "ok", report.error
        self.reports.append(report)
        return report

    def stored(self) -> int:
        return stored_rows(self.store)

    def events(self) -> list[str]:
        return [e for r in self.reports for e in r.events]

    def duplicates(self) -> int:
        return sum(r.duplicates for r in self.reports)


@pytest.fixture
def run(tmp_path):
    made = []

    def make(pattern: str, **limits) -> Run:
        made.append(Run(tmp_path, pattern, **limits))
        return made[-1]

    yield make
    for r in made:
        r.store.dispose()


def _record(record_property, written: int, stored: int) -> None:
    record_property("rel_inputs", 1)
    record_property("rel_rows", written)
    record_property("rel_rows_lost", max(0, written - stored))
    record_property("rel_duplicates", max(0, stored - written))


def test_two_live_files_with_the_same_first_lines_are_both_read_whole(run, record_property):
    r = run("*.jsonl", chunk_bytes=16 * 1024)
    shared = range(0, 50)
    (r.root / "a.jsonl").write_text(jsonl(range(1000, 1950), shared))
    r.tick()
    (r.root / "b.jsonl").write_text(jsonl(range(2000, 2950), shared))
    r.tick()
    with open(r.root / "a.jsonl", "a") as fh:  # the first keeps growing: it is still itself
        fh.write(jsonl(range(3000, 3100)))
    r.tick()
    # Each file's lines are rows written, the shared ones too: two files, not a file and its copy.
    written = 1000 + 1000 + 100
    stored = r.stored()
    _record(record_property, written, stored)
    assert stored == written, (stored, r.events())
    assert not any(e.startswith("continues") for e in r.events()), r.events()


def test_a_file_with_the_first_lines_of_a_deleted_one_is_read_from_its_start(run, record_property):
    r = run("*.jsonl", chunk_bytes=16 * 1024)
    shared = range(0, 50)
    (r.root / "a.jsonl").write_text(jsonl(range(1000, 1950), shared))
    (r.root / "x.jsonl").write_text(jsonl(range(5000, 6000)))
    (r.root / "z.jsonl").write_text(jsonl(range(7000, 7500), range(100, 150)))
    r.tick()
    # Rewritten in place with the same first lines and more bytes than were read: the inode a deleted file
    # left free, taken by a new one that starts the same, looks just like this.
    (r.root / "z.jsonl").write_text(jsonl(range(8000, 8600), range(100, 150)))
    (r.root / "a.jsonl").unlink()
    (r.root / "b.jsonl").write_text(jsonl(range(2000, 2950), shared) + jsonl(range(4000, 4950)))
    # A real copy still continues the file it copies: moved across file systems (copied, then deleted).
    shutil.copyfile(r.root / "x.jsonl", r.root / "y.jsonl")
    (r.root / "x.jsonl").unlink()
    with open(r.root / "y.jsonl", "a") as fh:
        fh.write(jsonl(range(6000, 6200)))
    r.tick()
    written = 1000 + 1000 + 1950 + 200 + 550 + 650
    stored = r.stored()
    _record(record_property, written, stored)
    assert stored == written, (stored, r.events())
    assert r.duplicates() == 0
    events = r.events()
    assert "y.jsonl: continues x.jsonl" in events
    assert "z.jsonl: replaced" in events
    assert not any(e.startswith("b.jsonl: continues") for e in events), events
    # Told apart as a new file with the first file's first bytes, or (given the inode the first left free)
    # as that inode now holding other bytes before the offset read.
    assert any(e.startswith(("b.jsonl: distinct from a.jsonl", "b.jsonl: replaced")) for e in events), events


def csv_text(rows: range, header: list[str], header_row: bool = True) -> str:
    head = ",".join(header) + "\n" if header_row else ""
    pad = ",".join("" for _ in header[len(COLUMNS):])
    return head + "".join(",".join(str(valid_row(i)[c]) for c in COLUMNS) + "," + pad + "\n" for i in rows)


def test_a_csv_header_longer_than_a_fingerprint_survives_copytruncate(run, record_property):
    r = run("app.csv*", chunk_bytes=16 * 1024)
    header = COLUMNS + ["note_" + "x" * MAX_FP]  # one column whose name is longer than a fingerprint
    assert len(",".join(header)) > MAX_FP
    path = r.root / "app.csv"
    path.write_text(csv_text(range(0, 500), header))
    r.tick()
    with open(path, "a") as fh:
        fh.write(csv_text(range(500, 1000), header, header_row=False))
    shutil.copyfile(path, r.root / "app.csv.1")  # copytruncate: copied, then emptied in place
    with open(path, "r+") as fh:
        fh.truncate(0)
    with open(path, "a") as fh:  # the application writes its header again, then more rows
        fh.write(csv_text(range(1000, 1700), header))  # past the offset read: no truncation by its size
    r.tick()
    r.tick()
    stored = r.stored()
    _record(record_property, 1700, stored)
    assert stored == 1700, (stored, r.events())
    assert r.duplicates() == 0


def _gz(path, text: str) -> None:
    with gzip.open(path, "wt") as fh:
        fh.write(text)


def test_a_compressed_file_is_told_from_a_copy_by_its_bytes_past_its_head(run, record_property):
    """Past the first MAX_FP decompressed bytes, where the tail of the bytes read lies, a .gz is streamed
    to it: a file with another's first lines is read whole, a real rotation continues, and a rotation still
    being written waits for the bytes read."""
    r = run("*.jsonl*", chunk_bytes=16 * 1024)
    shared = range(0, 50)
    (r.root / "a.jsonl").write_text(jsonl(range(1000, 2000), shared))
    (r.root / "x.jsonl").write_text(jsonl(range(5000, 6000)))
    r.tick()
    assert (r.root / "a.jsonl").stat().st_size > 2 * MAX_FP
    # Moved out of the directory rather than deleted, so no new file takes their inodes (that is a file
    # "replaced", told apart by its own stored state).
    gone = r.root.parent / "gone"
    gone.mkdir()
    # a.jsonl gone; b.jsonl.gz only starts like it.
    (r.root / "a.jsonl").rename(gone / "a.jsonl")
    _gz(r.root / "b.jsonl.gz", jsonl(range(2000, 3000), shared))
    # x.jsonl rotated: more rows, then compressed, first written half-way (a rotation in progress).
    with open(r.root / "x.jsonl", "a") as fh:
        fh.write(jsonl(range(6000, 6300)))
    whole = gzip.compress((r.root / "x.jsonl").read_bytes())
    (r.root / "x.jsonl").rename(gone / "x.jsonl")
    (r.root / "x.jsonl.1.gz").write_bytes(whole[:len(whole) // 2])
    r.tick()
    (r.root / "x.jsonl.1.gz").write_bytes(whole)
    r.tick()
    written = 1050 + 1050 + 1300
    stored = r.stored()
    _record(record_property, written, stored)
    assert stored == written, (stored, r.events())
    assert r.duplicates() == 0
    events = r.events()
    assert "x.jsonl.1.gz: continues x.jsonl" in events, events
    assert any(e.startswith("b.jsonl.gz: distinct from a.jsonl") for e in events), events


def test_a_state_stored_without_a_tail_gets_one_from_its_file(run, record_property):
    """A state kept from before tails were stored gets its tail from its own file on the next read, so a file
    that later starts like it (after it is deleted) is read from its start."""
    r = run("*.jsonl", chunk_bytes=16 * 1024)
    shared = range(0, 50)
    (r.root / "a.jsonl").write_text(jsonl(range(1000, 1950), shared))
    r.tick()
    with r.store.transaction() as s:
        s.execute(text("UPDATE source_offsets SET tail = NULL"))
    r.tick()
    with r.store.transaction() as s:
        assert s.execute(text("SELECT count(*) FROM source_offsets WHERE tail IS NULL")).scalar() == 0
    (r.root / "a.jsonl").unlink()
    (r.root / "b.jsonl").write_text(jsonl(range(2000, 2950), shared) + jsonl(range(4000, 4950)))
    r.tick()
    written = 1000 + 1950
    stored = r.stored()
    _record(record_property, written, stored)
    assert stored == written, (stored, r.events())


def test_a_compressed_file_read_to_its_end_is_not_decompressed_again(run, monkeypatch, record_property):
    """A rotated .gz read to its end is not decompressed again while its size stays (a directory keeps a
    week of them, and a tick comes every minute); one still being written is read on as it grows."""
    from monitor.ingest.sources import chunks, identity

    decompressed = []

    def counting(path, offset, *args):
        pieces = real(path, offset, *args)
        got = 0
        try:
            while True:
                piece = next(pieces)
                got += len(piece)
                yield piece
        except StopIteration as stop:
            return stop.value
        finally:
            pieces.close()
            decompressed.append((path.name, got))

    real = chunks.gzip_pieces
    monkeypatch.setattr(chunks, "gzip_pieces", counting)
    monkeypatch.setattr(identity, "gzip_pieces", counting)
    r = run("*.jsonl*", chunk_bytes=16 * 1024)
    _gz(r.root / "a.jsonl.1.gz", jsonl(range(0, 2000)))
    whole = gzip.compress(jsonl(range(2000, 3000)).encode())
    (r.root / "b.jsonl.1.gz").write_bytes(whole[:len(whole) // 2])  # being written
    r.tick()
    assert {name for name, got in decompressed} == {"a.jsonl.1.gz", "b.jsonl.1.gz"}
    decompressed.clear()
    r.tick()  # nothing changed: nothing decompressed
    assert decompressed == [], decompressed
    (r.root / "b.jsonl.1.gz").write_bytes(whole)
    r.tick()
    assert {name for name, got in decompressed} == {"b.jsonl.1.gz"}, decompressed
    decompressed.clear()
    r.tick()
    assert decompressed == [], decompressed
    stored = r.stored()
    _record(record_property, 3000, stored)
    assert stored == 3000 and r.duplicates() == 0, (stored, r.events())
