"""Faults during a tick: the database going away, the disk filling up, a source file replaced under the
reader, the clock jumping. For each: the tick fails cleanly (status `error`, nothing half-written) or goes
on, the next tick picks up where the last commit left off, and the stored state equals a run without the
fault: no accepted row lost, none counted twice.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from tests_support import valid_row

from monitor import config as config_mod
from monitor.aggregate.partial import ALL, Partial
from monitor.daemon.runner import tick
from monitor.ingest.sources import chunks as chunks_mod
from storage.store import Store

pytestmark = pytest.mark.reliability

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
ROWS = 4_000


def write_rows(root, name: str, start: int, n: int, bad_every: int = 97) -> None:
    """`n` valid rows from `start`, with an unparseable line after every `bad_every` rows."""
    lines = []
    for i in range(start, start + n):
        lines.append(json.dumps(valid_row(i)))
        if i % bad_every == 0:
            lines.append("{broken")
    (root / "p").mkdir(exist_ok=True)
    with open(root / "p" / name, "a") as fh:
        fh.write("\n".join(lines) + "\n")


def make_config(root) -> config_mod.Config:
    return config_mod.parse({
        "services": [{"name": "churn", "sources": {"predictions": {"kind": "files", "path": str(root / "p")}},
                      "schema": {"features": {"tenure": "numeric", "Contract": "categorical", "notes": "text"},
                                 "segments": ["Contract"]},
                      "join": {"lateness": "0s"}}],
        # Small chunks: a tick commits in many steps, so a fault lands between and inside them.
        "limits": {"chunk_bytes": 64 * 1024}})


def stored(store: Store) -> tuple[int, Counter, dict]:
    """(rows in partials, quarantine counts, per-bucket row counts) as stored."""
    with store.transaction() as s:
        rows = store.partials.load(s, "churn", datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC),
                                   segment=ALL)
        quarantine = Counter(store.quarantine.counts(s, "churn"))
    per_bucket = {(r.bucket_start, r.model_version): Partial.from_bytes(r.payload).rows for r in rows}
    return sum(per_bucket.values()), quarantine, per_bucket


def reference_run(tmp_path_factory, files: list[tuple[str, int, int]]) -> tuple[int, Counter, dict]:
    """The stored state of an uninterrupted run over the same files."""
    root = tmp_path_factory.mktemp("reference")
    for name, start, n in files:
        write_rows(root, name, start, n)
    store = Store(f"sqlite:///{root / 'ref.db'}")
    store.upgrade()
    try:
        [report] = tick(make_config(root), store, NOW)
        assert report.status == "ok", report.error
        return stored(store)
    finally:
        store.dispose()


def failing_on_call(monkeypatch, repository, method: str, call: int, fault) -> dict:
    """Make the `call`-th call of `repository`.`method` run `fault(session)` first; returns the call counter."""
    calls = {"n": 0}
    real = getattr(type(repository), method)

    def wrapped(self, session, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            fault(session)
        return real(self, session, *args, **kwargs)

    monkeypatch.setattr(type(repository), method, wrapped)
    return calls


@pytest.mark.postgres
def test_database_connection_killed_mid_tick_then_back(request, tmp_path, tmp_path_factory, monkeypatch,
                                                       record_property):
    url, connect_args = request.getfixturevalue("pg_schema")
    store = Store(url, connect_args=connect_args)
    store.upgrade()
    write_rows(tmp_path, "a.jsonl", 0, ROWS)
    expected = reference_run(tmp_path_factory, [("a.jsonl", 0, ROWS)])

    def kill_own_connection(session):
        # The server ends this backend, as a restart or failover would: the statement after it fails.
        try:
            session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
        except Exception:
            pass

    failing_on_call(monkeypatch, store.partials, "upsert", 3, kill_own_connection)
    cfg = make_config(tmp_path)
    [first] = tick(cfg, store, NOW)
    assert first.status == "error" and first.error
    assert 0 < stored(store)[0] < expected[0]  # the steps before the fault were committed
    [second] = tick(cfg, store, NOW + timedelta(minutes=1))
    assert second.status == "ok", second.error
    assert stored(store) == expected
    store.dispose()
    record_property("rel_inputs", 1)
    record_property("rel_rows", ROWS)
    record_property("rel_faults", 1)
    record_property("rel_rows_lost", expected[0] - stored_rows_now(url, connect_args))


def stored_rows_now(url, connect_args) -> int:
    store = Store(url, connect_args=connect_args)
    try:
        return stored(store)[0]
    finally:
        store.dispose()


def test_disk_full_mid_tick_then_space_freed(tmp_path, tmp_path_factory, monkeypatch, record_property):
    store = Store(f"sqlite:///{tmp_path / 'tw.db'}")
    store.upgrade()
    write_rows(tmp_path, "a.jsonl", 0, ROWS)
    expected = reference_run(tmp_path_factory, [("a.jsonl", 0, ROWS)])

    def fill_disk(session):
        # SQLite's own "database or disk is full" (SQLITE_FULL): no page may be added past the current count.
        pages = session.execute(text("PRAGMA page_count")).scalar()
        session.execute(text(f"PRAGMA max_page_count = {pages}"))
        session.execute(text("CREATE TABLE IF NOT EXISTS filler (x BLOB)"))
        session.execute(text("INSERT INTO filler VALUES (zeroblob(1048576))"))

    failing_on_call(monkeypatch, store.partials, "upsert", 3, fill_disk)
    cfg = make_config(tmp_path)
    [first] = tick(cfg, store, NOW)
    assert first.status == "error" and "full" in first.error.lower()
    partial = stored(store)[0]
    assert 0 < partial < expected[0]
    store.dispose()  # space freed: the limit was per connection, new connections have none
    [second] = tick(cfg, store, NOW + timedelta(minutes=1))
    assert second.status == "ok", second.error
    assert stored(store) == expected
    with store.transaction() as s:  # the filler table never committed
        assert s.execute(text("SELECT count(*) FROM sqlite_master WHERE name = 'filler'")).scalar() == 0
    record_property("rel_inputs", 1)
    record_property("rel_rows", ROWS)
    record_property("rel_faults", 1)
    record_property("rel_rows_lost", expected[0] - stored(store)[0])


def test_source_file_replaced_under_the_reader(tmp_path, monkeypatch, record_property):
    store = Store(f"sqlite:///{tmp_path / 'tw.db'}")
    store.upgrade()
    write_rows(tmp_path, "app.jsonl", 0, ROWS)
    live = tmp_path / "p" / "app.jsonl"
    real = chunks_mod.byte_chunks  # the reader's lowest level: the file is swapped between two of its reads
    replaced = {"done": False}

    def replacing(path, offset, *args, **kwargs):
        for n, chunk in enumerate(real(path, offset, *args, **kwargs)):
            yield chunk
            if n == 1 and not replaced["done"]:
                # A log shipper swaps the file for a new one (new inode) while the tick reads it.
                replaced["done"] = True
                fresh = tmp_path / "p" / "app.jsonl.tmp"
                fresh.write_text("".join(json.dumps(valid_row(i)) + "\n" for i in range(50_000, 50_100)))
                os.replace(fresh, live)

    monkeypatch.setattr(chunks_mod, "byte_chunks", replacing)
    cfg = make_config(tmp_path)
    reports = [tick(cfg, store, NOW + timedelta(minutes=k))[0] for k in range(3)]
    assert all(r.status == "ok" for r in reports), [r.error for r in reports]
    assert replaced["done"], "the file was never swapped: the patched reader function is not the one in use"
    read = sum(r.read["predictions"] for r in reports)
    accepted = sum(r.accepted["predictions"] for r in reports)
    quarantined = sum(sum(r.quarantined.values()) for r in reports)
    assert read == accepted + quarantined
    rows, _, _ = stored(store)
    duplicates = sum(r.duplicates for r in reports)
    assert rows == accepted - duplicates
    # The replacement's 100 rows are all read, once; the old file's first chunks were committed before.
    assert rows >= 100 and reports[-1].read["predictions"] == 0
    assert duplicates == 0
    record_property("rel_inputs", 1)
    record_property("rel_rows", read)
    record_property("rel_faults", 1)
    record_property("rel_rows_lost", read - accepted - quarantined)
    record_property("rel_duplicates", duplicates)


def test_clock_jumps_back_and_forward(tmp_path, tmp_path_factory, record_property):
    store = Store(f"sqlite:///{tmp_path / 'tw.db'}")
    store.upgrade()
    (tmp_path / "p").mkdir()
    cfg = make_config(tmp_path)
    plan = [(NOW, 0), (NOW - timedelta(hours=2), 1000), (NOW + timedelta(days=3), 2000),
            (NOW + timedelta(minutes=5), 3000), (NOW + timedelta(days=3, minutes=5), 4000)]
    read = accepted = quarantined = 0
    for now, start in plan:
        write_rows(tmp_path, "a.jsonl", start, 1000)
        [report] = tick(cfg, store, now)
        assert report.status == "ok", report.error
        read += report.read["predictions"]
        accepted += report.accepted["predictions"]
        quarantined += sum(report.quarantined.values())
    assert read == accepted + quarantined
    rows, quarantine, _ = stored(store)
    assert rows == accepted
    # Rows ahead of a clock that jumped back are quarantined as future, with their reason, not lost.
    assert quarantine["future_timestamp"] > 0
    record_property("rel_inputs", 1)
    record_property("rel_rows", read)
    record_property("rel_faults", 2)
    record_property("rel_rows_lost", read - accepted - quarantined)
