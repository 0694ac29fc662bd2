"""A backfill over OTLP-JSON span files shaped like a Collector's file exporter output (many resourceSpans per
line, several rotating files, spans out of time order) keeps what one tick over the same files keeps: every
span joined, none an orphan; and it says what it did in a summary."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import yaml
from collector_spans import collector_feed
from opsfeed import START, config_dict, write_all, write_config
from sqlalchemy import text
from typer.testing import CliRunner

from monitor import config as config_mod
from monitor.cli import app
from monitor.daemon import backfill, jobs
from storage.store import Store

UNTIL = START + timedelta(hours=1)
END = UNTIL + timedelta(minutes=30)
STEPS = (timedelta(minutes=5), timedelta(minutes=15))


@pytest.fixture(scope="module")
def spans_feed():
    return collector_feed(START, minutes=60, per_minute=15, seed=11)


def _setup(work, feed, lateness: str = "2m", write: bool = True):
    raw = config_dict(work / "tw.db", chunk_rows=2000)
    service = raw["services"][0]
    service["sources"]["timings"] = {"kind": "files", "path": "./logs/timings", "format": "otlp"}
    service["join"] = {"lateness": lateness}
    for kind in ("predictions", "timings"):
        (work / "logs" / kind).mkdir(parents=True, exist_ok=True)
    path = work / "tailwatch.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    preds, files, _ = feed
    if write:
        write_all(work / "logs" / "predictions", preds, "predictions")
        for name, lines in files.items():
            (work / "logs" / "timings" / name).write_bytes(b"".join(line for _, line in lines))
    cfg = config_mod.load(path)
    store = Store(cfg.storage.url)
    store.upgrade()
    return path, cfg, store


def _counts(store):
    with store.transaction() as session:
        reasons = store.quarantine.counts(session, "svc")
    with store.engine.connect() as conn:
        joined, unmatched = conn.execute(text("select sum(joined), sum(unmatched) from ticks")).one()
    return dict(reasons), joined, unmatched


def _live(work, feed, step: timedelta, until):
    """Ticks every `step` while the Collector instances write their lines, as they wrote them."""
    _, cfg, store = _setup(work, feed, write=False)
    preds, files, _ = feed
    now = START
    while now < until:
        now = min(now + step, until)
        with open(work / "logs" / "predictions" / "predictions.jsonl", "wb") as fh:
            fh.writelines(line for at, line in preds if at <= now)
        for name, lines in files.items():
            written = b"".join(line for at, line in lines if at <= now)
            if written:
                (work / "logs" / "timings" / name).write_bytes(written)
        jobs.tick_job(cfg, store, now)
    return _counts(store)


@pytest.fixture(scope="module")
def live(tmp_path_factory, spans_feed):
    return {step: _live(tmp_path_factory.mktemp("live"), spans_feed, step, END) for step in STEPS}


def test_the_collector_feed_is_out_of_time_order_across_files_and_lines(spans_feed):
    preds, files, written = spans_feed
    assert len(files) >= 6 and written == 4 * len(preds)
    # Within a line, spans are not in the order they ended (a resourceSpans per replica).
    assert any(_ends(line) != sorted(_ends(line)) for lines in files.values() for _, line in lines)
    # A file covers many minutes: released whole at its latest span, it is far behind its first ones.
    ends = {name: [e for _, line in lines for e in _ends(line)] for name, lines in files.items()}
    assert min(max(e) - min(e) for e in ends.values()) > 15 * 60e9  # longer than a step of 15m


def _ends(line: bytes) -> list[int]:
    return [int(s["endTimeUnixNano"]) for r in json.loads(line)["resourceSpans"]
            for sc in r["scopeSpans"] for s in sc["spans"]]


@pytest.mark.parametrize("step", STEPS)
def test_backfill_joins_the_spans_live_ticks_joined(tmp_path, spans_feed, live, step):
    preds, _, written = spans_feed
    live_reasons, live_joined, live_unmatched = live[step]
    _, cfg, store = _setup(tmp_path, spans_feed)
    result = backfill.run(cfg, store, START, END, step=step)
    assert result.done
    reasons, joined, unmatched = _counts(store)
    print(step, "live", live[step], "backfill", (reasons, joined, unmatched))
    assert (joined, unmatched) == (len(preds), 0) == (live_joined, live_unmatched)
    # A request whose spans went out in two exports, read in two ticks, leaves its later spans orphaned,
    # live as in the replay; nothing more.
    assert reasons.get("orphan_timing", 0) <= live_reasons.get("orphan_timing", 0) + 0.002 * written, reasons


def test_backfill_hands_over_span_files_and_the_daemon_reads_each_span_once(tmp_path, spans_feed):
    """A backfill to a clock inside the files (stopped and resumed on the way): the daemon goes on from the
    first line with a later span, and no span is read twice (an orphan or a duplicate) or skipped."""
    _, cfg, store = _setup(tmp_path, spans_feed)
    until, step = START + timedelta(minutes=35), timedelta(minutes=5)
    first = backfill.run(cfg, store, START, until, step=step, max_steps=3)  # and resumed: the same copies
    result = backfill.run(cfg, store, START, until, step=step)
    assert not first.done and result.done and result.resumed_from == first.reached
    jobs.tick_job(cfg, store, END)
    reasons, joined, unmatched = _counts(store)
    assert "duplicate_timing" not in reasons
    # Only spans of lines the backfill could not hand over whole, read after their predictions left, are
    # orphans: a few lines per file at the clock it stopped at.
    assert reasons.get("orphan_timing", 0) < 0.1 * spans_feed[2], reasons
    assert joined + unmatched == len(spans_feed[0])
    # Every span read exactly once: by the replay (its copies) or by the daemon (the real files after it).
    with store.transaction() as session:
        ticks = store.ticks.search(session, "svc")
    assert len(ticks) == 8 and sum(t.summary["read"].get("timings", 0) for t in ticks) == spans_feed[2]
    assert ticks[0].summary["read"]["timings"] > 0.1 * spans_feed[2]  # the daemon's tick had lines left


def test_backfill_prints_a_summary(tmp_path, spans_feed):
    cfg_path, _, store = _setup(tmp_path, spans_feed)
    result = CliRunner().invoke(app, ["--config", str(cfg_path), "backfill", "--since", START.isoformat(),
                                      "--until", END.isoformat(), "--step", "15m"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    reasons, joined, unmatched = _counts(store)
    preds, _, written = spans_feed
    assert f"read {len(preds):,} predictions, {written:,} timings;" in out, out
    assert f"{joined:,} joined with timings, {unmatched:,} without, {reasons.get('orphan_timing', 0):,} orphan timings" in out
    assert "quarantined: " + ", ".join(f"{k} {n:,}" for k, n in reasons.items()) in out, out
    with store.transaction() as session:
        opened = store.incidents.search(session, "svc")
    assert f"{len(opened)} incidents opened" in out, out


def test_the_quarantine_share_counts_the_rows_it_quarantines(tmp_path):
    """Timings read by one tick and let go as orphans by the next count in the next tick's share: its rows
    are those read then plus those it let go, never a share above 100%."""
    cfg_path = write_config(tmp_path, chunk_rows=2000)
    cfg = config_mod.load(cfg_path)
    store = Store(cfg.storage.url)
    store.upgrade()
    at = START + timedelta(minutes=10)
    timings = [{"request_id": f"gone-{i}", "stage": "model", "duration_ms": 5.0,
                "start_ts": (START + timedelta(seconds=i)).isoformat().replace("+00:00", "Z")} for i in range(300)]
    (tmp_path / "logs" / "timings" / "t.jsonl").write_text("".join(json.dumps(t) + "\n" for t in timings))
    first = jobs.tick_job(cfg, store, at)[0]
    assert first.pending_timings == 300 and not first.warnings
    preds = [{"request_id": f"new-{i}", "ts": (at + timedelta(seconds=i)).isoformat().replace("+00:00", "Z"),
              "model_version": "v1", "status": "ok", "tenure": 3, "Contract": "One year"} for i in range(20)]
    (tmp_path / "logs" / "predictions" / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in preds))
    second = jobs.tick_job(cfg, store, at + timedelta(minutes=5))[0]
    assert second.quarantined == {"orphan_timing": 300} and sum(second.read.values()) == 20
    assert len(second.warnings) == 1 and "quarantined 300 of 320 rows (94%" in second.warnings[0], second.warnings
