"""End-to-end ingest: a directory of rows, every quarantine reason, exactly-once across ticks and crashes."""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from tests_support import stored_rows, valid_row

from monitor import config as config_mod
from monitor.contract import Reason
from monitor.runner import tick
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
        assert store.quarantine_counts(s, "churn") == dict(counts)
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
    real = type(store).upsert_partials

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise OSError("disk went away")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(store), "upsert_partials", flaky)
    [first] = tick(cfg, store, NOW)
    assert first.status == "error" and "disk went away" in first.error
    partial = stored_rows(store)
    assert 0 < partial < VALID
    [second] = tick(cfg, store, NOW)
    assert second.status == "ok", second.error
    assert stored_rows(store) == VALID
    with store.transaction() as s:
        counts = store.quarantine_counts(s, "churn")
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
    from monitor.sources import _complete_chunks

    path = tmp_path / "narrow.jsonl"
    path.write_bytes(b"".join(b'{"i":%d}\n' % i for i in range(10)) + b'{"i":')
    chunks = list(_complete_chunks(path, 0, 1 << 20, chunk_rows=4))
    assert [buf.count(b"\n") for buf, _ in chunks] == [4, 4, 2]
    assert b"".join(buf for buf, _ in chunks) == path.read_bytes()[:path.read_bytes().rindex(b"\n") + 1]
    assert [end for _, end in chunks] == [sum(len(b) for b, _ in chunks[:k + 1]) for k in range(3)]
    # Resuming from an offset counts from there; the unfinished last line waits.
    assert [buf.count(b"\n") for buf, _ in _complete_chunks(path, chunks[0][1], 1 << 20, chunk_rows=4)] == [4, 2]


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
        seen = {(v["kind"], v["value"]): v["first_seen"] for v in store.load_versions(s, "churn")}
    ts = [pd.Timestamp(r["ts"]).to_pydatetime() for r in rows]
    assert seen == {("model_version", "v1"): ts[0], ("preprocess_version", "p1"): ts[0],
                    ("config_hash", "aaa"): ts[0], ("config_hash", "bbb"): ts[6]}
