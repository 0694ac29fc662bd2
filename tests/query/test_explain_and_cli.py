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
    assert stages["(requests)"]["p50_during"] == during["requests"].iloc[0]
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
    assert 'alt="Latency per stage"' in out.read_text() and "incident" in out.read_text()
