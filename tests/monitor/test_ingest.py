"""End-to-end ingest: a directory of rows, every quarantine reason, exactly-once across ticks and crashes."""

from __future__ import annotations

import gc
import gzip
import json
import math
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from tests_support import stored_rows, valid_row

from monitor import config as config_mod
from monitor.contract import Reason
from monitor.daemon.runner import tick
from storage.models import QuarantineRow

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
VALID = 10_000
BAD_EACH = 50
# Reasons a prediction file can show; bad_duration comes from latency_ms, orphan_timing from the timings.
PREDICTION_REASONS = [Reason.invalid_encoding, Reason.unparseable, Reason.oversize_field, Reason.missing_field,
                      Reason.wrong_type, Reason.bad_timestamp, Reason.future_timestamp, Reason.unknown_status,
                      Reason.bad_duration]


def bad_line(reason: Reason, i: int) -> bytes:
    row = valid_row(i, f"bad-{reason.value}-{i}")
    if reason == Reason.invalid_encoding:
        return json.dumps(row).encode().replace(b"call", b"c\xff\xfell") if row["notes"] else b'{"request_id": "\xff"}'
    if reason == Reason.unparseable:
        return [b"{not json", b"[1, 2, 3]", b'"just a string"', b"{\"request_id\": 1,"][i % 4]
    if reason == Reason.oversize_field:
        row["notes"] = "x" * 70_000
    elif reason == Reason.missing_field:
        del row[["request_id", "ts", "model_version", "status"][i % 4]]
    elif reason == Reason.wrong_type:
        row[["ts", "tenure", "request_id"][i % 3]] = ["yesterday", "twelve", {"nested": [1]}][i % 3]
    elif reason == Reason.bad_timestamp:
        row["ts"] = [-5, "1969-07-20T20:17:00Z", 12][i % 3]
    elif reason == Reason.future_timestamp:
        row["ts"] = (NOW + timedelta(days=3)).isoformat()
    elif reason == Reason.unknown_status:
        row["status"] = ["OK!", "maybe", "200"][i % 3]
    elif reason == Reason.bad_duration:
        row["latency_ms"] = -1.5
    return json.dumps(row).encode()


def write_dataset(root, fmt: str = "jsonl") -> dict[str, Reason]:
    """Valid rows with 50 bad rows of each reason interleaved; returns request positions of the bad ones."""
    (root / "p").mkdir()
    (root / "t").mkdir()
    lines: list[bytes] = []
    expected: dict[int, Reason] = {}
    bad = [(r, k) for k in range(BAD_EACH) for r in PREDICTION_REASONS]
    every = VALID // len(bad)
    b = 0
    for i in range(VALID):
        lines.append(json.dumps(valid_row(i)).encode())
        if i % every == 0 and b < len(bad):
            reason, k = bad[b]
            lines.append(bad_line(reason, k))
            expected[len(lines)] = reason
            b += 1
    assert b == len(bad)
    body = b"\n".join(lines) + b"\n"
    if fmt == "jsonl":
        (root / "p" / "part-0.jsonl").write_bytes(body)
    elif fmt == "jsonl.gz":
        (root / "p" / "part-0.jsonl.gz").write_bytes(gzip.compress(body))
    timings = []
    for i in range(VALID):
        for stage in ("parse", "model"):
            timings.append(json.dumps({"request_id": f"req-{i:06d}", "stage": stage, "duration_ms": 1.5}).encode())
    for k in range(BAD_EACH):
        timings.append(json.dumps({"request_id": f"req-{k:06d}", "stage": "postprocess",
                                   "duration_ms": [-2, "NaN"][k % 2]}).encode().replace(b'"NaN"', b"NaN"))
        timings.append(json.dumps({"request_id": f"ghost-{k}", "stage": "parse", "duration_ms": 1.0}).encode())
    (root / "t" / "part-0.jsonl").write_bytes(b"\n".join(timings) + b"\n")
    return expected


def make_config(root, **limits) -> config_mod.Config:
    raw = {
        "services": [{
            "name": "churn",
            "sources": {"predictions": {"kind": "files", "path": str(root / "p")},
                        "timings": {"kind": "files", "path": str(root / "t")}},
            "schema": {"features": {"tenure": "numeric", "Contract": "categorical", "notes": "text"},
                       "segments": ["Contract"]},
            "join": {"lateness": "0s"},
        }],
        "limits": limits,
    }
    return config_mod.parse(raw)


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz"])
def test_every_reason_quarantined_and_valid_rows_accepted_once(store, tmp_path, fmt):
    expected = write_dataset(tmp_path, fmt)
    cfg = make_config(tmp_path)
    [report] = tick(cfg, store, NOW)
    assert report.status == "ok", report.error
    assert report.accepted["predictions"] == VALID
    assert stored_rows(store) == VALID
    counts = Counter(report.quarantined)
    # Prediction reasons: 50 each; the timings add 50 bad_duration and 50 orphan_timing.
    assert counts == Counter({r.value: BAD_EACH for r in PREDICTION_REASONS}) + Counter(
        {Reason.bad_duration.value: BAD_EACH, Reason.orphan_timing.value: BAD_EACH})
    with store.transaction() as s:
        assert store.quarantine.counts(s, "churn") == dict(counts)
        rows = s.query(QuarantineRow).filter(QuarantineRow.kind == "predictions").all()
    got = {int(r.position.rsplit(":", 1)[1]): r.reason for r in rows}
    assert got == {line: reason.value for line, reason in expected.items()}
    assert all(len(r.excerpt) <= 200 for r in rows)
    assert report.joined == VALID and report.unmatched == 0
    # Nothing new: the second tick reads nothing and stores nothing more.
    [again] = tick(cfg, store, NOW + timedelta(minutes=5))
    assert sum(again.read.values()) == 0 and sum(again.quarantined.values()) == 0
    assert stored_rows(store) == VALID


def test_reader_failing_part_way_then_restarting_accepts_each_row_once(store, tmp_path, monkeypatch):
    write_dataset(tmp_path)
    cfg = make_config(tmp_path, chunk_bytes=64 * 1024)
    calls = {"n": 0}
    real = type(store.partials).upsert

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise OSError("disk went away")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(store.partials), "upsert", flaky)
    [first] = tick(cfg, store, NOW)
    assert first.status == "error" and "disk went away" in first.error
    partial = stored_rows(store)
    assert 0 < partial < VALID
    [second] = tick(cfg, store, NOW)
    assert second.status == "ok", second.error
    assert stored_rows(store) == VALID
    with store.transaction() as s:
        counts = store.quarantine.counts(s, "churn")
    assert counts == {r.value: BAD_EACH for r in PREDICTION_REASONS} | {
        Reason.bad_duration.value: 2 * BAD_EACH, Reason.orphan_timing.value: BAD_EACH}


def test_partial_last_line_waits_until_complete(store, tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "t").mkdir()
    f = tmp_path / "p" / "live.jsonl"
    first, second = json.dumps(valid_row(1)), json.dumps(valid_row(2))
    f.write_text(first + "\n" + second[:20])
    cfg = make_config(tmp_path)
    [r1] = tick(cfg, store, NOW)
    assert r1.read["predictions"] == 1 and sum(r1.quarantined.values()) == 0
    with open(f, "a") as fh:
        fh.write(second[20:] + "\n")
    [r2] = tick(cfg, store, NOW)
    assert r2.read["predictions"] == 1 and r2.accepted["predictions"] == 1
    assert stored_rows(store) == 2


def test_rotation_truncation_and_new_files(store, tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "t").mkdir()
    live = tmp_path / "p" / "app.jsonl"
    live.write_text("".join(json.dumps(valid_row(i)) + "\n" for i in range(10)))
    cfg = make_config(tmp_path)
    tick(cfg, store, NOW)
    # Rotate: rename (same inode, must not be re-read), then a fresh file at the old name.
    live.rename(tmp_path / "p" / "app.jsonl.1")
    with open(tmp_path / "p" / "app.jsonl.1", "a") as fh:  # a last line written after the rename is still read
        fh.write(json.dumps(valid_row(10)) + "\n")
    live.write_text("".join(json.dumps(valid_row(i)) + "\n" for i in range(11, 15)))
    [r] = tick(cfg, store, NOW)
    assert r.read["predictions"] == 5
    # Truncate and rewrite: read again from the start, reported as an event.
    live.write_text(json.dumps(valid_row(20)) + "\n")
    [r] = tick(cfg, store, NOW)
    assert r.read["predictions"] == 1 and any("truncated" in e for e in r.events)
    # A deleted file breaks nothing.
    (tmp_path / "p" / "app.jsonl.1").unlink()
    [r] = tick(cfg, store, NOW)
    assert r.status == "ok" and sum(r.read.values()) == 0
    assert stored_rows(store) == 16


def test_csv_and_parquet_sources(store, tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "t").mkdir()
    rows = [valid_row(i) for i in range(100)]
    frame = pd.DataFrame(rows)
    frame.to_csv(tmp_path / "p" / "a.csv", index=False)
    with open(tmp_path / "p" / "a.csv", "a") as fh:
        fh.write("too,few\n")
        fh.write("req-x,2026-11-02T10:00:00Z,v1,sideways,1,One year,,1\n")
    frame2 = frame.assign(request_id=frame.request_id + "-pq")
    frame2.to_parquet(tmp_path / "p" / "b.parquet")
    [r] = tick(make_config(tmp_path), store, NOW)
    assert r.accepted["predictions"] == 200
    assert r.quarantined == Counter({"unparseable": 1, "unknown_status": 1})
    assert stored_rows(store) == 200


def test_duplicates_first_wins_and_are_counted(store, tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "t").mkdir()
    rows = [valid_row(i) for i in range(5)] + [valid_row(2) | {"status": "error"}]
    (tmp_path / "p" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    [r] = tick(make_config(tmp_path), store, NOW)
    assert r.duplicates == 1 and r.folded == 5


def test_timings_wait_for_late_predictions_within_lateness(store, tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "t").mkdir()
    cfg = config_mod.parse({"services": [{
        "name": "churn",
        "sources": {"predictions": {"kind": "files", "path": str(tmp_path / "p")},
                    "timings": {"kind": "files", "path": str(tmp_path / "t")}},
        "join": {"lateness": "10m"}}]})
    (tmp_path / "t" / "a.jsonl").write_text(json.dumps({"request_id": "req-000001", "stage": "model", "duration_ms": 4}) + "\n")
    [r1] = tick(cfg, store, NOW)
    assert r1.pending_timings == 1 and r1.orphan_timings == 0
    (tmp_path / "p" / "a.jsonl").write_text(json.dumps(valid_row(1)) + "\n" + json.dumps(valid_row(2)) + "\n")
    [r2] = tick(cfg, store, NOW + timedelta(minutes=1))
    assert r2.joined == 1 and r2.pending_predictions == 1  # req 2 still waits for its timings
    [r3] = tick(cfg, store, NOW + timedelta(minutes=12))
    assert r3.unmatched == 1 and r3.pending_predictions == 0
    assert math.isclose(stored_rows(store), 2)


def test_text_chunks_hold_at_most_chunk_rows_lines(tmp_path):
    from monitor.ingest.sources.chunks import complete_chunks

    path = tmp_path / "narrow.jsonl"
    path.write_bytes(b"".join(b'{"i":%d}\n' % i for i in range(10)) + b'{"i":')
    chunks = list(complete_chunks(path, 0, 1 << 20, chunk_rows=4))
    assert [buf.count(b"\n") for buf, _ in chunks] == [4, 4, 2]
    assert b"".join(buf for buf, _ in chunks) == path.read_bytes()[:path.read_bytes().rindex(b"\n") + 1]
    assert [end for _, end in chunks] == [sum(len(b) for b, _ in chunks[:k + 1]) for k in range(3)]
    # Resuming from an offset counts from there; the unfinished last line waits.
    assert [buf.count(b"\n") for buf, _ in complete_chunks(path, chunks[0][1], 1 << 20, chunk_rows=4)] == [4, 2]


def test_first_sightings_of_each_version_field_are_recorded(store, tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "t").mkdir()
    rows = [valid_row(i) | {"config_hash": "aaa" if i < 6 else "bbb", "preprocess_version": "p1"} for i in range(10)]
    (tmp_path / "p" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[5:]))
    cfg = make_config(tmp_path)
    tick(cfg, store, NOW)
    (tmp_path / "p" / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))  # late, older rows
    tick(cfg, store, NOW)
    with store.transaction() as s:
        seen = {(v["kind"], v["value"]): v["first_seen"] for v in store.versions.load(s, "churn")}
    ts = [pd.Timestamp(r["ts"]).to_pydatetime() for r in rows]
    assert seen == {("model_version", "v1"): ts[0], ("preprocess_version", "p1"): ts[0],
                    ("config_hash", "aaa"): ts[0], ("config_hash", "bbb"): ts[6]}


def test_a_tick_keeps_older_objects_from_full_collections_until_it_ends(store, tmp_path, monkeypatch):
    # What was alive before the tick is frozen during it (a full collection then walks only the tick's own
    # objects), and unfrozen after, whether the tick succeeds or raises.
    from monitor.daemon import runner

    (tmp_path / "p").mkdir()
    (tmp_path / "t").mkdir()
    (tmp_path / "p" / "a.jsonl").write_text("".join(json.dumps(valid_row(i)) + "\n" for i in range(20)))
    cfg = make_config(tmp_path)
    frozen, run_service = [], runner.run_service

    def spy(*args):
        frozen.append(gc.get_freeze_count())
        return run_service(*args)

    monkeypatch.setattr(runner, "run_service", spy)
    assert gc.get_freeze_count() == 0
    [report] = tick(cfg, store, NOW)
    assert report.accepted["predictions"] == 20 and frozen[0] > 1000 and gc.get_freeze_count() == 0

    def broken(*args):
        raise RuntimeError("store gone")

    monkeypatch.setattr(runner, "run_service", broken)
    with pytest.raises(RuntimeError):
        tick(cfg, store, NOW)
    assert gc.get_freeze_count() == 0


def test_lines_nested_too_deep_are_quarantined_however_they_are_found():
    # Lines of 1 KiB and more are scanned for their depth before pyarrow sees them (it crashes past 10,000
    # levels); a shorter one is found by the nesting of the parsed types, or among the lines pyarrow refuses.
    from monitor.config import Limits
    from monitor.ingest.sources.jsonl import MAX_JSON_DEPTH, parse_jsonl

    def nested(levels: int, close: bool = True) -> bytes:
        inner = b"[" * (levels - 1) + b"1" + (b"]" * (levels - 1) if close else b"")
        return b'{"request_id": "d", "a": ' + inner + (b"}" if close else b"")

    mixed = b'{"a": ' + b'{"b": [' * 40 + b"1" + b"]}" * 40 + b"}"  # objects in lists: 81 levels
    lines = {3: nested(MAX_JSON_DEPTH), 5: nested(MAX_JSON_DEPTH + 1), 8: nested(70, close=False), 11: mixed,
             14: nested(3000)}
    assert all(len(lines[k]) < 1024 for k in (3, 5, 8, 11)) and len(lines[14]) > 1024
    buf = b"".join((lines.get(k) or json.dumps(valid_row(k)).encode()) + b"\n" for k in range(1, 21))
    frame, rejects, n = parse_jsonl(buf, 0, "f.jsonl", Limits())
    assert n == 20 and sorted(frame["_line"].tolist()) == [k for k in range(1, 21) if k not in (5, 8, 11, 14)]
    assert sorted((r.position, r.reason) for r in rejects) == sorted(
        (f"f.jsonl:{k}", Reason.oversize_field) for k in (5, 8, 11, 14))
    # Alone among shallow lines, the broken deep line is found among those pyarrow refuses.
    buf = b"".join((lines[8] if k == 8 else json.dumps(valid_row(k)).encode()) + b"\n" for k in range(1, 21))
    frame, rejects, _ = parse_jsonl(buf, 0, "f.jsonl", Limits())
    assert len(frame) == 19 and [(r.position, r.reason) for r in rejects] == [("f.jsonl:8", Reason.oversize_field)]


def test_odd_lines_keep_their_values_whichever_blocks_held_only_nulls(monkeypatch):
    # Lines whose field types differ from the rest are kept apart as object columns. One of them has only
    # a null where another has a number: pandas' concat warned there (it will type such columns otherwise).
    import warnings

    from monitor.config import Limits
    from monitor.ingest.sources import jsonl

    monkeypatch.setattr(jsonl, "_JSON_BLOCK_LINES", 1)  # a table per line, as a line of odd types makes
    odd = {4: valid_row(4) | {"ts": -1, "latency_ms": None}, 7: valid_row(7) | {"tenure": "x", "latency_ms": 12.5}}
    buf = b"".join(json.dumps(odd.get(k) or valid_row(k)).encode() + b"\n" for k in range(1, 11))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame, rejects, n = jsonl.parse_jsonl(buf, 0, "f.jsonl", Limits())
    assert n == 10 and not rejects and frame["_line"].tolist() == list(range(1, 11))
    rows = frame.set_index("_line")
    assert rows.at[4, "ts"] == -1 and rows.at[7, "tenure"] == "x" and rows.at[7, "latency_ms"] == 12.5
    assert rows.at[4, "latency_ms"] is None or math.isnan(rows.at[4, "latency_ms"])


def _chunked_jsonl(tmp_path) -> tuple[config_mod.Config, object, dict[int, Reason], list[int]]:
    """A JSON Lines file of some 30 small chunks with bad lines in several of them; returns the config, the file,
    the bad lines (1-based) with their reasons and the lines that hold rows."""
    (tmp_path / "p").mkdir()
    (tmp_path / "t").mkdir()
    bad = {25: b"{not json", 90: b'{"request_id": "\xff\xfe"}', 91: b"[1, 2]",
           160: b'{"deep": ' + b"[" * 80 + b"]" * 80 + b"}", 230: b'{"request_id": "x", "n": [1, 2}', 299: b"{"}
    lines, rows = [], []
    for n in range(1, 321):
        if n in bad:
            lines.append(bad[n])
        elif n % 50 == 0:
            lines.append(b"")  # blank: no row, no reject
        else:
            lines.append(json.dumps(valid_row(n)).encode())
            rows.append(n)
    f = tmp_path / "p" / "a.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n")
    reasons = {n: Reason.unparseable for n in bad} | {90: Reason.invalid_encoding, 160: Reason.oversize_field}
    return make_config(tmp_path, chunk_bytes=2048), f, reasons, rows


def _lines_of(batch) -> list[int]:
    """The lines a batch holds rows of, in order (the few rows of odd types are kept apart, in `frame`)."""
    from monitor.ingest.sources.batch import LINE

    table = batch.table[LINE].to_pylist() if batch.table is not None else []
    assert table == sorted(table)
    return sorted(table + batch.frame[LINE].tolist())


def test_jsonl_chunks_parsed_ahead_come_out_in_order_exactly_once(tmp_path, monkeypatch):
    from monitor.ingest.sources import files, jsonl

    cfg, f, reasons, rows = _chunked_jsonl(tmp_path)
    monkeypatch.setattr(jsonl, "_JSON_BLOCK_LINES", 3)  # several blocks per chunk too
    started = []
    real_start = jsonl.start_jsonl
    monkeypatch.setattr(files, "start_jsonl", lambda *a, **k: started.append(1) or real_start(*a, **k))
    source = files.DirectorySource("p", cfg.services[0].sources.predictions, cfg.limits)
    batches, queued = [], []
    for batch in source.read({}):
        batches.append(batch)
        queued.append(len(started))
    n = len(batches)
    assert n > 20 and sum(1 for b in batches if b.rejects) >= 5
    # The next chunk was read and queued before each batch came out.
    assert queued == [min(k + files._CHUNKS_AHEAD - 1, n) for k in range(1, n + 1)]
    # In order: offsets grow batch by batch, each batch holds the lines of its own chunk, all of them once.
    assert [b.offset.offset for b in batches] == sorted({b.offset.offset for b in batches})
    assert batches[-1].offset.offset == f.stat().st_size and batches[-1].offset.line == 320
    seen_rows, seen_bad = [], {}
    for before, batch in zip([0] + [b.offset.line for b in batches], batches, strict=False):
        lines = _lines_of(batch)
        assert all(before < line <= batch.offset.line for line in lines)
        for r in batch.rejects:
            line = int(r.position.rsplit(":", 1)[1])
            assert before < line <= batch.offset.line and line not in seen_bad
            seen_bad[line] = r.reason
        seen_rows += lines
    assert seen_rows == rows and seen_bad == reasons
    # Resuming from a batch's offsets reads the rest only, numbered on from there.
    rest = list(source.read({batches[9].offset.file_key: batches[9].offset}))
    assert [line for b in rest for line in _lines_of(b)] == [r for r in rows if r > batches[9].offset.line]
    assert sorted(int(r.position.rsplit(":", 1)[1]) for b in rest for r in b.rejects) == [
        line for line in sorted(reasons) if line > batches[9].offset.line]


def _parse_threads() -> set:
    import threading

    return {t for t in threading.enumerate() if t.name.startswith("tailwatch-parse")}


def test_jsonl_read_stopped_early_or_failing_leaves_no_parse_thread(tmp_path, monkeypatch):
    from monitor.ingest.sources import files, jsonl

    cfg, _, _, _ = _chunked_jsonl(tmp_path)
    source = files.DirectorySource("p", cfg.services[0].sources.predictions, cfg.limits)
    before = _parse_threads()  # a reader another test left to the garbage collector is not this one's
    batches = source.read({})
    first = next(batches)
    assert first.offset.line > 0 and _parse_threads() - before
    batches.close()  # the caller stops with chunks still queued
    assert not _parse_threads() - before

    # A parse that fails surfaces at its own batch, after the batches before it; later chunks are dropped.
    real_block = jsonl._parse_json_block

    def failing(buf, view, starts, ends, idx, first_line, *rest):
        if first_line + idx[0] + 1 <= 150 <= first_line + idx[-1] + 1:
            raise RuntimeError("parser broke")
        return real_block(buf, view, starts, ends, idx, first_line, *rest)

    monkeypatch.setattr(jsonl, "_parse_json_block", failing)
    got = []
    with pytest.raises(RuntimeError, match="parser broke"):
        for batch in source.read({}):
            got.append(batch.offset.line)
    assert got and got[-1] < 150 and got == sorted(got)
    assert not _parse_threads() - before

    # Closed on one of its own parse threads (where the garbage collector may collect it, as it did once in
    # a fault test): the read cannot wait for that thread; it must not raise, and its threads still end.
    go, lock, closed = threading.Event(), threading.Lock(), []

    def closing(buf, view, starts, ends, idx, first_line, *rest):
        if first_line > 0:  # a later chunk's block: parsed once the caller holds the first batch
            go.wait(10)
            with lock:
                if not closed:
                    try:
                        batches.close()
                        closed.append("closed")
                    except Exception as exc:  # noqa: BLE001 - the test reports it
                        closed.append(exc)
        return real_block(buf, view, starts, ends, idx, first_line, *rest)

    monkeypatch.setattr(jsonl, "_parse_json_block", closing)
    batches = source.read({})
    assert next(batches).offset.line > 0
    go.set()
    deadline = time.monotonic() + 10
    while (not closed or _parse_threads() - before) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert closed == ["closed"]
    assert not _parse_threads() - before
