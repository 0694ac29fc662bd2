"""Progress: the stages tell a plain observer what they have read; the CLI draws it on stderr only when
stderr is a terminal and `--quiet` was not given."""

from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
from ops.opsfeed import START, feed_lines, write_all, write_config
from rich.console import Console
from typer.testing import CliRunner

from monitor import config as config_mod
from monitor.cli import app
from monitor.cli.common import State
from monitor.cli.progress import progress
from monitor.daemon.runner import tick
from storage.store import Store

NOW = START + timedelta(hours=3)
RATE = re.compile(r"[\d,]+ rows/s")


@pytest.fixture
def backlog(tmp_path):
    """A config over three hourly files of predictions and of timings, not read yet, and its migrated store."""
    preds, timings = feed_lines(minutes=150, per_minute=20)
    write_all(tmp_path / "logs" / "predictions", preds, "pred")
    write_all(tmp_path / "logs" / "timings", timings, "time")
    config = write_config(tmp_path, chunk_rows=200)
    store = Store(f"sqlite:///{tmp_path / 'tw.db'}")
    store.upgrade()
    yield config, store
    store.dispose()


def test_a_tick_tells_its_observer_the_rows_read_up_to_the_total(backlog):
    config, store = backlog
    assert len(list((config.parent / "logs" / "predictions").iterdir())) == 3
    calls = []
    (report,) = tick(config_mod.load(config), store, NOW, lambda done, total: calls.append((done, total)))
    rows = sum(report.read.values())
    assert rows > 10 * 200 and len(calls) > 10  # many chunks of limits.chunk_rows
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[0] < rows
    assert calls[-1] == (rows, rows)
    # Before the end the total is an estimate from the bytes left: known once both sources have read a
    # chunk, never below what is read, and close to the rows there were (the lines are alike in length).
    estimates = [(d, t) for d, t in calls[:-1] if t is not None]
    assert len(estimates) >= len(calls) - 3
    assert all(d <= t and abs(t - rows) <= rows / 10 for d, t in estimates)


def _tick(config, *args: str, env: dict) -> object:
    # Whatever the terminal running the tests says, only `env` decides whether stderr counts as one.
    env = {"FORCE_COLOR": None, "TTY_COMPATIBLE": None, "COLUMNS": "120", **env}
    return CliRunner().invoke(app, ["-c", str(config), *args, "tick", "--now", NOW.isoformat()], env=env,
                              catch_exceptions=False)


def test_no_progress_when_stderr_is_not_a_terminal(backlog):
    config, _ = backlog
    result = _tick(config, env={})
    assert result.exit_code == 0 and "rows read" not in result.stdout
    assert result.stderr == ""


def test_quiet_silences_the_progress_on_a_terminal(backlog):
    config, _ = backlog
    result = _tick(config, "--quiet", env={"TTY_COMPATIBLE": "1"})
    assert result.exit_code == 0 and result.stderr == ""


def test_a_terminal_sees_the_rows_per_second(backlog):
    config, _ = backlog
    result = _tick(config, env={"TTY_COMPATIBLE": "1"})
    assert result.exit_code == 0 and "tick" in result.stderr and RATE.search(result.stderr), result.stderr
    assert "predictions: read" in result.stdout  # the report itself is unchanged, on stdout


def test_an_injected_terminal_shows_done_rate_and_time_left(monkeypatch):
    monkeypatch.setattr(State, "quiet", False)  # as a command without --quiet sets it
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, width=120)
    with progress("scan", console=console) as observe:
        assert observe is not None
        observe(0, None)
        observe(1_000, 4_000)
        observe(4_000, 4_000)
    assert RATE.search(stream.getvalue()) and "4,000 rows" in stream.getvalue()
    with progress("scan", console=Console(file=io.StringIO())) as observe:  # not a terminal
        assert observe is None


def _counts_up(calls: list[tuple[int, int | None]], total: int) -> None:
    done = [d for d, _ in calls]
    assert len(calls) > 2 and done == sorted(done) and calls[-1] == (total, total)


def test_a_scan_tells_its_observer_the_rows_folded_of_the_rows_to_fold(backlog, tmp_path):
    from monitor.daemon.engines import dataset as layout
    from monitor.daemon.engines.scan import run_scan

    config, store = backlog
    cfg = config_mod.load(config)
    logs = config.parent / "logs"
    rows = layout.joined_rows(layout.read_jsonl(logs / "predictions"), layout.read_jsonl(logs / "timings"))
    layout.write_dataset(rows, tmp_path / "dataset", rows_per_file=700)
    calls = []
    run_scan(cfg, cfg.services[0], store, str(tmp_path / "dataset"), NOW,
             engine=cfg.engine.model_copy(update={"partition_rows": 500}),
             observe=lambda done, total: calls.append((done, total)))
    _counts_up(calls, len(rows))
    assert all(t == len(rows) for _, t in calls)  # known from the files' footers before a row is read


def test_a_drill_down_tells_its_observer_the_raw_rows_read(backlog):
    from monitor.investigate.logs import drill

    config, _ = backlog
    cfg = config_mod.load(config)
    calls = []
    result = drill(cfg.services[0], cfg.limits, since=START, until=NOW, stage="model", now=NOW,
                   observe=lambda done, total: calls.append((done, total)))
    logs = config.parent / "logs"
    lines = sum(len(f.read_bytes().splitlines()) for f in logs.glob("*/*.jsonl"))
    assert result.matched > 0
    _counts_up(calls, lines)  # predictions, then timings, every line read (the broken ones too)
