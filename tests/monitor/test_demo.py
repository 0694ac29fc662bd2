"""`tailwatch demo` end to end on a short scenario: generate, replay tick by tick, show a readable summary."""

from __future__ import annotations

import re

from rich.console import Console

from monitor.demo import BROKEN_LINES, run_demo


def test_demo_replays_a_scenario_and_prints_what_ingest_saw(tmp_path):
    console = Console(record=True, width=120)
    run_demo(scenario="slower-batching", hours=1.5, seed=3, keep=tmp_path / "run", console=console)
    text = console.export_text()
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
