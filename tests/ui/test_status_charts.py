"""The pages chart the cancelled and truncated rates where a service logs them (a generation service whose
`values:` map `aborted` and `length` onto them), and not where none is logged; the slowest-requests page
lists the slowest 5% of the incident's requests, as `tailwatch query logs` does by default."""

from __future__ import annotations

import html as html_mod
import json
import re

import numpy as np
import pytest
from statuses_support import END, ONSET, START, fill

from monitor.investigate import history
from monitor.investigate.logs import SLOWEST
from monitor.ui import views
from monitor.ui.pages import render
from storage.store import Store


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> dict:
    return fill(tmp_path_factory.mktemp("ui-statuses"))


@pytest.fixture
def store(stored):
    st = Store(stored["config"].storage.url)
    try:
        yield st
    finally:
        st.dispose()


def figure(page: str, chart: str) -> dict:
    found = re.search(rf'<script type="application/json" id="{re.escape(chart)}-json">(.*?)</script>', page, re.S)
    assert found is not None, chart
    return json.loads(found.group(1))


def text(page: str) -> str:
    body = re.sub(r"<script\b.*?</script>", " ", page, flags=re.S)
    return html_mod.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)))


def test_the_overview_charts_cancelled_and_truncated_rates_where_logged(stored, store):
    cfg = stored["config"]
    page = render("service.html", views.overview(cfg, store, "gen", END, since=START, until=END))
    lines = {t["name"]: t for t in figure(page, "traffic")["data"]}
    assert {"errors (%)", "timeouts (%)", "rejects (%)", "cancelled (%)", "truncated (%)"} <= set(lines)
    metrics = history.metrics(store, "gen", since=START, until=END, every=views._step(END - START), group_by=())
    for status in ("cancelled", "truncated"):
        assert lines[f"{status} (%)"]["y"] == pytest.approx((metrics[f"{status}_rate"] * 100).tolist())
        assert max(lines[f"{status} (%)"]["y"]) > 0 and lines[f"{status} (%)"]["yaxis"] == "y2"
    plain = render("service.html", views.overview(cfg, store, "churn", END, since=START, until=END))
    assert {t["name"] for t in figure(plain, "traffic")["data"]} == {
        "requests per hour", "errors (%)", "timeouts (%)", "rejects (%)"}


def test_the_incident_page_compares_cancelled_and_truncated_before_and_during(stored, store):
    rows = stored["rows"]["gen"]
    page = render("incident.html", views.incident(stored["config"], store, stored["incident_id"], END))
    bars = {t["name"]: dict(zip(t["x"], t["y"], strict=True)) for t in figure(page, "failures")["data"]}
    during = rows[rows["ts"] >= ONSET]
    for status in ("cancelled", "truncated"):
        # Before the onset v1 logged none: a bar of 0 %, not a missing one.
        assert bars["before"][status] == 0.0
        assert bars["during"][status] == pytest.approx(100 * (during["status"] == status).mean())
    assert list(bars["during"])[:3] == ["errors", "timeouts", "rejects"]


def test_the_slowest_requests_page_lists_the_slowest_five_percent(stored, store):
    rows = stored["rows"]["gen"]
    context = views.requests(stored["config"], store, stored["incident_id"], END)
    during = rows[(rows["ts"] >= ONSET) & (rows["ts"] < END)]["latency_ms"].to_numpy()
    floor = float(np.quantile(during, 1 - SLOWEST))
    assert context["scanned"] == len(during)
    assert context["matched"] == int((during >= floor).sum()) < len(during) // 10
    assert context["min_ms"] == pytest.approx(floor) and context["slowest"] == SLOWEST
    assert min(r["latency_ms"] for r in context["rows"]) >= floor
    shown = text(render("requests.html", context))
    assert f"{context['matched']} of {len(during)} requests in range match" in shown
    assert "the slowest 5.0 %" in shown

