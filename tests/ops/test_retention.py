"""Retention: compaction keeps every count and the findings of the windows it keeps (whole coarse buckets),
runs on SQLite and PostgreSQL, and quarantine, sent notifications, ticks and job events expire."""

from __future__ import annotations

from datetime import timedelta

from opsfeed import START, feed_lines, partial_table, write_all, write_config
from sqlalchemy import func, insert, select

from monitor import config as config_mod
from monitor.aggregate.partial import Partial, merge_all
from monitor.daemon import jobs, retention
from monitor.verdicts.windows import score
from storage.models import Outbox, QuarantineRow

TIERS = {"tiers": [{"after": "2h", "bucket": "1h"}, {"after": "1d", "bucket": "1d"}],
         "quarantine": "1d", "outbox_sent": "1d", "ticks": "2d", "job_events": "1d"}


def _findings(store, size: timedelta, count: int):
    windows = [(START + i * size, START + (i + 1) * size) for i in range(count)]
    if size == timedelta(days=1):
        windows = [(START.replace(hour=0), START.replace(hour=0) + size)]
    return {(s.start, s.model_version, s.segment, f.check, tuple(sorted(f.labels.items()))):
            (f.status, f.n, None if f.value is None else round(f.value, 9),
             None if f.baseline is None else round(f.baseline, 9))
            for s in score(store, "svc", None, windows) for f in s.findings}


def _hourly(table: dict) -> dict:
    """Partials merged per hour, model version and segment: what compaction must keep."""
    groups: dict = {}
    for (version, start, _, segment), value in table.items():
        groups.setdefault((version, start.replace(minute=0), segment), []).append(value)
    return {k: sum(v[0] for v in vs) for k, vs in groups.items()}


def test_compaction_keeps_counts_and_whole_window_findings(tmp_path, store):
    cfg_path = write_config(tmp_path, retention=TIERS)
    preds, timings = feed_lines(minutes=180, per_minute=6, seed=4)
    write_all(tmp_path / "logs" / "predictions", preds, "predictions")
    write_all(tmp_path / "logs" / "timings", timings, "timings")
    cfg = config_mod.load(cfg_path)
    now = START + timedelta(hours=3, minutes=10)
    jobs.tick_job(cfg, store, now)
    raw = partial_table(store)
    hourly_before, daily_before = _findings(store, timedelta(hours=1), 3), _findings(store, timedelta(days=1), 1)
    with store.transaction() as session:
        first_hour = store.partials.load(session, "svc", START, START + timedelta(hours=1), segment="",
                                         model_version="v1")

    done = retention.apply(cfg, store, START + timedelta(hours=6))
    compacted = partial_table(store)
    assert done["compacted"]["3600s"]["from"] == len(raw) > 3 * len(compacted) > 0
    assert {k[2] for k in compacted} == {3600}
    assert _hourly(compacted) == _hourly(raw)  # every row still counted, in its hour
    with store.transaction() as session:
        (hour,) = [Partial.from_bytes(r.payload) for r in store.partials.load(
            session, "svc", START, START + timedelta(hours=1), segment="", model_version="v1")]
    v1 = merge_all(Partial.from_bytes(r.payload) for r in first_hour)
    assert len(first_hour) == 12 and hour.counts == v1.counts and hour.hists == v1.hists
    assert {k: (s.pos, s.count) for k, s in hour.sketches.items()} == {k: (s.pos, s.count) for k, s in v1.sketches.items()}
    assert _findings(store, timedelta(hours=1), 3) == hourly_before

    # A day later the hours become one day; the daily window scores the same.
    retention.apply(cfg, store, START + timedelta(days=2, hours=1))
    assert {k[2] for k in partial_table(store)} == {86400}
    assert _findings(store, timedelta(days=1), 1) == daily_before
    # Compacting again changes nothing.
    again = partial_table(store)
    retention.apply(cfg, store, START + timedelta(days=2, hours=2))
    assert partial_table(store) == again


def test_expiry_of_quarantine_sent_notifications_ticks_and_job_events(tmp_path, store):
    cfg = config_mod.load(write_config(tmp_path, retention=TIERS))
    old, now = START, START + timedelta(days=3)
    with store.transaction() as session:
        store.quarantine.add(session, [{"service": "svc", "kind": "predictions", "source": "f", "position": "f:1",
                                        "reason": "unparseable", "created_at": t} for t in (old, now)])
        session.execute(insert(Outbox), [
            {"dedup_key": f"k{i}", "created_at": old, "channel": "slack", "payload": {}, "status": status,
             "next_attempt_at": old, "sent_at": old if status == "sent" else None}
            for i, status in enumerate(("sent", "pending", "failed"))])
        tick_id = store.ticks.start(session, "svc", old)
        store.ticks.finish(session, tick_id, "ok", {}, {})
        store.ticks.start(session, "svc", old)  # still running: recovery needs it, never expired
        store.job_events.add(session, old, "tick", "error", "x", "boom")
        store.job_events.add(session, now, "tick", "error", "x", "boom")
    done = retention.apply(cfg, store, now)
    assert done["expired"] == {"quarantine": 1, "outbox_sent": 1, "ticks": 1, "job_events": 1}
    with store.transaction() as session:
        assert session.scalar(select(func.count()).select_from(QuarantineRow)) == 1
        assert sorted(session.scalars(select(Outbox.status))) == ["failed", "pending"]
        assert [t.status for t in store.ticks.last(session, "svc")] == ["running"]
        assert len(store.job_events.load(session, old)) == 1
