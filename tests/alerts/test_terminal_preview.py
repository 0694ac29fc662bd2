"""The Slack message as the demo shows it in a terminal: mrkdwn rendered as styles, emoji as symbols,
entities decoded, and values from the logs kept as text."""

from __future__ import annotations

from rich.console import Console

from monitor.alerts.render import render, terminal


def test_the_preview_is_readable_and_values_stay_text():
    notes = {"summary": "slower", "evidence": [{"check": "latency", "labels": {"stage": "[bold]x<y[/]",
                                                                                "quantile": "p95"},
                                                "value": 40.0, "baseline": 4.0, "n": 900, "status": "breach"}]}
    incident = {"id": 3, "service": "churn", "model_version": "v2", "verdict": "slower", "status": "open",
                "opened_at": None, "revision": 1,
                "summary": {"severity": "page", "alerts": [{"labels": {"alertname": "ModelRegression"},
                                                            "state": "firing", "annotations": notes}]}}
    shown = terminal(render(incident, "post", "post", None))
    console = Console(width=200, color_system=None, record=True)
    console.print(shown)
    out = console.export_text()
    assert out.startswith("● SLOWER — churn model v2")
    assert "• latency quantile=p95 stage=[bold]x<y[/]: 40 ms vs 4 ms (10x, n=900 requests)" in out
    assert not any(mark in out for mark in ("*", "`", ":red_circle:", "&lt;"))
    bold = [shown.plain[s.start:s.end] for s in shown.spans if "bold" in str(s.style)]
    assert "Evidence" in bold and "40 ms" in bold and "Severity" in bold
