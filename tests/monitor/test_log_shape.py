"""Logs in the user's shape: a fraud model's hand-written logs (`id`, `timestamp` in RFC 3339 and epoch ms,
`model`, latency in seconds, a custom stage, four bad lines) are wholly quarantined without a `columns:`
mapping and accepted with it; `check-logs` says which column each field is read from; quarantine rows name
the field and keep the line as written, shown escaped."""

from __future__ import annotations

import copy
import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from monitor import config as config_mod
from monitor.cli import app
from monitor.contract import RecordKind
from monitor.daemon.runner import tick
from monitor.ingest.accept import check_batch
from monitor.ingest.quarantine import printable
from monitor.ingest.sources import open_source
from monitor.investigate import query
from monitor.investigate.output import table
from storage.models import QuarantineRow
from storage.store import Store

NOW = datetime(2026, 12, 4, 13, 0, tzinfo=UTC)
GOOD = 40
START = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
START_MS = str(int(START.timestamp() * 1000))
# Four bad lines, as a person would write them by hand: (line, reason, field).
BAD = [
    (b'{"id": "tx-b1", "timestamp": ', "unparseable", None),
    (b'{"id": "tx-b2", "timestamp": "2026-12-04T12:00:00Z", "status": "ok", "amount": 3.5, "latency": 0.02}',
     "missing_field", "model_version"),
    (b'{"id": "tx-b3", "timestamp": "yesterday", "model": "fraud-v7", "status": "ok", "amount": 1, "latency": 0.02}',
     "wrong_type", "ts"),
    (b'{"id": "tx-b4", "status": "[bold red]boom[/]", "timestamp": "2026-12-04T12:00:00Z", "model": "fraud-v7",'
     b' "amount": 2, "latency": 0.02}', "unknown_status", "status"),
]
MAPPING = {
    "predictions": {"columns": {"request_id": "id", "ts": "timestamp", "model_version": "model",
                                "latency_ms": "latency"},
                    "timestamps": {"epoch_unit": "ms"}, "durations": "s"},
    "timings": {"columns": {"request_id": "id", "duration_ms": "took_ms"}},
}


def write_logs(root: Path) -> list[bytes]:
    """The fraud model's predictions and stage timings; returns the prediction lines as written."""
    (root / "preds").mkdir()
    (root / "stages").mkdir()
    lines, stages = [], []
    for i in range(GOOD):
        at = START + timedelta(seconds=30 * i)
        stamp = at.isoformat().replace("+00:00", "Z") if i % 2 else int(at.timestamp() * 1000)
        lines.append(json.dumps({"id": f"tx-{i}", "timestamp": stamp, "model": "fraud-v7", "status": "ok",
                                 "amount": 10.0 + i, "merchant": ["grocery", "travel"][i % 2],
                                 "latency": 0.040 + i / 1000}).encode())
        for stage, ms in (("feature_lookup", 12.5), ("model", 20.0)):
            stages.append(json.dumps({"id": f"tx-{i}", "stage": stage, "took_ms": ms}).encode())
        if i % 10 == 5:
            lines.append(BAD[i // 10][0])
    (root / "preds" / "app.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (root / "stages" / "stages.jsonl").write_bytes(b"\n".join(stages) + b"\n")
    return lines


def raw_config(root: Path, mapped: bool) -> dict:
    sources = {"predictions": {"kind": "files", "path": str(root / "preds")},
               "timings": {"kind": "files", "path": str(root / "stages")}}
    if mapped:
        for name, shape in copy.deepcopy(MAPPING).items():
            sources[name] |= shape
    return {"storage": {"url": f"sqlite:///{root / 'tw.db'}"},
            "services": [{"name": "fraud", "sources": sources,
                          "schema": {"features": {"amount": "numeric", "merchant": "categorical"}},
                          "join": {"lateness": "0s"}}]}


def test_unmapped_logs_are_all_quarantined_with_a_warning_naming_the_fields(store, tmp_path):
    write_logs(tmp_path)
    [report] = tick(config_mod.parse(raw_config(tmp_path, mapped=False)), store, NOW)
    assert report.status == "ok", report.error
    assert report.accepted["predictions"] == 0
    assert sum(report.quarantined.values()) == sum(report.read.values()) > GOOD
    [warning] = report.warnings
    assert all(name in warning for name in ("missing_field", "request_id", "ts", "model_version")), warning
    assert "check-logs" in warning
    with store.transaction() as s:
        missing = s.query(QuarantineRow).filter(QuarantineRow.reason == "missing_field",
                                                QuarantineRow.kind == "predictions").first()
    assert missing.field == "request_id, ts, model_version"


def test_mapped_logs_are_accepted_and_bad_lines_kept_as_written(store, tmp_path):
    lines = write_logs(tmp_path)
    [report] = tick(config_mod.parse(raw_config(tmp_path, mapped=True)), store, NOW)
    assert report.status == "ok", report.error
    assert report.accepted["predictions"] == GOOD
    assert report.accepted["timings"] == 2 * GOOD
    assert report.joined == GOOD and report.warnings == []
    assert report.first_ts == START.isoformat()  # epoch ms read as ms, not as seconds
    with store.transaction() as s:
        rows = s.query(QuarantineRow).filter(QuarantineRow.kind == "predictions").order_by(QuarantineRow.id).all()
    assert [(r.reason, r.field) for r in rows] == [(reason, field) for _, reason, field in BAD]
    for row, (line, _, _) in zip(rows, BAD, strict=True):
        assert row.raw == line  # byte for byte: "2026-12-04T12:00:00Z" stays as written
        assert lines[int(row.position.rsplit(":", 1)[1]) - 1] == line
        assert row.excerpt == line.decode()[:200]


def test_times_in_epoch_ms_and_latency_in_seconds_are_read_in_the_contract_units(tmp_path):
    write_logs(tmp_path)
    cfg = config_mod.parse(raw_config(tmp_path, mapped=True))
    svc = cfg.services[0]
    [batch] = open_source("fraud/predictions", svc.sources.predictions, cfg.limits).read({})
    accepted, _ = check_batch(batch, RecordKind.predictions, svc.schema_, cfg.limits, NOW, svc.sources.predictions)
    assert accepted["request_id"].tolist()[:2] == ["tx-0", "tx-1"]
    assert accepted["ts"].tolist()[:2] == [pd.Timestamp(START), pd.Timestamp(START + timedelta(seconds=30))]
    assert accepted["latency_ms"].tolist()[:2] == pytest.approx([40.0, 41.0])


@pytest.fixture
def cli(monkeypatch, tmp_path):
    def invoke(*args: str):
        monkeypatch.chdir(tmp_path)
        return CliRunner().invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "200"})

    return invoke


def test_check_logs_without_a_mapping_says_nothing_would_be_accepted(cli, tmp_path):
    write_logs(tmp_path)
    (tmp_path / "tailwatch.yaml").write_text(yaml.safe_dump(raw_config(tmp_path, mapped=False)))
    result = cli("check-logs", "--now", NOW.isoformat(), "--format", "json")
    assert result.exit_code == 1, result.output
    preds, timings = json.loads(result.output)
    assert (preds["source"], preds["accepted"], preds["read"]) == ("predictions", 0, GOOD + len(BAD))
    fields = {f["field"]: f for f in preds["fields"]}
    assert fields["request_id"] == {"field": "request_id", "column": "request_id", "required": True,
                                    "found": False, "example": None, "read_as": None, "missing": 1.0,
                                    "unreadable": 0.0}
    assert {"id", "timestamp", "model", "latency"} <= set(preds["unused_columns"])
    [warning] = preds["warnings"]
    assert warning.startswith("required fields not found: request_id, ts, model_version; every row would be "
                              "quarantined"), warning
    assert "sources.predictions.columns" in warning
    assert timings["warnings"][0].startswith("required fields not found: request_id, duration_ms;")
    reasons = {r["reason"]: r for r in preds["reasons"]}
    assert reasons["missing_field"]["field"] == "request_id, ts, model_version"
    assert reasons["missing_field"]["line"].startswith('{"id": "tx-0", "timestamp": ' + START_MS)
    assert reasons["unparseable"]["line"] == BAD[0][0].decode()
    assert timings["accepted"] == 0
    # Nothing was written: no database next to the config.
    assert not (tmp_path / "tw.db").exists()


def test_check_logs_with_the_mapping(cli, tmp_path):
    write_logs(tmp_path)
    (tmp_path / "tailwatch.yaml").write_text(yaml.safe_dump(raw_config(tmp_path, mapped=True)))
    result = cli("check-logs", "--now", NOW.isoformat(), "--format", "json")
    assert result.exit_code == 0, result.output
    preds, timings = json.loads(result.output)
    assert (preds["accepted"], preds["quarantined"]) == (GOOD, len(BAD))
    fields = {f["field"]: f for f in preds["fields"]}
    assert fields["ts"]["column"] == "timestamp" and fields["ts"]["found"]
    assert fields["ts"]["example"] == START_MS
    assert fields["ts"]["read_as"] == "2026-12-04T12:00:00Z"  # the example's own row, in milliseconds
    assert (fields["latency_ms"]["example"], fields["latency_ms"]["read_as"]) == ("0.04", "40 ms")
    assert preds["warnings"] == [] and timings["warnings"] == []
    assert fields["ts"]["unreadable"] == pytest.approx(1 / (GOOD + len(BAD) - 1), abs=1e-4)
    assert fields["model_version"]["missing"] == pytest.approx(1 / (GOOD + len(BAD) - 1), abs=1e-4)
    assert {r["reason"]: r["field"] for r in preds["reasons"]} == {reason: field for _, reason, field in BAD}
    assert {f["field"]: f["column"] for f in timings["fields"]}["duration_ms"] == "took_ms"
    assert timings["accepted"] == 2 * GOOD

    table = cli("check-logs", "--now", NOW.isoformat())
    assert table.exit_code == 0, table.output
    assert "40 accepted, 4 quarantined" in table.output
    # The heading on one line however long the path, at 80 columns too (grepped, copied).
    narrow = CliRunner().invoke(app, ["check-logs", "--now", NOW.isoformat()], env={"COLUMNS": "80"})
    assert f"fraud predictions ({tmp_path / 'preds'}): 44 rows read, 40 accepted, 4 quarantined" \
        in narrow.output.splitlines()
    assert "timestamp" in table.output and "unknown_status" in table.output
    # Markup in a log line is printed as written, never interpreted.
    assert '"status": "[bold red]boom[/]"' in table.output


def test_check_logs_names_the_column_a_schema_feature_is_written_as(cli, tmp_path):
    write_logs(tmp_path)
    raw = raw_config(tmp_path, mapped=True)
    raw["services"][0]["schema"]["features"] = {"amount": "numeric", "merchant_type": "categorical"}
    (tmp_path / "tailwatch.yaml").write_text(yaml.safe_dump(raw))
    preds, _ = json.loads(cli("check-logs", "--now", NOW.isoformat(), "--format", "json").output)
    assert preds["warnings"] == ["schema feature merchant_type: no such column in the logs; they have merchant: "
                                 "declare it under schema by that name"]
    assert "merchant" in preds["unused_columns"]


def test_check_logs_names_the_unit_a_time_or_a_latency_is_written_in(cli, tmp_path):
    write_logs(tmp_path)
    raw = raw_config(tmp_path, mapped=True)
    shape = raw["services"][0]["sources"]["predictions"]
    shape["timestamps"] = {"epoch_unit": "s"}  # the even lines' epoch milliseconds read as seconds
    (tmp_path / "tailwatch.yaml").write_text(yaml.safe_dump(raw))
    preds, _ = json.loads(cli("check-logs", "--now", NOW.isoformat(), "--format", "json").output)
    assert preds["warnings"] == [f"ts: {START_MS} is a time in epoch milliseconds, read as epoch seconds: "
                                 "set `timestamps: {epoch_unit: ms}`"]
    shape["timestamps"], shape["durations"] = {"epoch_unit": "ms"}, "ms"  # latency in seconds read as ms
    (tmp_path / "tailwatch.yaml").write_text(yaml.safe_dump(raw))
    preds, timings = json.loads(cli("check-logs", "--now", NOW.isoformat(), "--format", "json").output)
    assert preds["warnings"] == ["latency_ms: 0.04 reads as 0.04 ms; if it is written in seconds, set `durations: s`"]
    assert timings["warnings"] == []  # a stage may take under a millisecond; these take 12.5 and 20


def test_quarantine_shows_the_field_and_the_line_as_written(cli, tmp_path):
    write_logs(tmp_path)
    (tmp_path / "tailwatch.yaml").write_text(yaml.safe_dump(raw_config(tmp_path, mapped=True)))
    assert cli("db", "upgrade").exit_code == 0
    ticked = cli("tick", "--now", NOW.isoformat())
    assert ticked.exit_code == 0, ticked.output
    listed = cli("query", "quarantine", "--since", "2026-12-01T00:00:00Z", "--format", "json")
    rows = json.loads(listed.output)
    assert [(r["reason"], r["field"]) for r in rows] == [(reason, field) for _, reason, field in BAD]
    assert [r["line"] for r in rows] == [line.decode() for line, _, _ in BAD]
    shown = cli("query", "quarantine", "--since", "2026-12-01T00:00:00Z", "--reason", "unknown_status")
    assert shown.exit_code == 0 and "unknown_status" in shown.output
    # The rich markup inside the logged status is printed as written, not rendered (a wide terminal: no fold;
    # a table cell shows the line's first 60 characters).
    frame = query.quarantine(Store(f"sqlite:///{tmp_path / 'tw.db'}"), "fraud", reason="unknown_status")
    console = Console(width=2000, record=True, file=io.StringIO())
    console.print(table(frame))
    assert '"status": "[bold red]boom[/]"' in console.export_text()
    assert "boom[/]" in shown.output
    grouped = cli("query", "quarantine", "--since", "2026-12-01T00:00:00Z", "--group-by", "reason,field",
                  "--format", "json")
    assert {(g["reason"], g["field"]) for g in json.loads(grouped.output)} == {(r, f) for _, r, f in BAD}


def test_printable_escapes_control_bytes_and_keeps_text():
    line = b'{"msg": "\x1b[31mred\x1b[0m", "x": "caf\xc3\xa9", "bad": "\xff"}'
    assert printable(line) == '{"msg": "\\x1b[31mred\\x1b[0m", "x": "café", "bad": "\\xff"}'


def test_an_unknown_contract_field_in_columns_is_an_error_listing_the_valid_ones(tmp_path):
    raw = raw_config(tmp_path, mapped=True)
    (tmp_path / "preds").mkdir()
    (tmp_path / "stages").mkdir()
    raw["services"][0]["sources"]["predictions"]["columns"]["timestamp"] = "time"
    with pytest.raises(config_mod.ConfigError) as exc:
        config_mod.parse(raw)
    message = str(exc.value)
    assert "services[0].sources: predictions.columns: 'timestamp' is not a contract field of predictions" in message
    assert "(valid: request_id, ts, model_version, status, latency_ms" in message
    assert "the contract field comes first" not in message


def test_a_mapping_written_the_wrong_way_round_says_which_way(tmp_path):
    raw = raw_config(tmp_path, mapped=True)
    (tmp_path / "preds").mkdir()
    (tmp_path / "stages").mkdir()
    raw["services"][0]["sources"]["predictions"]["columns"] = {"id": "request_id", "ts": "timestamp"}
    with pytest.raises(config_mod.ConfigError) as exc:
        config_mod.parse(raw)
    assert str(exc.value).endswith("; the contract field comes first: request_id: id")


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
@pytest.mark.parametrize("size", ["small", "large"])  # small files are read together; a large one by chunks
def test_the_line_kept_is_the_line_written_in_every_reader(store, tmp_path, fmt, size):
    (tmp_path / "preds").mkdir()
    pad = "p" * (3000 if size == "large" else 1)  # 40 x 3 KB lines: past the 64 KiB read whole
    lines = [b"id,timestamp,model,status,pad"] if fmt == "csv" else []
    for i in range(GOOD):
        stamp = f"{(START + timedelta(seconds=i)).strftime('%d/%m/%Y %H:%M:%S')}"
        if fmt == "csv":
            lines.append(f"tx-{i},{stamp},fraud-v7,{'ok' if i != 7 else 'fine'},{pad}".encode())
        else:
            lines.append(json.dumps({"id": f"tx-{i}", "timestamp": stamp, "model": "fraud-v7",
                                     "status": "ok" if i != 7 else "fine", "pad": pad}).encode())
    (tmp_path / "preds" / f"app.{fmt}").write_bytes(b"\r\n".join(lines) + b"\r\n")
    raw = {"services": [{"name": "fraud", "sources": {"predictions": {
        "kind": "files", "path": str(tmp_path / "preds"),
        "columns": {"request_id": "id", "ts": "timestamp", "model_version": "model"},
        "timestamps": {"format": "%d/%m/%Y %H:%M:%S"}}}}]}
    [report] = tick(config_mod.parse(raw), store, NOW)
    assert report.status == "ok", report.error
    assert report.accepted["predictions"] == GOOD - 1
    assert report.first_ts == START.isoformat()
    with store.transaction() as s:
        [row] = s.query(QuarantineRow).all()
    bad = lines[8 if fmt == "csv" else 7]
    assert (row.reason, row.field, row.position) == ("unknown_status", "status", f"app.{fmt}:{8 if fmt == 'jsonl' else 9}")
    assert row.raw == bad[:2048]  # without its CRLF, cut at 2 KiB


def test_tick_prints_and_records_the_quarantine_warning(cli, tmp_path):
    write_logs(tmp_path)
    (tmp_path / "tailwatch.yaml").write_text(yaml.safe_dump(raw_config(tmp_path, mapped=False)))
    assert cli("db", "upgrade").exit_code == 0
    shown = cli("tick", "--now", NOW.isoformat())
    assert shown.exit_code == 0, shown.output
    assert "warning: quarantined 124 of 124 rows (100%" in shown.output
    assert "predictions: request_id, ts, model_version" in shown.output.replace("\n", " ")
    ticks = json.loads(cli("query", "ticks", "--since", "2026-12-01T00:00:00Z", "--format", "json").output)
    [warning] = ticks[-1]["warnings"]
    assert warning.startswith("quarantined 124 of 124 rows")


def test_the_daemon_logs_the_warning_with_the_tick(store, tmp_path, caplog):
    from monitor.daemon import jobs

    write_logs(tmp_path)
    cfg = config_mod.parse(raw_config(tmp_path, mapped=False))
    with caplog.at_level("INFO", logger="monitor.daemon.jobs"):
        jobs.tick_job(cfg, store, NOW)
    said = [r for r in caplog.records if r.levelname == "WARNING" and r.getMessage().startswith("quarantined")]
    assert len(said) == 1 and "model_version" in said[0].getMessage()
    assert said[0].quarantined_by_field["missing_field:predictions:request_id"] == GOOD + 3
    done = next(r for r in caplog.records if r.getMessage() == "tick done")
    assert done.warnings == [said[0].getMessage()]


def test_backfill_replays_mapped_logs_by_their_own_times(store, tmp_path):
    from tests_support import stored_rows

    from monitor.daemon import backfill

    write_logs(tmp_path)
    cfg = config_mod.parse(raw_config(tmp_path, mapped=True))
    # Lines appear at their event times (epoch ms and RFC 3339 alike, read from `timestamp`): a replay up to
    # 12:10 sees the 21 written from 12:00 to 12:10, not all 40.
    backfill.run(cfg, store, START, START + timedelta(minutes=10), step=timedelta(minutes=5),
                 staging=tmp_path / "staging")
    assert stored_rows(store, "fraud") == 21
