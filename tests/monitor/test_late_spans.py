"""A request's stage timings split across two reads: the later ones join the folded request (its bucket
re-folded, the request counted once) within the join's lateness, and are quarantined as late after it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from tests_support import START, valid_row

from monitor import config as config_mod
from monitor.aggregate import keys
from monitor.aggregate.partial import ALL, Partial, merge_all
from monitor.contract import Reason
from monitor.daemon.runner import tick

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
N = 40


def _config(root, fmt: str, lateness: str = "10m", segments: bool = False, chunk_rows: int | None = None) -> config_mod.Config:
    timings = {"kind": "files", "path": str(root / "t")}
    if fmt == "otlp":
        timings["format"] = "otlp"
    service = {"name": "churn",
               "sources": {"predictions": {"kind": "files", "path": str(root / "p")}, "timings": timings},
               "join": {"lateness": lateness}}
    if segments:
        service["schema"] = {"features": {"Contract": "categorical"}, "segments": ["Contract"]}
    return config_mod.parse({"services": [service], "limits": {"chunk_rows": chunk_rows} if chunk_rows else {}})


def _span(request_id: str, stage: str, ms: float) -> dict:
    start = 1_700_000_000_000_000_000
    return {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": stage,
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + int(ms * 1e6)),
            "attributes": [{"key": "request_id", "value": {"stringValue": request_id}}]}


def _write_timings(root, name: str, fmt: str, rows: list[tuple[str, str, float]]) -> None:
    if fmt == "otlp":
        doc = {"resourceSpans": [{"scopeSpans": [{"spans": [_span(r, s, ms) for r, s, ms in rows]}]}]}
        (root / "t" / f"{name}.otlp.json").write_text(json.dumps(doc) + "\n")
    else:
        (root / "t" / f"{name}.jsonl").write_text(
            "".join(json.dumps({"request_id": r, "stage": s, "duration_ms": ms}) + "\n" for r, s, ms in rows))


def _setup(tmp_path, fmt: str, **kw):
    (tmp_path / "p").mkdir()
    (tmp_path / "t").mkdir()
    (tmp_path / "p" / "a.jsonl").write_text("".join(json.dumps(valid_row(i)) + "\n" for i in range(N)))
    _write_timings(tmp_path, "a", fmt, [(f"req-{i:06d}", s, 2.0) for i in range(N) for s in ("parse", "model")])
    return _config(tmp_path, fmt, **kw)


def _merged(store, segment: str | None = ALL) -> Partial:
    with store.transaction() as s:
        rows = store.partials.load(s, "churn", datetime(1970, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC),
                                   segment=segment)
    return merge_all(Partial.from_bytes(r.payload) for r in rows)


def _quarantined(store) -> dict[str, int]:
    with store.transaction() as s:
        return dict(store.quarantine.counts(s, "churn"))


@pytest.mark.parametrize("fmt", ["jsonl", "otlp"])
def test_spans_read_by_a_later_tick_join_their_folded_request(store, tmp_path, fmt):
    cfg = _setup(tmp_path, fmt)
    [r1] = tick(cfg, store, NOW)
    assert r1.joined == N and r1.folded == N
    before = _merged(store)
    assert before.rows == N and before.counts[keys.STAGE_ROWS] == 2 * N
    assert keys.STAGE_PREFIX + "decode" not in before.sketches

    _write_timings(tmp_path, "b", fmt, [(f"req-{i:06d}", "decode", 30.0) for i in range(N)])
    [r2] = tick(cfg, store, NOW + timedelta(minutes=3))
    assert r2.orphan_timings == 0 and r2.pending_timings == 0
    assert r2.quarantined.get(Reason.orphan_timing.value, 0) == 0
    after = _merged(store)
    # The same requests, counted once, now with their third stage.
    assert after.rows == N and after.counts[keys.JOINED] == N
    assert after.counts[keys.STAGE_ROWS] == 3 * N
    decode = after.sketches[keys.STAGE_PREFIX + "decode"]
    assert decode.count == N and decode.sum == pytest.approx(30.0 * N)
    assert after.sketches[keys.STAGE_PREFIX + "model"].count == N
    # The tick re-scores the windows of the buckets the late spans changed.
    assert datetime.fromisoformat(r2.first_ts) == START

    # Nothing is left waiting for an orphan's lateness.
    [r3] = tick(cfg, store, NOW + timedelta(minutes=30))
    assert r3.orphan_timings == 0 and _quarantined(store) == {}
    assert _merged(store).counts == after.counts
    # Requests past twice the lateness are forgotten: their stored blobs are gone.
    with store.transaction() as s:
        assert store.pending.load_each(s, "churn", "folded") == []


@pytest.mark.parametrize("fmt", ["jsonl", "otlp"])
def test_spans_later_than_the_lateness_are_quarantined_as_late(store, tmp_path, fmt):
    cfg = _setup(tmp_path, fmt, lateness="5m")
    tick(cfg, store, NOW)
    before = _merged(store)
    _write_timings(tmp_path, "b", fmt, [(f"req-{i:06d}", "decode", 30.0) for i in range(N)])
    [r2] = tick(cfg, store, NOW + timedelta(minutes=7))
    assert r2.quarantined == {Reason.late_timing.value: N}
    assert r2.quarantined_fields == {f"{Reason.late_timing.value}:timings:request_id": N}
    assert _merged(store).counts == before.counts
    [r3] = tick(cfg, store, NOW + timedelta(minutes=30))
    assert r3.quarantined == {} and r3.pending_timings == 0


@pytest.mark.parametrize("fmt", ["jsonl", "otlp"])
def test_a_stage_sent_again_in_a_later_tick_is_a_duplicate_not_a_second_timing(store, tmp_path, fmt):
    cfg = _setup(tmp_path, fmt)
    tick(cfg, store, NOW)
    before = _merged(store)
    _write_timings(tmp_path, "b", fmt, [(f"req-{i:06d}", "model", 2.0) for i in range(N)]
                   + [("req-000001", "decode", 30.0)])
    [r2] = tick(cfg, store, NOW + timedelta(minutes=2))
    assert r2.duplicate_timings == N and r2.quarantined == {}
    after = _merged(store)
    assert after.rows == N and after.counts[keys.STAGE_ROWS] == 2 * N + 1
    assert after.sketches[keys.STAGE_PREFIX + "model"].count == before.sketches[keys.STAGE_PREFIX + "model"].count
    # A third tick repeating the late stage finds it joined too.
    _write_timings(tmp_path, "c", fmt, [("req-000001", "decode", 30.0)])
    [r3] = tick(cfg, store, NOW + timedelta(minutes=4))
    assert r3.duplicate_timings == 1 and _merged(store).counts == after.counts


def test_late_spans_re_fold_every_segment_of_their_bucket(store, tmp_path):
    cfg = _setup(tmp_path, "jsonl", segments=True)
    tick(cfg, store, NOW)
    segments = {f"Contract={c}" for c in ("Month-to-month", "One year", "Two year")}
    before = {s: _merged(store, s) for s in segments}
    _write_timings(tmp_path, "b", "jsonl", [(f"req-{i:06d}", "decode", 30.0) for i in range(N)])
    tick(cfg, store, NOW + timedelta(minutes=1))
    for s in segments:
        after = _merged(store, s)
        assert after.rows == before[s].rows
        assert after.counts[keys.STAGE_ROWS] == before[s].counts[keys.STAGE_ROWS] * 3 // 2
        assert after.sketches[keys.STAGE_PREFIX + "decode"].count == before[s].rows
    every = _merged(store)
    assert every.rows == N and every.sketches[keys.STAGE_PREFIX + "decode"].count == N


def test_spans_split_across_chunks_of_one_tick_join_once(store, tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "t").mkdir()
    (tmp_path / "p" / "a.jsonl").write_text("".join(json.dumps(valid_row(i)) + "\n" for i in range(N)))
    rows = [(f"req-{i:06d}", s, 2.0) for s in ("parse", "model", "decode") for i in range(N)]
    _write_timings(tmp_path, "a", "jsonl", rows)
    # Each stage's timings in a step of its own.
    [r] = tick(_config(tmp_path, "jsonl", chunk_rows=N), store, NOW)
    assert r.orphan_timings == 0 and r.pending_timings == 0 and r.quarantined == {}
    every = _merged(store)
    assert every.rows == N and every.counts[keys.STAGE_ROWS] == 3 * N
    assert every.sketches[keys.STAGE_PREFIX + "decode"].count == N
