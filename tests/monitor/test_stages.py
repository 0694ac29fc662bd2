"""Each stage of a tick on its own, called with (config or service, store, now, ...): what it stores and
the counts it returns."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from tests_support import START, stored_rows, valid_row

from checks.base import Finding
from monitor import config as config_mod
from monitor.contract import Reason
from monitor.ingest.labels import ingest_labels
from monitor.ingest.stage import Ingested, ingest
from monitor.verdicts.stage import breach, score_quality, score_windows

NOW = START + timedelta(hours=2)


def _config(root, quality: bool = False, timed: bool = True, **limits) -> config_mod.Config:
    (root / "p").mkdir(exist_ok=True)
    (root / "t").mkdir(exist_ok=True)
    service = {
        "name": "churn",
        "sources": {"predictions": {"kind": "files", "path": str(root / "p")},
                    "timings": {"kind": "files", "path": str(root / "t")}},
        "schema": {"features": {"tenure": "numeric", "Contract": "categorical", "notes": "text"},
                   "segments": ["Contract"], "classes": ["No", "Yes"], "positive_class": "Yes"},
        "buckets": {"size": "5m", "windows": ["30m"]},
        "join": {"lateness": "0s"},
    }
    if not timed:
        del service["sources"]["timings"]
    if quality:
        (root / "l").mkdir(exist_ok=True)
        service["sources"]["labels"] = {"kind": "files", "path": str(root / "l")}
        service["quality"] = {"windows": ["1h"], "min_n": 1, "label_horizon": "1d", "coverage_threshold": 0.1,
                              "bootstrap_samples": 20}
    return config_mod.parse({"services": [service], "limits": limits})


def _prediction(i: int) -> dict:
    score = [0.9, 0.2, 0.7, 0.1][i % 4]
    return valid_row(i) | {"prediction": "Yes" if score >= 0.5 else "No", "score_Yes": score}


def _write(path, rows: list) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def _tick_id(store, now: datetime = NOW) -> int:
    with store.transaction() as session:
        return store.ticks.start(session, "churn", now)


def test_ingest_stores_each_step_with_its_offsets_and_returns_its_counts(store, tmp_path):
    cfg = _config(tmp_path)
    _write(tmp_path / "p" / "a.jsonl", [valid_row(i) for i in range(30)] + ["{not json"])
    _write(tmp_path / "t" / "a.jsonl", [{"request_id": f"req-{i:06d}", "stage": "model", "duration_ms": 5.0}
                                        for i in range(10)] + [{"request_id": "nobody", "stage": "model",
                                                                "duration_ms": 1.0}])
    done = ingest(cfg, cfg.services[0], store, NOW, _tick_id(store), None)
    assert dict(done.read) == {"predictions": 31, "timings": 11}
    assert dict(done.accepted) == {"predictions": 30, "timings": 11}
    assert dict(done.quarantined) == {Reason.unparseable.value: 1, Reason.orphan_timing.value: 1}
    assert (done.folded, done.joined, done.unmatched, done.orphan_timings) == (30, 10, 20, 1)
    assert done.buckets > 0 and stored_rows(store) == 30
    first, last = done.span
    assert first == START and last == START + timedelta(seconds=14.5)
    with store.transaction() as session:
        assert store.quarantine.counts(session, "churn") == {"unparseable": 1, "orphan_timing": 1}
    # The offsets went with the rows: a second run reads nothing new and stores nothing twice.
    again = ingest(cfg, cfg.services[0], store, NOW, _tick_id(store), None)
    assert not again.read and again.folded == 0 and again.span is None and stored_rows(store) == 30


def test_ingest_fills_the_given_counts_with_the_steps_committed_before_a_failure(store, tmp_path, monkeypatch):
    # Chunks of 10 rows, no timings to wait for: three steps folding rows; the second one's commit fails,
    # the first stays stored and counted.
    cfg = _config(tmp_path, timed=False, chunk_rows=10)
    _write(tmp_path / "p" / "a.jsonl", [valid_row(i) for i in range(30)])
    upsert, calls = store.partials.upsert, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return upsert(*args, **kwargs)

    monkeypatch.setattr(store.partials, "upsert", failing)
    counts = Ingested()
    with pytest.raises(RuntimeError, match="disk full"):
        ingest(cfg, cfg.services[0], store, NOW, _tick_id(store), None, counts)
    assert counts.folded == 10 and stored_rows(store) == 10


def test_score_windows_stores_the_findings_of_the_windows_touched(store, tmp_path):
    cfg = _config(tmp_path)
    service = cfg.services[0]
    _write(tmp_path / "p" / "a.jsonl", [valid_row(i) for i in range(400)])
    tick_id = _tick_id(store)
    done = ingest(cfg, service, store, NOW, tick_id, None)
    scored = score_windows(service, store, NOW, tick_id, None, done.span)
    with store.transaction() as session:
        stored = store.findings.load(session, "churn")
    assert scored.findings == len(stored) > 0
    # The rows span 200 s: one 30-minute window, closed at NOW.
    assert {(f["window_start"], f["window_end"]) for f in stored} == {(START, START + timedelta(minutes=30))}
    assert all(f["tick_id"] == tick_id for f in stored)
    assert scored.breaches == [line for line in scored.breaches if " v1 " in line]
    # Nothing touched and no window closed since: nothing scored.
    later = score_windows(service, store, NOW + timedelta(minutes=1), tick_id, None, None)
    assert later.findings == 0 and later.breaches == []


def test_ingest_labels_then_score_quality(store, tmp_path):
    cfg = _config(tmp_path, quality=True)
    service = cfg.services[0]
    _write(tmp_path / "p" / "a.jsonl", [_prediction(i) for i in range(8)])
    at = (START + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    _write(tmp_path / "l" / "a.jsonl", [{"request_id": f"req-{i:06d}", "label": "Yes", "label_ts": at}
                                        for i in range(6)]
           + [{"request_id": "req-000007", "label": "Maybe", "label_ts": at},
              {"request_id": "nobody", "label": "No", "label_ts": at}])
    tick_id = _tick_id(store)
    ingested = ingest(cfg, service, store, NOW, tick_id, None)
    labelled = ingest_labels(cfg, service, store, NOW, tick_id)
    assert (labelled.labels_new, labelled.labels_changed, labelled.labels_repeated) == (7, 0, 0)
    assert dict(labelled.read) == {"labels": 8} and dict(labelled.accepted) == {"labels": 7}
    assert dict(labelled.quarantined) == {Reason.unknown_label.value: 1}
    assert sorted(labelled.labelled_at) == [START + timedelta(seconds=0.5 * i) for i in range(6)]
    quality = score_quality(cfg, service, store, NOW, tick_id, labelled.labelled_at, ingested.span)
    with store.transaction() as session:
        stored = store.findings.load(session, "churn")  # no window was scored: all are quality findings
    assert quality.quality_windows >= 1 and quality.quality_findings == len(stored) > 0
    # A day later the label of a request never predicted expires into the quarantine.
    expired = ingest_labels(cfg, service, store, NOW + timedelta(days=1, minutes=1), tick_id)
    assert expired.labels_expired == 1 and dict(expired.quarantined) == {"orphan_label": 1}
    assert expired.labelled_at == []


def test_a_breach_is_one_line():
    finding = Finding("latency", {"stage": "model", "q": "p99"}, 412.3456, "breach", 120, baseline=201.0)
    start = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
    assert breach(start, start + timedelta(hours=1), "v2", finding) == (
        "2026-11-02 10:00+60m v2 latency q=p99 stage=model: 412 ms vs 201 ms (2.1x, n=120 requests)")
