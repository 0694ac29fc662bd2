"""The rules every `tailwatch` command follows, walked over the whole command tree: help shows metavars a
person reads (no Python types), no short flag means two things, `--format` is the one shared option
(table|csv|json, `-f`), and JSON output writes times as RFC 3339 UTC with `Z`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
from tests_support import valid_lines
from typer.testing import CliRunner

from monitor.cli import app

PYTHON_TYPES = re.compile(r"<(bool|str|int|float|list\[[^>]*\]|path|datetime)>", re.IGNORECASE)
TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")
RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")


def _walk(command, path=()):
    """(words after `tailwatch`, command) for every command and group under `command`."""
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _walk(sub, (*path, name))


COMMANDS = list(_walk(typer.main.get_command(app)))


def _invoke(*args: str, cwd: Path | None = None, monkeypatch=None):
    if cwd is not None:
        monkeypatch.chdir(cwd)
    return CliRunner().invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "200"})


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "tailwatch")
def test_help_shows_real_metavars(path):
    result = _invoke(*path, "--help")
    assert result.exit_code == 0, result.output
    options = [line for line in result.stdout.splitlines() if re.search(r"│\s+(\*\s+)?--", line)]
    assert options and not [line for line in options if PYTHON_TYPES.search(line)], result.stdout
    assert "<bool>" not in result.stdout and "<list[" not in result.stdout


def test_no_short_flag_has_two_meanings():
    meanings: dict[str, set[str]] = {}
    for _, command in COMMANDS:
        for param in command.params:
            longs = [o for o in param.opts if o.startswith("--")]
            for short in (o for o in [*param.opts, *param.secondary_opts] if re.fullmatch(r"-\w", o)):
                meanings.setdefault(short, set()).update(longs)
    assert {short: longs for short, longs in meanings.items() if len(longs) > 1} == {}


def test_every_format_option_is_the_shared_one():
    seen = 0
    for path, command in COMMANDS:
        for param in command.params:
            if "--format" in param.opts:
                seen += 1
                assert "-f" in param.opts, path
                assert tuple(param.type_descriptor.choices) == ("table", "csv", "json"), path
    assert seen >= 18


def test_version():
    result = _invoke("--version")
    assert result.exit_code == 0 and re.fullmatch(r"tailwatch \d+\.\d+\.\d+\S*\n", result.stdout)


def test_unknown_format_lists_the_valid_ones():
    result = _invoke("alerts", "--format", "xml")
    assert result.exit_code == 2
    assert all(name in result.output for name in ("table", "csv", "json"))


def _times(value, where="$"):
    """(where, text) for every string in `value` that reads as a timestamp."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _times(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _times(v, f"{where}[{i}]")
    elif isinstance(value, str) and TIMESTAMP.match(value):
        yield where, value


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A config from `init`, its schema, and one tick of rows."""
    assert _invoke("init", cwd=tmp_path, monkeypatch=monkeypatch).exit_code == 0
    for name in ("predictions", "timings", "labels"):
        (tmp_path / "logs" / name).mkdir(parents=True)
    assert _invoke("db", "upgrade", cwd=tmp_path, monkeypatch=monkeypatch).exit_code == 0
    (tmp_path / "logs" / "predictions" / "a.jsonl").write_text(valid_lines(20))
    return tmp_path


JSON_COMMANDS = [
    ["tick", "--now", "2026-11-02T12:00:00Z"],
    ["alerts", "--all", "--now", "2026-11-02T12:00:00Z"],
    ["nightly", "--now", "2026-11-02T12:00:00Z"],
    ["check-logs", "--now", "2026-11-02T12:00:00Z"],
    ["silence", "list", "--all", "--now", "2026-11-02T12:00:00Z"],
    ["notify", "drain", "--now", "2026-11-02T12:00:00Z"],
    ["db", "current"],
    ["query", "ticks", "--since", "2026-11-01T00:00:00Z", "--until", "2026-11-03T00:00:00Z"],
    ["query", "findings", "--since", "2026-11-01T00:00:00Z", "--until", "2026-11-03T00:00:00Z"],
    ["query", "quarantine", "--since", "2026-11-01T00:00:00Z", "--until", "2026-11-03T00:00:00Z"],
    ["query", "incidents", "--since", "2026-11-01T00:00:00Z", "--until", "2026-11-03T00:00:00Z"],
]


def test_json_output_writes_times_as_rfc3339_utc(workdir, monkeypatch):
    assert _invoke("tick", "--now", "2026-11-02T12:00:00Z", cwd=workdir, monkeypatch=monkeypatch).exit_code == 0
    assert _invoke("silence", "create", "-m", "service=churn", "--now", "2026-11-02T12:00:00Z", cwd=workdir,
                   monkeypatch=monkeypatch).exit_code == 0
    found = 0
    for args in JSON_COMMANDS:
        result = _invoke(*args, "-f", "json", cwd=workdir, monkeypatch=monkeypatch)
        assert result.exit_code in (0, 1), (args, result.output)
        bad = [(where, text) for where, text in _times(json.loads(result.stdout)) if not RFC3339_UTC.match(text)]
        found += sum(1 for _ in _times(json.loads(result.stdout)))
        assert bad == [], args
        csv = _invoke(*args, "-f", "csv", cwd=workdir, monkeypatch=monkeypatch)
        assert csv.exit_code in (0, 1), (args, csv.output)
    assert found > 0


@pytest.mark.parametrize(("args", "valid"), [
    (["query", "findings", "--status", "breached"], ["ok", "breach", "insufficient"]),
    (["query", "findings", "--check", "latncy"], ["latency"]),
    (["query", "findings", "--window", "10m"], ["15m", "1h"]),
    (["query", "findings", "--service", "frod"], ["churn"]),
    (["query", "ticks", "--status", "failed"], ["ok", "error", "running"]),
    (["query", "incidents", "--status", "closed"], ["open", "resolved"]),
])
def test_unknown_filter_values_list_the_valid_ones(workdir, monkeypatch, args, valid):
    result = _invoke(*args, cwd=workdir, monkeypatch=monkeypatch)
    assert result.exit_code == 2, result.output
    assert all(name in result.output for name in valid), result.output


@pytest.mark.parametrize("command", [["backfill"], ["scan", "data.parquet"], ["query", "ticks"]])
def test_since_and_until_share_one_parser(workdir, monkeypatch, command):
    """Every command that reads time says the same thing about a value that is neither RFC 3339 nor a
    duration, and takes both forms."""
    result = _invoke(*command, "--since", "yesterday-ish", "--until", "1h", cwd=workdir, monkeypatch=monkeypatch)
    assert result.exit_code == 2, result.output
    assert "--since: not a time or a duration: 'yesterday-ish' (e.g. 2026-11-02T12:00:00Z or 6h)" in result.output
    reversed_ = _invoke(*command, "--since", "1h", "--until", "2h", cwd=workdir, monkeypatch=monkeypatch)
    assert reversed_.exit_code == 2 and "is not before --until" in reversed_.output
