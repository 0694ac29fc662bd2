"""Quiet operations: probes log nothing per request, text logs carry the JSON logs' fields, and the schema
commands need only the database."""

from __future__ import annotations

import io
import json
import logging
import re
import urllib.request

import yaml
from opsfeed import config_dict
from typer.testing import CliRunner

from monitor.cli import app
from monitor.daemon import logs
from monitor.daemon.health import Health, Metrics, serve
from storage.store import Store

PROBES = 5


def test_readiness_probes_log_nothing_from_alembic(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'tw.db'}")
    store.upgrade()
    stream = io.StringIO()
    logs.setup("text", "INFO", stream=stream)
    server = serve(Health(store, max_age_s=60, metrics=Metrics()), "127.0.0.1", 0)
    try:
        start = len(stream.getvalue())  # after the server's own "listening" line
        for _ in range(PROBES):
            with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/readyz", timeout=30) as r:
                assert r.status == 200
        probed = stream.getvalue()[start:]
    finally:
        server.shutdown()
        store.dispose()
        logs.setup("text", "WARNING", stream=io.StringIO())
    assert "alembic" not in probed and probed == ""


PAIR = re.compile(r' (\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def _text_fields(line: str) -> dict[str, str]:
    return {key: json.loads(value) if value.startswith('"') else value for key, value in PAIR.findall(line)}


def _as_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def test_text_logs_carry_the_same_fields_as_json():
    extra = {"stage": "ingest", "service": "fraud scorer", "rows_read": 1200, "seconds": 0.25,
             "errors": ["a=b", 'say "hi"'], "ok": True}
    lines = {}
    for fmt in ("json", "text"):
        stream = io.StringIO()
        logs.setup(fmt, "INFO", stream=stream)
        try:
            logging.getLogger("tailwatch.test").info("stage done", extra=extra)
        finally:
            logs.setup("text", "WARNING", stream=io.StringIO())
        (lines[fmt],) = stream.getvalue().splitlines()
    event = json.loads(lines["json"])
    json_fields = {k: _as_text(v) for k, v in event.items() if k not in ("time", "level", "logger", "message")}
    assert lines["text"].split(": ", 1)[1].startswith("stage done ")
    assert _text_fields(lines["text"]) == json_fields == {k: _as_text(v) for k, v in extra.items()}


def test_db_upgrade_needs_only_the_database(tmp_path, monkeypatch):
    raw = config_dict(tmp_path / "state" / "tw.db")
    raw["storage"]["url"] = "sqlite:///state/tw.db"  # relative to the config file, like the default
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "state").mkdir()
    config = tmp_path / "conf" / "tailwatch.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert not (tmp_path / "conf" / "logs").exists()
    monkeypatch.chdir(tmp_path)  # an empty directory: nothing but the config
    runner = CliRunner()
    result = runner.invoke(app, ["-c", str(config), "db", "upgrade"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    store = Store(f"sqlite:///{tmp_path / 'conf' / 'state' / 'tw.db'}")
    try:
        assert store.current_revision() == store.head_revision()
    finally:
        store.dispose()
    result = runner.invoke(app, ["-c", str(config), "db", "current", "-f", "json"], catch_exceptions=False)
    assert result.exit_code == 0 and json.loads(result.stdout)["database"] == json.loads(result.stdout)["head"]
    # What needs the services still says which directory is missing.
    result = runner.invoke(app, ["-c", str(config), "tick"], catch_exceptions=False)
    assert result.exit_code == 2 and "directory does not exist" in result.output


def test_a_bad_storage_section_is_named_by_the_schema_commands(tmp_path):
    config = tmp_path / "tailwatch.yaml"
    config.write_text(yaml.safe_dump({"storage": {"url": "sqlite:///tw.db", "nonsense": 1}, "services": []}))
    result = CliRunner().invoke(app, ["-c", str(config), "db", "upgrade"], catch_exceptions=False)
    assert result.exit_code == 2 and "storage.nonsense" in result.output
