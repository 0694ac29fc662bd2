"""`tailwatch report`: a self-contained HTML file (nothing fetched from the network) holding the plots and
Evidently's drift report; it opens in headless Chromium without console errors and the screenshot shows
the plots drawn."""

from __future__ import annotations

import base64
import io
import os
import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from monitor.investigate.report import STAGE_COLORS, build_report
from storage.store import Store

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def report_html(scenario_run) -> str:
    cfg, truth = scenario_run["config"], scenario_run["truth"]
    store = Store(cfg.storage.url)
    try:
        return build_report(store, cfg.services[0], cfg.limits, since=pd.Timestamp(truth.start).to_pydatetime(),
                            until=pd.Timestamp(truth.end).to_pydatetime())
    finally:
        store.dispose()


def test_report_is_self_contained_and_holds_the_plots(report_html):
    # No script, image, stylesheet or frame is loaded from anywhere: every src / href is inline.
    for attr in re.findall(r"<(?:script|img|link|iframe)\b[^>]*>", report_html, flags=re.I):
        assert not re.search(r"\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//", attr, flags=re.I), attr
    plots = re.findall(r'<img class="plot" alt="([^"]+)" src="data:image/png;base64,([^"]+)"', report_html)
    assert [alt for alt, _ in plots] == ["Latency per stage", "Traffic and failures", "Drift per field"]
    for _, data in plots:
        image = Image.open(io.BytesIO(base64.b64decode(data)))
        assert image.width > 600 and image.height > 200
    # The labels-driven sections say why they are empty (no quality scoring in this run).
    assert "no quality findings" in report_html and "no label coverage findings" in report_html
    assert '<iframe id="evidently"' in report_html and "Dataset Drift" not in report_html.split("srcdoc=")[0]
    assert "cache_hit_rate" in report_html  # the breaching findings table


def chromium(path, shot) -> str:
    """Open `path` in headless Chromium, screenshot it, and return what it logged (console included)."""
    if CHROMIUM is None:
        # `make test` installs it (tests/setup/debian.sh) where it may; CI must not pass by skipping.
        reason = "chromium is not installed and tests/setup/debian.sh could not install it (needs root)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         "--window-size=1280,2400", "--virtual-time-budget=5000", f"--screenshot={shot}", f"file://{path}"],
        capture_output=True, text=True, timeout=120)
    assert shot.exists(), done.stderr[-2000:]
    return done.stderr


def console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if ":CONSOLE" in line
            and re.search(r"error|uncaught|failed|refused", line, flags=re.I)]


def test_console_error_detection_works(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>console.error('boom'); missing();</script></body></html>")
    assert len(console_errors(chromium(page, tmp_path / "bad.png"))) == 2


def test_report_opens_in_chromium_without_errors_and_draws_the_plots(report_html, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(report_html, encoding="utf-8")
    log = chromium(page, tmp_path / "report.png")
    assert console_errors(log) == []
    shot = np.asarray(Image.open(tmp_path / "report.png").convert("RGB")).astype(int)
    # The p95 and p99 lines of the latency panels, in their own colours (nothing else on the page uses
    # them): present only if the images render.
    for name in ("p95", "p99"):
        rgb = np.array([int(STAGE_COLORS[name][i:i + 2], 16) for i in (1, 3, 5)])
        close = (np.abs(shot - rgb).sum(axis=2) < 60).sum()
        assert close > 300, (name, close)
