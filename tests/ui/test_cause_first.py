"""The cause first on every page: a quality incident's page leads with its acceptance rules, each against its
own number (value, floor, the accepted version's figure, one n); the service overview draws matured quality
and every declared signal; an open incident's page runs to its service's last tick; figures are written in
plain decimals. On the simulator's worse-threshold run and on statsmodels' Fair survey (realcases.fair_case)."""

from __future__ import annotations

import html as html_mod
import json
import re
import urllib.request
from datetime import timedelta

import pandas as pd
import pytest
from ui_support import serving

from monitor.investigate import history, query
from monitor.ui.pages import environment
from storage.store import Store


def page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=120) as response:
        assert response.status == 200, url
        return response.read().decode()


def figure(html: str, chart: str) -> dict | None:
    """The JSON of chart `chart` on a page (None when the page has no such chart)."""
    found = re.search(rf'<script type="application/json" id="{re.escape(chart)}-json">(.*?)</script>', html, re.S)
    return None if found is None else json.loads(found.group(1))


def text(html: str) -> str:
    """A page's visible text, roughly: tags dropped, entities read."""
    body = re.sub(r"<script\b.*?</script>", " ", html, flags=re.S)
    return html_mod.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)))


def stored(cfg, check: str, **labels) -> pd.DataFrame:
    store = Store(cfg.storage.url)
    try:
        found = query.findings(store, cfg.services[0].name, check=check, detail=check == "acceptance")
    finally:
        store.dispose()
    keep = [all((lab or {}).get(k) == v for k, v in labels.items()) for lab in found["labels"]]
    return found[keep]


def incidents(cfg) -> pd.DataFrame:
    store = Store(cfg.storage.url)
    try:
        return query.incidents(store, cfg.services[0].name)
    finally:
        store.dispose()


# value -> as the pages write it (the `num` filter every figure on a page goes through)
PLAIN = [(0, "", "0"), (14.2, "ms", "14.2 ms"), (12345.6, "ms", "12,346 ms"), (1234.5, "", "1,234"),
         (0.000123456, "", "0.000123"), (3e-7, "", "< 0.000001"), (-3e-7, "", "> -0.000001"),
         (-0.0417, "", "-0.0417"), (2.5e9, "", "2,500,000,000"), (0.1 + 0.2, "", "0.3"), (1.0, "", "1")]


@pytest.mark.parametrize(("value", "unit", "written"), PLAIN)
def test_numbers_are_written_in_plain_decimals(value, unit, written):
    assert environment().filters["num"](value, unit) == written


# stored text (a summary written by another version, an older release) -> as the pages write it
PROSE = [("p95 total latency 1.23e+03 ms vs 980 ms", "p95 total latency 1,230 ms vs 980 ms"),
         ("error_rate 5e-05% vs 0%; PSI 3E-7", "error_rate 0.00005% vs 0%; PSI < 0.000001"),
         ("replica=api-2e-5 req-7-0000003365 config_hash 3e5 3e5a", "replica=api-2e-5 req-7-0000003365 config_hash 3e5 3e5a"),
         ("recall 0.286 vs floor 0.60 (v1 0.789)", "recall 0.286 vs floor 0.60 (v1 0.789)")]


@pytest.mark.parametrize(("stored_text", "written"), PROSE)
def test_stored_text_is_shown_with_plain_numbers(stored_text, written):
    assert environment().filters["prose"](stored_text) == written


def worse_incident(run) -> int:
    found = incidents(run["config"])
    worse = found[found["verdict"] == "worse"]
    assert len(worse), found[["id", "verdict", "status"]]
    return int(worse["id"].iloc[0])


def rules_table(html: str) -> list[list[str]]:
    """The rows of the page's rules table, as cell texts."""
    table = re.search(r'<table id="rules".*?<tbody>(.*?)</tbody>', html, re.S)
    assert table is not None, "no rules table"
    return [[text(c).strip() for c in re.findall(r"<td\b[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr\b[^>]*>(.*?)</tr>", table.group(1), re.S)]


# run fixture, the rule and group that breach, the accepted version as the rule's words name it
CASES = [("quality_run", "churn recall", "all", "v1"), ("fair", "recall by occupation", "managerial", "fair-gb-1")]


@pytest.mark.parametrize(("run", "rule", "group", "accepted"), CASES, ids=["churn", "fair"])
def test_a_quality_incident_leads_with_its_rules_each_against_its_own_number(request, run, rule, group, accepted):
    run = request.getfixturevalue(run)
    cfg, incident_id = run["config"], worse_incident(run)
    with serving(cfg) as (server, _):
        html = page(f"{server.url}/incidents/{incident_id}")
    # Quality comes before latency, cache and inputs: the rules table and the quality chart first.
    at = {name: html.index(f'<h2 id="{name}">') for name in ("quality", "latency", "cache", "inputs")}
    assert at["quality"] == min(at.values()), at
    assert at["quality"] < html.index('id="rules"') < html.index('id="quality-json"') < at["latency"]
    rows = rules_table(html)
    assert len({(r[1], r[3]) for r in rows}) == len(rows)  # one row per rule and group: one n each
    # The breaching rule's row, from the stored finding: its latest breaching window's figure, n, floor.
    found = stored(cfg, "acceptance", rule=rule, group=group)
    version = incidents(cfg).set_index("id").loc[incident_id, "model_version"]
    breach = found[(found["status"] == "breach") & (found["model_version"] == version)]
    assert len(breach), found[["window_start", "status", "value"]]
    latest = breach.sort_values(["window_end", "n"]).iloc[-1]
    # Worded as Slack and explain word it, from that window's stored finding: its value, the rule's floor,
    # the accepted version's figure.
    from monitor.verdicts.evidence import rule_text

    want = rule_text({**latest.to_dict(), "check": "acceptance"})
    row = next(r for r in rows if (r[1], r[3]) == (rule, group))
    assert row[0] == want and f"({accepted} " in want, (row, want)
    assert row[2] == latest["labels"]["class"] and row[4] == f"{int(latest['n']):,}" and row[6].startswith("breach")
    assert row[7] == f"{len(breach)} of {len(found[found['model_version'] == version])} windows"
    # The chart draws the same figures: the value, the accepted version's figure and the floor per row.
    chart = figure(html, "quality")
    traces = {t["name"]: t for t in chart["data"]}
    i = next(i for i, y in enumerate(traces["during (95% interval)"]["y"]) if y.startswith(f"{group}<br>{rule},"))
    assert traces["during (95% interval)"]["x"][i] == pytest.approx(latest["value"])
    assert traces["accepted version"]["x"][i] == pytest.approx(latest["baseline"])
    assert traces["floor"]["x"][i] == pytest.approx(max(latest["detail"]["floor"], 0))


def test_the_churn_floor_rule_reads_as_the_issue_writes_it(quality_run):
    """A `min: 0.6` rule: "recall 0.297 vs floor 0.60 (v1 0.664, ...)" (value, floor, v1, in that order)."""
    with serving(quality_run["config"]) as (server, _):
        rows = rules_table(page(f"{server.url}/incidents/{worse_incident(quality_run)}"))
    row = next(r for r in rows if r[1] == "churn recall")
    assert re.fullmatch(r"recall 0\.\d{1,3} vs floor 0\.60 \(v1 0\.\d{1,3}(, its last \d windows?)?\)", row[0]), row


@pytest.mark.parametrize(("run", "pairs"), [("quality_run", {("recall", "Yes")}),
                                            ("fair", {("accuracy", "all"), ("recall", "1")})], ids=["churn", "fair"])
def test_the_service_overview_draws_matured_quality_first_and_each_signal(request, run, pairs):
    run = request.getfixturevalue(run)
    cfg, truth = run["config"], run["truth"]
    svc = cfg.services[0]
    start = pd.Timestamp(truth.start if hasattr(truth, "start") else truth["start"])
    end = pd.Timestamp(truth.end if hasattr(truth, "end") else truth["end"])
    span = f"since={start:%Y-%m-%dT%H:%MZ}&until={end + timedelta(hours=1):%Y-%m-%dT%H:%MZ}"
    with serving(cfg) as (server, _):
        html = page(f"{server.url}/services/{svc.name}?{span}")
    chart = figure(html, "quality")
    assert chart is not None, "no matured quality chart"
    # The newest incident shown is a quality one: its chart leads the page.
    assert html.index('id="quality-json"') < html.index('id="latency-json"')
    found = stored(cfg, "quality", group="all")
    found = found[(found["window_end"] > start) & (found["window_start"] < end + timedelta(hours=1))]
    shortest = (found["window_end"] - found["window_start"]).min()
    found = found[found["window_end"] - found["window_start"] == shortest]
    lines = {t["name"]: t for t in chart["data"]}
    want = {f"{v} {m} {c}" for v, lab in zip(found["model_version"], found["labels"], strict=True)
            for m, c in [(lab["metric"], lab["class"])] if (m, c) in pairs}
    assert set(lines) == want and len(want) >= 2 * len(pairs) - 1, (set(lines), want)  # the rules' metrics only
    for name, line in lines.items():
        version, metric, cls = name.split(" ")
        same = pd.Series([lab["metric"] == metric and lab["class"] == cls for lab in found["labels"]], found.index)
        mine = found[(found["model_version"] == version) & same].sort_values("window_start")
        assert line["y"] == pytest.approx(mine["value"].tolist()) and line["customdata"] == mine["n"].tolist()
    # Every declared signal: its mean and p95 per period, as history.metrics has them.
    store = Store(cfg.storage.url)
    try:
        step = pd.Timedelta(minutes=int(re.search(r"one point per (\d+) min", html).group(1)))
        metrics = history.metrics(store, svc.name, since=start.to_pydatetime(),
                                  until=(end + timedelta(hours=1)).to_pydatetime(), every=step, group_by=())
    finally:
        store.dispose()
    for signal in svc.schema_.signals:
        drawn = {t["name"]: t["y"] for t in figure(html, f"signal-{signal}")["data"]}
        assert drawn["mean"] == pytest.approx(metrics[f"{signal}_mean"].dropna().tolist())
        assert drawn["p95"] == pytest.approx(metrics[f"{signal}_p95"].dropna().tolist())


def test_an_open_incident_runs_to_the_last_tick(ui_run, incident_id):
    """slower-cache's incident is open; its last window closed at the run's end, the last tick came later."""
    cfg = ui_run["config"]
    store = Store(cfg.storage.url)
    try:
        tick = query.ticks(store, "churn", limit=1)["now"].iloc[-1]
    finally:
        store.dispose()
    inc = incidents(cfg).set_index("id").loc[incident_id]
    assert inc["status"] == "open" and pd.Timestamp(inc["last_window_end"]) < tick
    with serving(cfg) as (server, _):
        html = page(f"{server.url}/incidents/{incident_id}")
        listed = page(f"{server.url}/?status=open")
        slowest = page(f"{server.url}/incidents/{incident_id}/requests")
    timeline = figure(html, "timeline")
    shaded = next(s for s in timeline["layout"]["shapes"] if s.get("name") == "incident")
    assert pd.Timestamp(shaded["x1"]) == tick
    # The chart's time axis runs to the last tick, past the last closed window.
    assert pd.Timestamp(timeline["layout"]["xaxis"]["range"][1]) == tick
    assert f"{tick:%Y-%m-%d %H:%M} UTC (the last tick)" in text(html)
    minutes = int((tick - pd.Timestamp(inc["first_window_start"])).total_seconds() // 60)
    assert f"{minutes} min" in text(listed) if minutes < 120 else f"{minutes / 60:.1f} h" in text(listed)
    assert f"– {tick:%Y-%m-%d %H:%M} UTC, ranked by" in text(slowest)


@pytest.fixture(scope="module")
def generation(tmp_path_factory) -> dict:
    """The simulated text-generation service (monitor/simulate/generation.py): `spec_accept` declared as a
    signal, thumbs up / down feedback scored as a rate per language (class `all`) with a rule per language."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "simulate"))
    from generation_support import run_generation

    root = tmp_path_factory.mktemp("ui-generation")
    run_generation("generation-worse-ja", root, None, hours=3, onset=1.5, rate=1.5)
    from monitor import config as config_mod

    return {"config": config_mod.load(root / "tailwatch.yaml")}


def test_a_generation_service_overview_charts_spec_accept_and_its_feedback_rate(generation):
    cfg = generation["config"]
    svc = cfg.services[0]
    assert svc.schema_.signals == ["spec_accept"] and svc.quality.rules[0].metric == "feedback_rate"
    with serving(cfg) as (server, _):
        html = page(f"{server.url}/services/{svc.name}")
    drawn = {t["name"]: t["y"] for t in figure(html, "signal-spec_accept")["data"]}
    assert set(drawn) == {"mean", "p95"} and all(0 <= v <= 1 for v in drawn["mean"])  # an acceptance rate
    quality = figure(html, "quality")
    assert quality is not None, "no feedback chart"
    found = stored(cfg, "quality", group="all", metric="feedback_rate").sort_values("window_start")
    # The rule names no class (macro); the feedback rate is scored as class `all`: that line is drawn.
    assert [t["name"] for t in quality["data"]] == [f"{v} feedback_rate all" for v in found["model_version"].unique()]
    assert quality["data"][0]["y"] == pytest.approx(found["value"].tolist())
