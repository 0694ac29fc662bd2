"""How logs are really shipped, one case each: compressed rotations, copytruncate past a long CSV header,
the same requests in two files, links (to a file beside it, out of the directory), an unreadable file,
many small files, timestamps without an offset, booleans as features, and the readers of raw logs on rows
a tick quarantines. Each compares what is stored with the rows written: none lost, none counted twice.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from datetime import UTC, datetime, timedelta

import pytest
from tests_support import stored_rows, valid_row
from typer.testing import CliRunner

from monitor import config as config_mod
from monitor.daemon.runner import tick
from monitor.ingest.sources import chunks as chunks_mod
from monitor.ingest.sources import files as files_mod
from storage.offsets import Offsets
from storage.store import Store

pytestmark = pytest.mark.reliability

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


def rows(start: int, n: int, **extra) -> str:
    return "".join(json.dumps(valid_row(i) | extra) + "\n" for i in range(start, start + n))


def make_config(root, pattern: str = "*", features: dict | None = None, limits: dict | None = None,
                **source) -> config_mod.Config:
    return config_mod.parse({
        "services": [{"name": "churn",
                      "sources": {"predictions": {"kind": "files", "path": str(root), "pattern": pattern, **source}},
                      "schema": {"features": features or {"tenure": "numeric", "Contract": "categorical"}},
                      "join": {"lateness": "0s"}}],
        "limits": limits or {}})


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'tw.db'}")
    s.upgrade()
    yield s
    s.dispose()


def run(cfg, store, ticks: int = 1, start: int = 0):
    reports = [tick(cfg, store, NOW + timedelta(minutes=start + k))[0] for k in range(ticks)]
    assert all(r.status == "ok" for r in reports), [r.error for r in reports]
    return reports


def quarantine(store) -> list:
    from sqlalchemy import text

    with store.transaction() as s:
        return s.execute(text("SELECT reason, position, excerpt FROM quarantine")).all()


def record(record_property, written: int, stored: int, duplicates: int = 0, faults: int = 1) -> None:
    record_property("rel_inputs", 1)
    record_property("rel_rows", written)
    record_property("rel_faults", faults)
    record_property("rel_rows_lost", max(0, written - stored))
    record_property("rel_duplicates", max(0, stored - written) + duplicates)


def test_a_compressed_rotation_continues_where_the_file_was_read(tmp_path, store, record_property):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.jsonl").write_text(rows(0, 1000))
    cfg = make_config(logs, "*.jsonl*")
    run(cfg, store)
    (logs / "a.jsonl").write_text(rows(0, 1200))  # 200 more rows before the rotation
    (logs / "a.jsonl").rename(logs / "a.jsonl.1")
    with open(logs / "a.jsonl.1", "rb") as src, gzip.open(logs / "a.jsonl.1.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(logs / "a.jsonl.1")
    (logs / "a.jsonl").write_text(rows(5000, 300))
    reports = run(cfg, store, ticks=2, start=1)
    assert stored_rows(store) == 1500
    assert any("continues a.jsonl" in e for e in reports[0].events)
    assert sum(r.duplicates for r in reports) == 0
    record(record_property, 1500, stored_rows(store))


def test_copytruncate_of_a_csv_with_a_long_header_rewritten_past_the_old_offset(tmp_path, store, record_property):
    logs = tmp_path / "logs"
    logs.mkdir()
    extra = [f"an_unusually_long_column_name_{k:02d}" for k in range(12)]
    header = ",".join(["request_id", "ts", "model_version", "status", "tenure", "Contract", *extra]) + "\n"
    assert len(header) >= 256

    def csv_rows(start, n, fill="x"):
        return "".join(f"{r['request_id']},{r['ts']},v1,ok,{r['tenure']},{r['Contract']},"
                       + ",".join([fill] * len(extra)) + "\n" for r in map(valid_row, range(start, start + n)))

    live = logs / "a.csv"
    live.write_text(header + csv_rows(0, 500))
    cfg = make_config(logs, "*.csv*")
    run(cfg, store)
    offset = live.stat().st_size
    live.write_text(header + csv_rows(0, 600))  # 100 rows after the last read
    shutil.copyfile(live, logs / "a.csv.1")  # logrotate copytruncate: copy, then truncate in place
    with open(live, "r+") as fh:
        fh.truncate(0)
    # Rewritten larger than the old offset before the next tick (longer rows: the old offset falls mid-row).
    live.write_text(header + csv_rows(10_000, 1200, fill="yyy"))
    assert live.stat().st_size > offset
    reports = run(cfg, store, ticks=2, start=1)
    assert reports[0].read["predictions"] == 100 + 1200 and reports[1].read["predictions"] == 0
    assert not quarantine(store)
    assert stored_rows(store) == 600 + 1200
    assert sum(r.duplicates for r in reports) == 0
    record(record_property, 1800, stored_rows(store))


@pytest.mark.parametrize("n", [50, 1000], ids=["small-files", "many-chunks"])
def test_the_same_requests_in_two_files_of_one_tick_are_duplicates(tmp_path, store, record_property, n):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.jsonl").write_text(rows(0, n))
    (logs / "b.jsonl").write_text(rows(0, n, model_version="v2"))  # same request ids, another file
    [report] = run(make_config(logs, limits={"chunk_bytes": 16 * 1024}), store)
    assert stored_rows(store) == n
    assert report.duplicates == n
    record(record_property, n, stored_rows(store), faults=n)


def test_the_same_request_ids_in_timings_of_two_files_count_as_duplicate_timings(tmp_path, store):
    preds, times = tmp_path / "p", tmp_path / "t"
    preds.mkdir()
    times.mkdir()
    (preds / "a.jsonl").write_text(rows(0, 100))
    timing = "".join(json.dumps({"request_id": f"req-{i:06d}", "stage": "model", "duration_ms": 5.0}) + "\n"
                     for i in range(100))
    (times / "a.jsonl").write_text(timing)
    (times / "b.jsonl").write_text(timing)
    cfg = config_mod.parse({"services": [{"name": "churn", "sources": {
        "predictions": {"kind": "files", "path": str(preds)}, "timings": {"kind": "files", "path": str(times)}},
        "schema": {"features": {"tenure": "numeric"}}, "join": {"lateness": "0s"}}],
        "limits": {"chunk_bytes": 4096}})
    [report] = run(cfg, store)
    assert report.duplicate_timings == 100 and report.joined == 100 and report.unmatched == 0
    assert stored_rows(store) == 100


def test_a_link_beside_its_file_is_read_once(tmp_path, store, record_property):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.jsonl").write_text(rows(0, 100))
    (logs / "alias.jsonl").symlink_to(logs / "a.jsonl")
    os.link(logs / "a.jsonl", logs / "hard.jsonl")
    run(make_config(logs), store, ticks=2)
    assert stored_rows(store) == 100
    record(record_property, 100, stored_rows(store))


def test_a_link_out_of_the_directory_is_not_followed(tmp_path, store, record_property):
    logs = tmp_path / "logs"
    logs.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n" * 3)
    (logs / "a.jsonl").write_text(rows(0, 10))
    (logs / "passwd.jsonl").symlink_to(secret)
    [report] = run(make_config(logs), store)
    # The link counts as one record read, and quarantined: every record read is accepted or quarantined.
    assert stored_rows(store) == 10 and report.read["predictions"] == 11
    assert not any("root:" in (excerpt or "") for _, _, excerpt in quarantine(store))
    assert [r for r, _, _ in quarantine(store)] == ["source_error"]  # said once per tick, without its content
    # Allowed by the config, it is read (and its lines quarantined, as any bad line).
    followed = Store(f"sqlite:///{tmp_path / 'followed.db'}")
    followed.upgrade()
    try:
        [report] = run(make_config(logs, follow_links=True), followed)
        assert report.read["predictions"] == 13
    finally:
        followed.dispose()
    record(record_property, 10, stored_rows(store))


def test_an_unreadable_file_is_reported_and_the_others_are_read(tmp_path, store, record_property, monkeypatch):
    logs = tmp_path / "logs"
    logs.mkdir()
    for k, name in enumerate(("a.jsonl", "b.jsonl", "c.jsonl")):
        (logs / name).write_text(rows(1000 * k, 100))
    locked = logs / "b.jsonl"
    locked.chmod(0)
    if os.geteuid() == 0:  # root reads a file of mode 000: its open is made to fail as it would for anyone else
        def guard(real_open):
            def guarded(path, *args, **kwargs):
                if os.fspath(path) == str(locked) and locked.stat().st_mode & 0o444 == 0:
                    raise PermissionError(13, "Permission denied", str(path))
                return real_open(path, *args, **kwargs)
            return guarded

        # Plain files are opened as bare descriptors (os.open), others as file objects (open).
        for module in (files_mod, chunks_mod):
            monkeypatch.setattr(module, "open", guard(open), raising=False)
        monkeypatch.setattr(os, "open", guard(os.open))
    cfg = make_config(logs)
    [first] = run(cfg, store)
    assert stored_rows(store) == 200
    [(reason, position, excerpt)] = quarantine(store)
    assert reason == "source_error" and position == str(locked) and "Permission denied" in excerpt
    assert first.quarantined["source_error"] == 1
    locked.chmod(0o644)  # fixed: the next tick reads it
    run(cfg, store, start=1)
    assert stored_rows(store) == 300
    record(record_property, 300, stored_rows(store))


def test_many_small_files_commit_their_offsets_together(tmp_path, store, record_property, monkeypatch):
    logs = tmp_path / "logs"
    logs.mkdir()
    n = 300
    for i in range(n):
        (logs / f"f{i:05d}.jsonl").write_text(json.dumps(valid_row(i)) + "\n")
    calls = []
    real = Offsets.save
    monkeypatch.setattr(Offsets, "save", lambda self, session, source, states: calls.append(len(list(states)))
                        or real(self, session, source, states))
    [report] = run(make_config(logs), store)
    assert stored_rows(store) == n and report.read["predictions"] == n
    assert len([c for c in calls if c]) <= 2 and sum(calls) == n  # one commit for the lot, not one per file
    [again] = run(make_config(logs), store, start=1)
    assert again.read["predictions"] == 0
    record(record_property, n, stored_rows(store))


def test_a_timestamp_without_an_offset_needs_the_source_zone(tmp_path, store, record_property):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.jsonl").write_text(rows(0, 5) + json.dumps(valid_row(5) | {"ts": "2026-11-02T10:00:00"}) + "\n")
    [report] = run(make_config(logs), store)
    assert report.quarantined == {"wrong_type": 1} and stored_rows(store) == 5
    zoned = Store(f"sqlite:///{tmp_path / 'zoned.db'}")
    zoned.upgrade()
    try:
        [report] = run(make_config(logs, timezone="Europe/Paris"), zoned)
        assert not report.quarantined and stored_rows(zoned) == 6
        assert report.first_ts == "2026-11-02T09:00:00+00:00"  # 10:00 in Paris (UTC+1 in November)
    finally:
        zoned.dispose()
    with pytest.raises(config_mod.ConfigError, match="time zone"):
        make_config(logs, timezone="Mars/Olympus")
    record(record_property, 6, 5 + 1)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_boolean_features(tmp_path, store, record_property, fmt):
    logs = tmp_path / "logs"
    logs.mkdir()
    features = {"tenure": "numeric", "vip": "categorical", "flagged": "numeric"}
    data = [valid_row(i) | {"vip": i % 2 == 0, "flagged": i % 3 == 0} for i in range(30)]
    if fmt == "jsonl":
        (logs / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    else:
        cols = ["request_id", "ts", "model_version", "status", "tenure", "vip", "flagged"]
        (logs / "a.csv").write_text(",".join(cols) + "\n" + "".join(
            ",".join(str(r[c]).lower() if isinstance(r[c], bool) else str(r[c]) for c in cols) + "\n" for r in data))
    [report] = run(make_config(logs, features=features), store)
    assert not report.quarantined and stored_rows(store) == 30
    record(record_property, 30, stored_rows(store))


def test_raw_log_readers_skip_what_the_tick_quarantines(tmp_path, store, record_property, monkeypatch):
    from monitor.cli import app
    from monitor.daemon.engines.dataset import read_jsonl
    from monitor.investigate.logs import drill

    logs = tmp_path / "logs"
    logs.mkdir()
    good = [valid_row(i) | {"amount": 1.5 * i} for i in range(40)]
    # Two rows whose types differ from their neighbours': parsed apart, together they hold a column of
    # text and numbers, which Arrow cannot hold.
    bad = [valid_row(40) | {"amount": "lots"}, valid_row(41) | {"tenure": "ten", "amount": 2.0}]
    (logs / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*good[:20], *bad, *good[20:]])
                                  + "{not json\n")
    features = {"tenure": "numeric", "amount": "numeric"}
    cfg = make_config(logs, features=features)
    [report] = run(cfg, store)
    assert report.quarantined == {"wrong_type": 2, "unparseable": 1}
    service = cfg.services[0]
    for with_features in (False, True):  # True: as `report` reads them
        result = drill(service, cfg.limits, since=NOW - timedelta(days=1), until=NOW, top=100,
                       features=with_features, now=NOW)
        assert result.scanned == 40 and result.skipped == {"wrong_type": 2, "unparseable": 1}
    frame = read_jsonl(logs, schema=service.schema_, now=NOW)
    assert len(frame) == 40 and frame.attrs["quarantined"] == {"wrong_type": 2, "unparseable": 1}
    (tmp_path / "tailwatch.yaml").write_text(json.dumps({
        "storage": {"url": f"sqlite:///{tmp_path / 'tw.db'}"},
        "services": [{"name": "churn", "sources": {"predictions": {"kind": "files", "path": str(logs)}},
                      "schema": {"features": features}}]}))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["query", "logs", "--since", "2026-11-01T00:00:00Z", "--until", "2026-11-03T00:00:00Z",
                                   "--format", "json"], catch_exceptions=False, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    body = json.loads(res.stdout)
    assert body["scanned"] == 40 and body["skipped"] == {"wrong_type": 2, "unparseable": 1}
    record(record_property, 43, 40 + 3)


def test_json_output_of_every_column_type(tmp_path, store, monkeypatch):
    from monitor.cli import app

    preds, times = tmp_path / "p", tmp_path / "t"
    preds.mkdir()
    times.mkdir()
    (preds / "a.jsonl").write_text(rows(0, 20))  # no timings yet: the predictions wait in join_pending
    (tmp_path / "tailwatch.yaml").write_text(json.dumps({
        "storage": {"url": f"sqlite:///{tmp_path / 'tw.db'}"},
        "services": [{"name": "churn", "sources": {"predictions": {"kind": "files", "path": str(preds)},
                                                   "timings": {"kind": "files", "path": str(times)}},
                      "schema": {"features": {"tenure": "numeric"}}, "join": {"lateness": "1h"}}]}))
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(app, ["tick"], catch_exceptions=False).exit_code in (0, 1)
    res = runner.invoke(app, ["query", "sql", "SELECT * FROM join_pending", "-f", "json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    [row] = [r for r in json.loads(res.stdout) if r["kind"] == "predictions"]
    assert isinstance(row["payload"], str) and row["payload"]  # the Parquet blob, as base64 text

    from decimal import Decimal

    import pandas as pd

    from monitor.investigate.output import dumps, json_records
    frame = pd.DataFrame({"b": [b"\x00\xff"], "d": [Decimal("1.25")], "naive": [datetime(2026, 1, 1, 12)],
                          "day": [datetime(2026, 1, 1).date()], "span": [pd.Timedelta("90s")],
                          "arr": [[1, 2]], "na": [float("nan")]})
    assert json.loads(dumps(json_records(frame))) == [{"b": "AP8=", "d": 1.25, "naive": "2026-01-01T12:00:00Z",
                                                       "day": "2026-01-01", "span": 90.0, "arr": [1, 2], "na": None}]
