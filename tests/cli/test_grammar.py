"""The rules every `tailwatch` command follows, walked over the whole command tree: help shows metavars a
person reads (no Python types, positionals included), no short flag means two things, every command takes
the one shared `--format` (table|csv|json, `-f`), and its JSON output parses and writes times as RFC 3339
UTC with `Z`."""

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
# The commands themselves: what a group holds is walked, the group only lists them.
LEAVES = {" ".join(path): command for path, command in COMMANDS if not hasattr(command, "commands")}


def _invoke(*args: str, cwd: Path | None = None, monkeypatch=None):
    if cwd is not None:
        monkeypatch.chdir(cwd)
    return CliRunner().invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "200"})


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "tailwatch")
def test_help_shows_real_metavars(path):
    result = _invoke(*path, "--help")
    assert result.exit_code == 0, result.output
    options = [line for line in result.stdout.splitlines() if re.search(r"│\s+(\*\s+)?--", line)]
    assert options and not PYTHON_TYPES.search(result.stdout), result.stdout
    assert "<bool>" not in result.stdout and "<list[" not in result.stdout


@pytest.mark.parametrize(("path", "metavar"), [("init", "PATH"), ("scan", "DATASET"), ("explain", "INCIDENT"),
                                               ("query sql", "STATEMENT"), ("silence expire", "SILENCE_ID")])
def test_positionals_show_their_metavar_alone(path, metavar):
    result = _invoke(*path.split(), "--help")
    rows = [line for line in result.stdout.splitlines() if re.search(rf"│\s+(\*\s+)?{metavar}\s", line)]
    assert rows and not re.search(r"<\w+>|\bTEXT\b|\bINTEGER\b", rows[0]), result.stdout


def test_no_short_flag_has_two_meanings():
    meanings: dict[str, set[str]] = {}
    for _, command in COMMANDS:
        for param in command.params:
            longs = [o for o in param.opts if o.startswith("--")]
            for short in (o for o in [*param.opts, *param.secondary_opts] if re.fullmatch(r"-\w", o)):
                meanings.setdefault(short, set()).update(longs)
    assert {short: longs for short, longs in meanings.items() if len(longs) > 1} == {}


def test_every_command_takes_the_shared_format():
    """No exemption: what a command prints besides records (a report's HTML, the demo's tables, the daemon's
    logs) goes to a file, the table form or the log; its `--format` prints its summary record."""
    missing = []
    for path, command in LEAVES.items():
        option = next((p for p in command.params if "--format" in p.opts), None)
        if option is None:
            missing.append(path)
            continue
        assert "-f" in option.opts, path
        assert tuple(option.type_descriptor.choices) == ("table", "csv", "json"), path
    assert missing == [] and len(LEAVES) >= 28


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
    _uncomment_quality(tmp_path / "tailwatch.yaml")
    for name in ("predictions", "timings", "labels"):
        (tmp_path / "logs" / name).mkdir(parents=True)
    assert _invoke("db", "upgrade", cwd=tmp_path, monkeypatch=monkeypatch).exit_code == 0
    (tmp_path / "logs" / "predictions" / "a.jsonl").write_text(valid_lines(20))
    return tmp_path


def _uncomment_quality(path: Path) -> None:
    """Turn on the template's labels source and quality section, as its comment tells a user to."""
    lines = []
    in_quality = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("# labels: {kind"):
            line = line.replace("# labels:", "labels:", 1)
        elif line.strip() == "# quality:":
            in_quality, line = True, line.replace("# quality:", "quality:", 1)
        elif in_quality and line.lstrip().startswith("#   "):
            line = line.replace("#   ", "  ", 1)
        else:
            in_quality = False
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")
    assert "\n    quality:\n" in path.read_text()


NOW = ("--now", "2026-11-02T12:00:00Z")
DAYS = ("--since", "2026-11-01T00:00:00Z", "--until", "2026-11-03T00:00:00Z")
# Every command, as it runs on the fixture (in this order: the silence is created before it is expired).
RUNS = {
    "init": ["init", "other.yaml"],
    "db upgrade": ["db", "upgrade"],
    "db current": ["db", "current"],
    "tick": ["tick", *NOW],
    "check-logs": ["check-logs", *NOW],
    "nightly": ["nightly", *NOW],
    "run": ["run", "--once", "--now", "2026-11-02T12:15:00Z"],
    "backfill": ["backfill", "--since", "2026-11-02T09:00:00Z", "--until", "2026-11-02T10:00:00Z",
                 "--step", "1h", "--staging", "staging"],
    "alerts": ["alerts", "--all", *NOW],
    "silence create": ["silence", "create", "-s", "churn", *NOW],
    "silence list": ["silence", "list", "--all", *NOW],
    "silence expire": ["silence", "expire", "1", "--now", "2026-11-02T12:30:00Z"],
    "notify drain": ["notify", "drain", *NOW],
    "accept": ["accept", "v1", *NOW],
    "query ticks": ["query", "ticks", *DAYS],
    "query findings": ["query", "findings", *DAYS],
    "query metrics": ["query", "metrics", *DAYS, "--every", "1h"],
    "query quarantine": ["query", "quarantine", *DAYS],
    "query verdicts": ["query", "verdicts", *DAYS],
    "query incidents": ["query", "incidents", *DAYS],
    "query sql": ["query", "sql", "SELECT id, now, NULL AS unset FROM ticks"],
    "query logs": ["query", "logs", *DAYS],
    "report": ["report", *DAYS, "--no-evidently", "--output", "report.html"],
    "scan": ["scan", "dataset", *NOW],
}
# What the fixture cannot give these; where their JSON is checked instead.
NEEDS_MORE = {
    "ui": "a server that runs until interrupted (tests/ui/test_pages.py)",
    "demo": "hours of simulated traffic (tests/monitor/test_demo.py)",
    "compare": "two stored model versions (tests/query/test_explain_and_cli.py)",
    "explain": "an incident (tests/query/test_explain_and_cli.py)",
    "reference build": "a reference dataset (tests/checks/test_small_reference.py)",
}


def test_every_command_is_run_or_says_what_it_needs():
    assert sorted([*RUNS, *NEEDS_MORE]) == sorted(LEAVES)


def test_json_output_parses_and_writes_times_as_rfc3339_utc(workdir, monkeypatch):
    from monitor.daemon.engines import dataset

    # `scan`'s input: the fixture's predictions as a joined Parquet dataset
    dataset.write_dataset(dataset.joined_rows(dataset.read_jsonl(workdir / "logs" / "predictions"), None),
                          workdir / "dataset")
    found = 0
    for path, args in RUNS.items():
        result = _invoke(*args, "-f", "json", cwd=workdir, monkeypatch=monkeypatch)
        assert result.exit_code in (0, 1), (path, result.output)
        document = json.loads(result.stdout)
        bad = [(where, text) for where, text in _times(document) if not RFC3339_UTC.match(text)]
        found += sum(1 for _ in _times(document))
        assert bad == [], path
    assert found > 20
    for path, args in RUNS.items():
        if path not in ("init", "silence create", "silence expire", "backfill", "run"):  # these change things
            csv = _invoke(*args, "-f", "csv", cwd=workdir, monkeypatch=monkeypatch)
            assert csv.exit_code in (0, 1) and csv.stdout.count(",") > 0, (path, csv.output)


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


@pytest.mark.parametrize("command", [["tick"], ["alerts"], ["nightly"], ["silence", "list"], ["silence", "create"],
                                     ["accept", "v1"], ["reference", "build"], ["scan", "data.parquet"],
                                     ["report"], ["query", "metrics"], ["compare", "--baseline", "a", "--candidate", "b"],
                                     ["check-logs"]])
def test_unknown_service_lists_the_configured_ones(workdir, monkeypatch, command):
    result = _invoke(*command, "-s", "frod", cwd=workdir, monkeypatch=monkeypatch)
    assert result.exit_code == 2, result.output
    assert "frod" in result.output and "churn" in result.output, result.output


def test_a_silence_for_a_service_matches_its_alerts_only(workdir, monkeypatch):
    created = _invoke("silence", "create", "-s", "churn", "-f", "json", *NOW, cwd=workdir, monkeypatch=monkeypatch)
    assert json.loads(created.stdout)["matchers"] == [{"name": "service", "op": "=", "value": "churn"}]
    listed = _invoke("silence", "list", "-s", "churn", "-f", "json", *NOW, cwd=workdir, monkeypatch=monkeypatch)
    assert [s["id"] for s in json.loads(listed.stdout)] == [json.loads(created.stdout)["id"]]
    assert _invoke("silence", "create", *NOW, cwd=workdir, monkeypatch=monkeypatch).exit_code == 2


def test_alerts_table_lists_the_most_severe_first_then_the_newest():
    from datetime import UTC, datetime

    from monitor.cli.alerts import _severity

    def alert(name, state, severity, hour):
        return {"name": name, "state": state, "labels": {"severity": severity},
                "since": datetime(2026, 11, 2, hour, tzinfo=UTC)}

    records = [alert("old-page", "firing", "page", 1), alert("pending-page", "pending", "page", 5),
               alert("warn", "firing", "warn", 6), alert("new-page", "firing", "page", 3),
               alert("resolved", "resolved", "page", 7)]
    assert [r["name"] for r in sorted(records, key=_severity)] == ["new-page", "old-page", "warn", "pending-page",
                                                                   "resolved"]


def test_reference_build_without_a_reference_says_so_and_draws_no_empty_table(workdir, monkeypatch):
    built = _invoke("reference", "build", cwd=workdir, monkeypatch=monkeypatch)
    assert built.exit_code == 0, built.output
    assert "skipped: service churn has no reference configured" in built.output
    assert "reference profiles" not in built.output


def test_tick_table_title_shows_the_time_service_and_status(workdir, monkeypatch):
    ticked = _invoke("tick", *NOW, cwd=workdir, monkeypatch=monkeypatch)
    assert ticked.exit_code == 0, ticked.output
    assert "tick 2026-11-02 12:00:00 UTC · service churn · ok" in ticked.stdout


def test_the_command_list_gives_each_command_its_first_sentence_on_one_line():
    shown = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "250"}).stdout
    panel = shown[shown.index("Commands"):].splitlines()[1:]
    rows = [line for line in panel if line.startswith("│")]
    # A row continuing the one above starts with blanks where the command's name would be.
    assert rows and all(not line[1:].startswith("            ") for line in rows), "\n".join(rows)
    assert any("Run the daemon: scheduled ticks and nightly jobs, leader lock, /livez /readyz /metrics." in line
               for line in rows)


def test_a_tick_report_prints_what_came_from_the_logs_as_written():
    from rich.console import Console

    from monitor.cli.pipeline import print_report
    from monitor.daemon.runner import TickReport

    report = TickReport(service="churn", now="2026-11-02T12:00:00+00:00", status="error",
                        error="cannot read logs/[bold]x[/bold].jsonl", events=["logs/[red]p[/red].jsonl: truncated"],
                        first_ts="2026-11-02T11:00:00.25+00:00", last_ts="2026-11-02T11:59:59+00:00")
    console = Console(width=120, record=True, color_system=None)
    print_report(report, console)
    text = console.export_text()
    assert "error: cannot read logs/[bold]x[/bold].jsonl" in text
    assert "- logs/[red]p[/red].jsonl: truncated" in text
    assert "2026-11-02 11:00:00 .. 2026-11-02 11:59:59 UTC" in text


def test_an_error_quotes_what_was_typed_as_written(workdir, monkeypatch):
    result = _invoke("query", "metrics", "-s", "[bold]frod[/bold]", cwd=workdir, monkeypatch=monkeypatch)
    assert result.exit_code == 2 and "[bold]frod[/bold]" in result.output, result.output


def test_explain_prints_what_changed_as_written():
    from datetime import UTC, datetime

    from rich.console import Console

    from monitor.investigate.explain import Explanation, render

    at = datetime(2026, 11, 2, 3, tzinfo=UTC)
    result = Explanation(incident={"id": 1, "status": "open", "model_version": "v[2]"}, verdict="slower",
                         summary="slower: p95 up", verdicts={"slower": 1}, evidence=[], stages=[], affected=[],
                         what_changed=[{"kind": "config_hash", "text": "config_hash [red]x[/red] first seen"}],
                         next_queries=[], window=(at, at), before=(at, at),
                         named={"stage": "[blink]model", "segments": ["Contract=[i]Two year"], "groups": ["[u]g"]})
    console = Console(width=120, record=True, color_system=None)
    render(result, console)
    text = console.export_text()
    assert "config_hash [red]x[/red] first seen" in text and "model version v[2]," in text
    assert "stage [blink]model; segment Contract=[i]Two year; group [u]g" in text
