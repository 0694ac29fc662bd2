"""`tailwatch demo` end to end on a short scenario: generate, replay tick by tick, show a readable summary."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from rich.console import Console

from monitor.demo import BROKEN_LINES, _breaches, run_demo
from monitor.investigate.output import dumps, json_cell


def test_demo_replays_a_scenario_and_prints_what_ingest_saw(tmp_path):
    console = Console(record=True, width=120)
    summary = run_demo(scenario="slower-batching", hours=1.5, seed=3, keep=tmp_path / "run", console=console)
    text = console.export_text()
    # The summary record (`demo --format json`): breaches most severe first, times RFC 3339 UTC with Z.
    severities = [b["severity"] for b in summary["breaches"]]
    assert severities and severities == sorted(severities, reverse=True)
    document = json.loads(dumps(json_cell(summary)))
    assert document["truth"]["verdict"] == "slower" and document["breaches"][0]["first_window"].endswith(":00Z")
    read, accepted = map(lambda s: int(s.replace(",", "")),
                         re.search(r"predictions read / accepted\s*│\s*([\d,]+) / ([\d,]+)", text).groups())
    # Every simulated prediction is accepted; only the deliberately broken lines are quarantined.
    assert read - accepted == len(BROKEN_LINES)
    for reason in ("unparseable", "unknown_status", "missing_field"):
        assert re.search(rf"{reason}\s*│\s*1 │", text), reason
    assert "right verdict: slower" in text and "◀" in text
    # The checks name the slow stage in the window that holds the onset.
    found = text.split("what tailwatch found", 1)[1].split("ground truth", 1)[0]
    assert re.search(r"◀ │\s*\d+ │ latency\s*│ p\d+\s+batch_wait", found), found
    assert (tmp_path / "run" / "tailwatch.db").exists() and (tmp_path / "run" / "tailwatch.yaml").exists()


def test_replay_as_a_backlog_writes_every_earlier_line_before_its_first_tick(tmp_path):
    from datetime import timedelta

    import pandas as pd
    import pytest

    from monitor.demo import replay
    from monitor.simulate import generate

    truth = generate("slower-cache", tmp_path / "generated", seed=3, hours=1.5, rate_per_s=1.0, otlp=False,
                     fault_end_hours=1.0)
    for kind in ("predictions", "timings"):
        (tmp_path / "logs" / kind).mkdir(parents=True)
    start = pd.Timestamp(truth.start).to_pydatetime()
    seen = []

    def job(cfg, store, now):
        lines = [ln for f in (tmp_path / "logs" / "predictions").glob("*.jsonl") for ln in f.read_text().splitlines()]
        latest = max(pd.Timestamp(ln.split('"ts":"', 1)[1][:24]) for ln in lines)
        seen.append((now, len(lines), latest))
        return [None]

    replay(tmp_path, None, None, truth, broken_lines=False, job=job, first_tick=start + timedelta(hours=1))
    assert [now - start for now, _, _ in seen] == [timedelta(minutes=m) for m in (60, 75, 90, 105)]
    # the backlog: all of the first hour at the first tick, nothing later than it
    assert start + timedelta(minutes=55) < seen[0][2] <= seen[0][0]
    assert seen[-1][1] == truth.counts["predictions"]
    with pytest.raises(ValueError, match="15-minute grid"):
        replay(tmp_path, None, None, truth, job=job, first_tick=start + timedelta(minutes=20))


def test_a_cut_breach_table_says_which_command_shows_the_rest(tmp_path):
    start = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
    groups = [{"check": "latency", "model_version": "v1", "what": f"p99 stage_{i}", "windows": 1000 + i,
               "first_window": start + timedelta(minutes=15 * i), "value": 12345.6, "baseline": 0.5,
               "severity": 12 - i} for i in range(12)]
    truth = SimpleNamespace(onset=None)
    console = Console(record=True, width=80)
    for part in _breaches(groups, truth, tmp_path):
        console.print(part, soft_wrap=not hasattr(part, "columns"))
    text = console.export_text()
    rows = [line for line in text.splitlines() if "stage_" in line]
    assert [int(re.search(r"stage_(\d+)", line).group(1)) for line in rows] == list(range(10))
    assert "1,000" in rows[0] and "12,346" in rows[0]  # separators, never 1.23e+04
    more = text.splitlines()[-1]
    assert more == (f"2 more breaching windows; all of them: tailwatch --config {tmp_path / 'tailwatch.yaml'} "
                    "query findings --status breach --window 15m --segment all")
