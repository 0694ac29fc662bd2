"""Snapshots of what on-call reads for three simulator scenarios (a latency regression in one stage, a new
category, a quality drop): the Slack message as the fake Slack Web API received it, and `tailwatch explain`.

Every value carries its unit and the evidence is ranked by effect size. The runs are deterministic (fixed
seed, the simulator's own clock, explain's `now` passed in). After an intended change of the wording,
regenerate the files under tests/alerts/snapshots/ and review their diff:

    TW_UPDATE_SNAPSHOTS=1 python -m pytest tests/alerts/test_message_snapshots.py
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("TW_UPDATE_SNAPSHOTS") == "1"
# A value, a baseline or an interval end with its unit: ms, %, pp, PSI, x, requests, a rate per second.
UNIT = re.compile(r"(\d ms|\d%|\d pp|PSI \d|\dx|\d requests|/s)")


def snapshot(name: str, actual: str) -> None:
    path = SNAPSHOTS / name
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(actual)
    assert path.exists(), f"no snapshot {path}: run with TW_UPDATE_SNAPSHOTS=1 to write it"
    assert actual == path.read_text(), f"{name} differs from its snapshot (TW_UPDATE_SNAPSHOTS=1 rewrites it)"


def evidence_lines(message: dict) -> list[str]:
    section = next(b["text"]["text"] for b in message["blocks"] if b["type"] == "section" and "text" in b
                   and b["text"]["text"].startswith("*Evidence*"))
    return section.splitlines()[1:]


@pytest.mark.parametrize("scenario, first", [("slower-batching", "stage=batch_wait"),
                                             ("drift-new-category", "field=Contract"),
                                             ("worse-threshold", "output=prediction")])
def test_slack_and_explain_snapshots(tmp_path, fake_slack, monkeypatch, scenario, first):
    from datetime import datetime

    from rich.console import Console
    from test_end_to_end import run

    from monitor.investigate.explain import explain, render
    from storage.store import Store

    result = run(scenario, tmp_path, fake_slack, monkeypatch)
    [post] = fake_slack.top_level
    posted = {"text": post["text"], "blocks": post["blocks"],
              "replies": [m["text"] for m in fake_slack.replies(post["ts"])]}
    body = json.dumps(posted, indent=1, sort_keys=True, ensure_ascii=False) + "\n"

    lines = evidence_lines(post)
    assert lines and all(UNIT.search(line) for line in lines), lines  # every value with its unit
    assert first in lines[0]  # the strongest evidence first
    assert "*Correlated signals*" not in body and ": 0%" not in body  # no repeated section, no zero share
    steps = next((b["text"]["text"] for b in post["blocks"] if "text" in b
                  and b["text"]["text"].startswith("*Next steps*")), "")
    assert "review the change" not in steps and "memory:" not in steps  # only what the evidence supports
    assert ("rolling back" in steps) == (scenario == "worse-threshold")  # a new model version at the onset

    store = Store(f"sqlite:///{tmp_path / 'tailwatch.db'}")
    try:
        found = explain(store, "churn", result["incidents"][-1]["id"],
                        now=datetime.fromisoformat(result["truth"].end.replace("Z", "+00:00")))
    finally:
        store.dispose()
    out = io.StringIO()
    render(found, Console(file=out, width=140, color_system=None, force_terminal=False))
    assert first.split("=")[1] in str(found.evidence[0]["labels"])  # explain ranks as Slack does
    assert all(e["windows"] <= sum(found.verdicts.values()) for e in found.evidence)  # each window cites once
    snapshot(f"{scenario}.slack.json", body)
    snapshot(f"{scenario}.explain.txt", out.getvalue())
