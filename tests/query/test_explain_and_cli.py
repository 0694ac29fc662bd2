"""`explain`, `query verdicts` / `query incidents` on verdict and incident rows written through the models,
and the CLI layer: the stable JSON shapes, exit codes, and every command end to end."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from monitor.cli import app
from monitor.investigate import history
from monitor.investigate import query as q
from monitor.investigate.explain import explain
from storage.models import Incident, VerdictRow

WINDOW = timedelta(minutes=15)


def add_incident(store, truth) -> int:
    """The incident the alert stage would open on slower-cache: v2's windows from the onset, with verdicts."""
    onset, end = pd.Timestamp(truth.onset).to_pydatetime(), pd.Timestamp(truth.end).to_pydatetime()
    cache = q.findings(store, "churn", check="cache_hit_rate", model_version="v2", segment="all", window=WINDOW)
    with store.transaction() as session:
        incident = Incident(service="churn", model_version="v2", verdict="slower", status="resolved",
                            opened_at=onset + WINDOW, resolved_at=end, first_window_start=onset,
                            last_window_end=end, fingerprint="fp-test", summary={"text": "v2 lost its cache"},
                            updated_at=end)
        session.add(incident)
        session.flush()
        for f in cache.to_dict("records"):
            session.add(VerdictRow(
                service="churn", model_version="v2", window_start=f["window_start"].to_pydatetime(),
                window_end=f["window_end"].to_pydatetime(), verdict="slower", estimated=False, rows=int(f["n"]),
                evidence=[{"check": "cache_hit_rate", "labels": {}, "value": f["value"], "baseline": f["baseline"],
                           "n": int(f["n"]), "interval_low": f["interval_low"], "interval_high": f["interval_high"],
                           "status": f["status"]}],
                attribution={"quantile": "p95", "stages": {"model": 1.0}, "signals": []},
                what_changed=[{"kind": "model_version", "value": "v2", "first_seen": truth.onset,
                               "text": f"model_version v2 first seen {truth.onset}"}],
                next_steps=["cache: hit rate and cache key"], rollback_to="v1", summary="slower: cache misses",
                incident_id=incident.id, created_at=end, updated_at=end))
        return incident.id


def test_query_verdicts_incidents_and_explain(filled, scenario_run):
    truth = scenario_run["truth"]
    incident_id = add_incident(filled, truth)
    verdicts = q.verdicts(filled, "churn", incident_id=incident_id)
    assert len(verdicts) == 4 and set(verdicts["verdict"]) == {"slower"}
    records = q.verdict_records(verdicts)
    assert set(records[0]) >= {"verdict", "window_start", "window_end", "model_version", "evidence"}
    assert records[0]["evidence"][0]["check"] == "cache_hit_rate" and records[0]["window_start"].endswith("Z")
    assert q.verdicts(filled, "churn", verdict="worse").empty
    incidents = q.incidents(filled, "churn", status="resolved")
    assert incidents["id"].tolist() == [incident_id]

    result = explain(filled, "churn", incident_id)
    assert result.verdict == "slower" and result.verdicts == {"slower": 4}
    assert result.summary == "slower: cache misses"  # the verdicts' own line
    assert result.evidence[0]["check"] == "cache_hit_rate" and result.evidence[0]["windows"] == 4
    assert result.named["stage"] == "model"  # the verdict's attribution
    assert "cache_hit" in result.named["fields"] and result.named["versions"] == ["v2"] or \
        "v2" in " ".join(result.named["changed"])
    kinds = {c["kind"] for c in result.what_changed}
    assert {"model_version", "cache"} <= kinds
    stages = {r["stage"]: r for r in result.stages}
    during = history.metrics(filled, "churn", since=result.window[0], until=result.window[1], model_version="v2",
                       group_by=())
    assert stages["batch_wait"]["p95_during"] == pytest.approx(during["batch_wait_p95_ms"].iloc[0])
    assert result.requests[1] == during["requests"].iloc[0] and "(requests)" not in stages
    assert any("--candidate v2" in line and "--baseline v1" in line for line in result.next_queries)
    assert any(line.startswith("tailwatch report") for line in result.next_queries)
    with pytest.raises(q.QueryError, match="no incident"):
        explain(filled, "churn", incident_id + 100)


@pytest.fixture(scope="module")
def cli_config(scenario_run, tmp_path_factory):
    """A config like the scenario's, on a copy of its database that also holds an incident and verdicts."""
    from storage.store import Store

    work = tmp_path_factory.mktemp("cli")
    shutil.copy(scenario_run["db"], work / "tailwatch.db")
    raw = yaml.safe_load((scenario_run["root"] / "tailwatch.yaml").read_text())
    raw["storage"]["url"] = f"sqlite:///{work / 'tailwatch.db'}"
    for kind in ("predictions", "timings"):
        raw["services"][0]["sources"][kind]["path"] = str(scenario_run["root"] / "logs" / kind)
    raw["services"][0]["reference"]["path"] = str(scenario_run["root"] / "generated" / "reference.parquet")
    raw["ui"] = {"external_url": "https://tailwatch.example.org/ui/"}  # where a saved report's links point
    (work / "tailwatch.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    store = Store(raw["storage"]["url"])
    try:
        incident_id = add_incident(store, scenario_run["truth"])
    finally:
        store.dispose()
    return str(work / "tailwatch.yaml"), incident_id, work


def cli(config, *args):
    return CliRunner().invoke(app, ["--config", config, *args], catch_exceptions=False,
                              env={"COLUMNS": "200", "NO_COLOR": "1"})


def test_cli_query_json_shapes(cli_config):
    config, incident_id, _ = cli_config
    res = cli(config, "query", "findings", "--status", "breach", "--segment", "all", "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert rows and all(set(r) >= {"check", "status", "window_start", "window_end", "model_version", "labels",
                                   "value", "baseline", "n", "interval"} for r in rows)
    assert all(r["status"] == "breach" for r in rows)
    assert {r["check"] for r in rows} >= {"cache_hit_rate"}
    res = cli(config, "query", "verdicts", "--format", "json", "--incident", str(incident_id))
    verdicts = json.loads(res.stdout)
    assert len(verdicts) == 4 and set(verdicts[0]) >= {"verdict", "window_start", "window_end", "model_version",
                                                        "evidence"}
    res = cli(config, "query", "findings", "--label", "stage=batch_wait", "--label", "quantile=p99",
              "--format", "csv")
    frame = pd.read_csv(pd.io.common.StringIO(res.stdout))
    assert len(frame) and frame["labels"].str.contains('"stage": "batch_wait"').all()
    res = cli(config, "query", "metrics", "--since", "2026-11-02T00:00:00Z", "--until", "2026-11-02T02:00:00Z",
              "--every", "1h", "--format", "json")
    metrics = json.loads(res.stdout)
    assert [(m["model_version"], m["period_start"]) for m in metrics] == [("v1", "2026-11-02T00:00:00Z"),
                                                                          ("v2", "2026-11-02T01:00:00Z")]
    for command in (["ticks"], ["quarantine", "--group-by", "reason"], ["incidents"]):
        res = cli(config, "query", *command, "--format", "json")
        assert res.exit_code == 0 and json.loads(res.stdout), (command, res.output)


def test_cli_sql_refuses_writes(cli_config):
    config, _, _ = cli_config
    res = cli(config, "query", "sql", "SELECT count(*) AS n FROM ticks", "--format", "json")
    assert json.loads(res.stdout) == [{"n": 9}]
    for statement in ("DELETE FROM ticks", "SELECT 1; DELETE FROM ticks", "DROP TABLE ticks"):
        res = cli(config, "query", "sql", statement)
        assert res.exit_code == 2 and "error" in res.output
    res = cli(config, "query", "sql", "SELECT count(*) AS n FROM ticks", "--format", "json")
    assert json.loads(res.stdout) == [{"n": 9}]


def test_cli_logs_compare_explain_report(cli_config):
    config, incident_id, work = cli_config
    res = cli(config, "query", "logs", "--since", "2026-11-02T01:00:00Z", "--until", "2026-11-02T01:30:00Z",
              "--stage", "batch_wait", "--min-ms", "10", "--top", "5", "--format", "json")
    body = json.loads(res.stdout)
    assert len(body["requests"]) == 5 and body["matched"] >= 5
    assert [r["batch_wait_ms"] for r in body["requests"]] == sorted((r["batch_wait_ms"] for r in body["requests"]),
                                                                    reverse=True)
    res = cli(config, "compare", "--baseline", "v1", "--candidate", "v2", "--since", "2026-11-02T00:00:00Z",
              "--until", "2026-11-02T02:00:00Z", "--format", "json")
    assert res.exit_code == 1  # cache_hit_rate >= 0.2 fails for v2
    body = json.loads(res.stdout)
    assert body["passed"] is False
    assert {c["metric"]: c["status"] for c in body["constraints"]}["cache_hit_rate"] == "fail"
    res = cli(config, "compare", "--baseline", "v1", "--candidate", "v2", "--since", "2026-11-02T00:00:00Z",
              "--until", "2026-11-02T02:00:00Z")
    assert "hard constraints" in res.stdout and "fails a constraint" in res.stdout
    res = cli(config, "explain", str(incident_id))
    assert res.exit_code == 0 and "evidence, strongest first" in res.stdout and "tailwatch query logs" in res.stdout
    res = cli(config, "explain", str(incident_id), "--format", "json")
    assert json.loads(res.stdout)["verdict"] == "slower"
    out = work / "report.html"
    res = cli(config, "report", "--incident", str(incident_id), "-o", str(out), "--no-evidently")
    assert res.exit_code == 0, res.output
    html = out.read_text()
    # The incident page, its links to the served UI (ui.external_url): the slowest requests, as in the UI.
    assert f"Incident #{incident_id} · churn" in html and 'id="timeline-json"' in html
    assert f'href="https://tailwatch.example.org/ui/incidents/{incident_id}/requests?stage=' in html
    res = cli(config, "report", "--incident", str(incident_id), "--since", "2h", "-o", str(out))
    assert res.exit_code == 2 and "--incident" in res.output


def narrow(config, *args):
    """The command as an 80-column terminal shows it."""
    return CliRunner().invoke(app, ["--config", config, *args], catch_exceptions=False,
                              env={"COLUMNS": "80", "NO_COLOR": "1"})


def test_tables_fit_80_columns_without_cutting_what_is_copied(cli_config):
    config, _, _ = cli_config
    rows = json.loads(cli(config, "query", "quarantine", "--format", "json").stdout)
    shown = narrow(config, "query", "quarantine")
    assert rows and shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    for row in rows:  # each line as written, whole on one line of its own after the table
        assert f"{row['id']}: {row['line'] or ''}".rstrip() in lines or row["line"] is None, row
        assert row["reason"] in shown.stdout
    body = [line for line in lines if line.startswith("│")]
    assert body and all(len(line) <= 80 for line in body)
    # no column squeezed to a letter or two a line: every header whole, every text column 8 wide at least
    header = next(line for line in lines if line.startswith("┃"))
    assert all(name in header for name in ("id", "created_at", "reason", "field", "source")), header
    assert min(len(part) for part in header.strip("┃").split("┃")) >= 4, header


def test_findings_at_80_columns_name_each_window_length_and_keep_each_label_whole(cli_config):
    config, _, _ = cli_config
    span = ("--since", "2026-11-02T00:00:00Z", "--until", "2026-11-02T02:00:00Z", "--check", "latency")
    rows = json.loads(cli(config, "query", "findings", *span, "--format", "json").stdout)
    shown = narrow(config, "query", "findings", *span)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    header = [h.strip() for h in next(line for line in lines if line.startswith("┃")).strip("┃").split("┃")]
    assert header[:4] == ["window_start", "window", "check", "labels"]
    cells = [[c.strip() for c in line.strip("│").split("│")] for line in lines if line.startswith("│")]
    lengths = {pd.Timestamp(r["window_end"]) - pd.Timestamp(r["window_start"]) for r in rows}
    assert len(lengths) > 1  # windows of several lengths start at the same times
    assert {c[1] for c in cells if c[1]} == {f"{int(d.total_seconds() // 60)}m" if d < pd.Timedelta("1h")
                                             else f"{int(d.total_seconds() // 3600)}h" for d in lengths}
    # A label folds between labels, never inside one: every k=v on one line.
    text = " ".join(c[3] for c in cells)
    for r in rows:
        for key, value in r["labels"].items():
            assert f"{key}={value}" in text, (key, value)


def test_incidents_table_says_what_each_is_below_it(cli_config):
    config, incident_id, _ = cli_config
    shown = narrow(config, "query", "incidents", "--since", "2026-11-01T00:00:00Z")
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert "why, by id:" in lines and f"{incident_id}: slower" in lines  # no alert summary stored: the verdict


def test_metrics_at_80_columns_keep_the_p95_latency(cli_config):
    config, _, _ = cli_config
    shown = narrow(config, "query", "metrics", "--since", "2026-11-02T00:00:00Z", "--until", "2026-11-02T02:00:00Z",
                   "--every", "1h")
    assert shown.exit_code == 0, shown.output
    header = [h.strip() for h in next(line for line in shown.stdout.splitlines()
                                      if line.startswith("┃")).strip("┃").split("┃")]
    assert header[:4] == ["period_start", "model_version", "requests", "total_p95_ms"]


def test_explain_fits_80_columns_stage_names_and_commands_whole(cli_config):
    config, incident_id, _ = cli_config
    result = json.loads(cli(config, "explain", str(incident_id), "--format", "json").stdout)
    shown = narrow(config, "explain", str(incident_id))
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    # No table line past the terminal or cropped at its edge: each ends in its table's border.
    assert all(len(line) <= 80 and line.rstrip()[-1] in "┓┃┩│┘" for line in lines if line[:1] in "┏┃┡│└")
    # Every stage named in its own cell, the p95 figures beside it; what did not fit is named.
    at = next(i for i, line in enumerate(lines) if line.startswith("┃") and "p95_before" in line)
    assert [h.strip() for h in lines[at].strip("┃").split("┃")][:3] == ["stage", "p95_before", "p95_during"]
    end = next(i for i in range(at, len(lines)) if lines[i].startswith("└"))
    rows = [line.split("│")[1].strip() for line in lines[at + 2:end]]
    assert rows == [r["stage"] for r in result["stages"]] and "(requests)" not in shown.stdout
    assert "--format json has every column" in shown.stdout
    before, during = result["requests"]
    assert f"({before:,} requests)" in shown.stdout and f"({during:,} requests)" in " ".join(lines)
    # Each next query on one line, as it is copied.
    for query in result["next_queries"]:
        assert f"  $ {query}" in lines, query


def test_compare_shows_difference_and_ratio_with_units(cli_config):
    config, _, _ = cli_config
    span = ("--since", "2026-11-02T00:00:00Z", "--until", "2026-11-02T02:00:00Z")
    body = json.loads(cli(config, "compare", "--baseline", "v1", "--candidate", "v2", *span, "-f", "json").stdout)
    metrics = {m["metric"]: m for m in body["metrics"]}
    assert metrics["total_p99_ms"]["unit"] == "ms" and metrics["cache_hit_rate"]["unit"] == "share"
    requests = metrics["requests"]
    assert requests["difference"] == requests["candidate"] - requests["baseline"]
    assert requests["ratio"] == pytest.approx(requests["candidate"] / requests["baseline"])
    shown = narrow(config, "compare", "--baseline", "v1", "--candidate", "v2", *span).stdout
    header = next(line for line in shown.splitlines() if "difference" in line)
    assert "ratio" in header and "…" not in shown and "change" not in shown and "e+0" not in shown
    assert f"{int(requests['baseline']):,}" in shown and int(requests["baseline"]) >= 1000  # thousands separators
    rate = metrics["cache_hit_rate"]
    assert f"{rate['baseline']:.2%}" in shown and f"{rate['difference'] * 100:+.2f} pp" in shown
    p99 = next(line for line in shown.splitlines() if "total_p99_ms" in line)
    assert "│ ms " in p99 and f"{metrics['total_p99_ms']['baseline']:.4g}" in p99


def test_unknown_version_lists_the_stored_ones(cli_config):
    config, _, _ = cli_config
    for args, option in ((["query", "metrics", "--version", "v9"], "--version"),
                         (["query", "findings", "--version", "v9"], "--version"),
                         (["query", "logs", "--since", "2026-11-02T00:00:00Z", "--until", "2026-11-02T02:00:00Z",
                           "--version", "v9"], "--version"),
                         (["compare", "--baseline", "v1", "--candidate", "v9"], "--candidate"),
                         (["compare", "--baseline", "v0", "--candidate", "v2"], "--baseline")):
        res = cli(config, *args)
        assert res.exit_code == 2 and option in res.output and "v1, v2" in res.output, (args, res.output)


def test_query_logs_names_the_valid_statuses_and_an_absent_version_is_an_empty_answer(cli_config):
    config, _, _ = cli_config
    span = ("--since", "2026-11-02T00:00:00Z", "--until", "2026-11-02T02:00:00Z")
    res = cli(config, "query", "logs", *span, "--status", "boom")
    assert res.exit_code == 2 and "--status" in res.output and "ok, timeout, rejected, error" in res.output
    # v1 is stored: where no request of it matches, the answer is that nothing matched, not an error.
    late = ("--since", "2026-11-02T07:00:00Z", "--until", "2026-11-02T08:00:00Z")
    res = cli(config, "query", "logs", *late, "--version", "v1", "--format", "json")
    assert res.exit_code == 0 and json.loads(res.stdout)["matched"] == 0, res.output


def test_metric_periods_are_on_the_hour_whatever_since_is(cli_config):
    config, _, _ = cli_config
    res = cli(config, "query", "metrics", "--since", "2026-11-02T00:18:17.234Z", "--until", "2026-11-02T02:00:00Z",
              "--every", "1h", "--group-by", "", "--format", "json")
    starts = [m["period_start"] for m in json.loads(res.stdout)]
    assert starts == ["2026-11-02T00:00:00Z", "2026-11-02T01:00:00Z"], res.output


def test_tables_sort_by_severity_then_time_and_keep_empty_sql_columns(cli_config):
    config, _, _ = cli_config
    shown = narrow(config, "query", "findings", "--segment", "all", "--check", "cache_hit_rate").stdout
    statuses = [word for line in shown.splitlines() for word in ("breach", "ok") if f" {word} " in line]
    assert "breach" in statuses and "ok" in statuses
    assert statuses == sorted(statuses, key=lambda s: s != "breach")  # every breach before every ok
    times = [line.split("│")[1].strip() for line in shown.splitlines() if " breach " in line]
    assert times == sorted(times)
    sql = narrow(config, "query", "sql", "SELECT id, now, NULL AS unset FROM ticks ORDER BY id LIMIT 3").stdout
    assert "unset" in sql and "2026-11-02" in sql
