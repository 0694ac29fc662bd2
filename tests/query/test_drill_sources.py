"""Only drill-downs that run: `query logs` reads the sources a service is configured with (a PostgreSQL
table, OTLP-JSON span files, files of rows), "what they share" shows a lift without `--min-ms` (the slowest
5% of the range by default), and every command `explain` suggests for an incident runs on them.

The incident is the `slower-cache` scenario's (v2's cache key misses, the model stage slows); its raw rows
are put in a real PostgreSQL database and its stage timings in OTLP spans, the shapes the ticked files lack."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
from datetime import timedelta

import pandas as pd
import pytest
import sqlalchemy as sa
import yaml
from test_explain_and_cli import add_incident
from typer.testing import CliRunner

from monitor import config as config_mod
from monitor.cli import app
from monitor.demo import demo_config
from monitor.investigate.logs import drill
from storage.store import Store

PG_URL = os.environ.get("TAILWATCH_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="module")
def raw_logs(scenario_run, tmp_path_factory):
    """The scenario's rows again (same seed: the same requests), with its stage timings as OTLP spans too."""
    from monitor.simulate import generate

    root = tmp_path_factory.mktemp("raw")
    truth = scenario_run["truth"]
    generate("slower-cache", root, seed=truth.seed, hours=truth.params["hours"],
             onset_hours=truth.params["onset_hours"], otlp=True)
    preds = pd.read_json(root / "predictions" / "part-00000.jsonl", lines=True, dtype=False, convert_dates=False)
    timings = pd.read_json(root / "timings" / "part-00000.jsonl", lines=True, dtype=False, convert_dates=False)
    assert len(preds) == scenario_run["truth"].counts["predictions"]
    return root, preds, timings


@pytest.fixture(scope="module")
def postgres(pg_unreachable, raw_logs):
    """A schema of the real PostgreSQL holding the predictions and timings tables (a `seq` cursor each)."""
    if pg_unreachable:
        if os.environ.get("CI") == "true":
            pytest.fail(pg_unreachable)
        pytest.skip(pg_unreachable)
    _, preds, timings = raw_logs
    schema = f"tw_{secrets.token_hex(6)}"
    engine = sa.create_engine(PG_URL)
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        for name, frame in (("predictions", preds), ("timings", timings)):
            frame = frame.assign(seq=range(len(frame)))
            frame.head(0).to_sql(name, conn, schema=schema, index=False)
            columns = ", ".join(f'"{c}"' for c in frame.columns)
            with conn.connection.driver_connection.cursor() as cur, \
                    cur.copy(f'COPY "{schema}"."{name}" ({columns}) FROM STDIN') as copy:
                for row in frame.astype(object).where(frame.notna(), None).itertuples(index=False):
                    copy.write_row(row)
    try:
        yield schema
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


def _sql(schema: str, table: str) -> dict:
    return {"kind": "sql", "url": PG_URL, "table": f"{schema}.{table}", "cursor_column": "seq"}


SOURCES = {
    "predictions in PostgreSQL, timings as OTLP spans": lambda root, schema: {
        "predictions": _sql(schema, "predictions"),
        "timings": {"kind": "files", "path": str(root / "spans"), "format": "otlp"}},
    "predictions in files, timings in PostgreSQL": lambda root, schema: {
        "predictions": {"kind": "files", "path": str(root / "predictions")},
        "timings": _sql(schema, "timings")},
}


@pytest.fixture(params=list(SOURCES), scope="module")
def configured(request, scenario_run, raw_logs, postgres, tmp_path_factory):
    """A config reading the raw rows from `SOURCES[param]`, over a copy of the ticked store."""
    root, _, _ = raw_logs
    work = tmp_path_factory.mktemp("configured")
    shutil.copy(scenario_run["db"], work / "tailwatch.db")
    store = Store(f"sqlite:///{work / 'tailwatch.db'}")
    try:
        add_incident(store, scenario_run["truth"])  # as the alert stage opens it (test_explain_and_cli)
    finally:
        store.dispose()
    raw = demo_config(work)
    raw["services"][0]["sources"] = SOURCES[request.param](root, postgres)
    raw["services"][0]["reference"] = {"path": str(root / "reference.parquet")}
    (work / "tailwatch.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return work, config_mod.load(work / "tailwatch.yaml")


def _cli(work, *args):
    return CliRunner().invoke(app, ["--config", str(work / "tailwatch.yaml"), *args],
                              env={"COLUMNS": "200", "NO_COLOR": "1"})


def test_query_logs_reads_each_source_kind_and_what_they_share_shows_a_lift(configured, raw_logs, scenario_run):
    work, cfg = configured
    _, preds, timings = raw_logs
    truth = scenario_run["truth"]
    since = pd.Timestamp(truth.start).to_pydatetime()
    until = since + timedelta(hours=truth.params["hours"])
    res = _cli(work, "query", "logs", "--since", since.isoformat(), "--until", until.isoformat(),
               "--stage", "model", "--format", "json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    # The expected answer, from the generated rows with pandas: the slowest 5% of the model stage.
    model = timings[timings["stage"] == "model"].drop_duplicates(["request_id", "stage"])
    rows = preds.merge(model, on="request_id")
    floor = rows["duration_ms"].quantile(0.95)
    slow = rows[rows["duration_ms"] >= floor].sort_values(["duration_ms", "request_id"], ascending=[False, True])
    assert got["slowest"] == 0.05 and got["min_ms"] == pytest.approx(floor)
    assert got["scanned"] == len(preds) and got["matched"] == len(slow)
    assert [r["request_id"] for r in got["requests"]] == slow["request_id"].head(20).tolist()
    # What they share, without any --min-ms: each value's share of the slowest over its share of all.
    lifts = {(a["dimension"], str(a["value"])): a["lift"] for a in got["aggregates"]}
    for dim in ("model_version", "replica"):
        expected = slow[dim].astype(str).value_counts(normalize=True) / rows[dim].astype(str).value_counts(
            normalize=True)
        assert {v: lifts[(dim, v)] for v in expected.index} == pytest.approx(expected.to_dict())
    assert lifts[("model_version", "v2")] > 1.05 and lifts[("model_version", "v1")] < 0.95
    if cfg.services[0].sources.timings.kind == "sql":  # (the span files are the slow read: once is enough)
        shown = _cli(work, "query", "logs", "--since", since.isoformat(), "--until", until.isoformat(),
                     "--stage", "model")
        assert shown.exit_code == 0 and "(the slowest 5%" in " ".join(shown.stdout.split()), shown.output
    # By total latency: the slowest 5% are the timeouts and cache misses, hardly ever a hit.
    total = json.loads(_cli(work, "query", "logs", "--since", since.isoformat(), "--until", until.isoformat(),
                            "--format", "json").stdout)
    lifts = {(a["dimension"], str(a["value"])): a["lift"] for a in total["aggregates"]}
    assert lifts[("status", "timeout")] > 5 and lifts[("cache_hit", "True")] < 0.2, lifts
    # --slowest 100 is every request: each share is its share of all, a lift of 1.
    every = drill(cfg.services[0], cfg.limits, since=since, until=until, stage="model", top=5)
    assert every.matched == len(rows) and every.aggregates["lift"].dropna().eq(1).all()


def test_every_command_explain_suggests_runs_on_these_sources(configured, scenario_run, monkeypatch):
    work, _ = configured
    monkeypatch.chdir(work)  # `report -o` writes beside the config
    since = pd.Timestamp(scenario_run["truth"].start) - timedelta(days=1)
    incidents = json.loads(_cli(work, "query", "incidents", "--since", since.isoformat(), "--format", "json").stdout)
    assert len(incidents) == 1
    for incident in incidents:
        res = _cli(work, "explain", str(incident["id"]), "--format", "json")
        assert res.exit_code == 0, res.output
        queries = json.loads(res.stdout)["next_queries"]
        assert any(q.startswith("tailwatch query logs") for q in queries), queries
        for query in queries:
            args = shlex.split(query)
            assert args[0] == "tailwatch"
            ran = _cli(work, *args[1:])
            assert ran.exit_code == 0, (query, ran.output[-2000:])


# (what the incident's rows carried, the drill-down line explain suggests, the UI's drill-down links)
MEASURED = [
    (["total", "model"], "model", "--stage model --min-ms 12 --top 20",
     ["slowest requests in stage model during the incident", "slowest requests by total latency"]),
    (["total"], None, "--top 20", ["slowest requests during the incident"]),
    (["model", "preprocess"], None, "--stage model --top 20", ["slowest requests in stage model during the incident"]),
    ([], None, None, []),
]


@pytest.mark.parametrize(("measured", "stage", "logs", "links"), MEASURED)
def test_drill_downs_are_offered_only_by_what_the_rows_carry(measured, stage, logs, links):
    from datetime import UTC, datetime

    from monitor.investigate.next_steps import next_queries
    from monitor.ui.views import next_links

    at = datetime(2026, 11, 2, 1, tzinfo=UTC)
    named = {"stage": stage, "measured": measured}
    stages = [{"stage": "model", "p95_during": 12.0}]
    queries = next_queries("churn", 1, "v2", at, at + timedelta(hours=1), named, stages, pd.DataFrame(), "v1",
                           timedelta(hours=2))
    drills = [q for q in queries if q.startswith("tailwatch query logs")]
    assert drills == ([f"tailwatch query logs -s churn --since 2026-11-02T01:00Z --until 2026-11-02T02:00Z {logs}"]
                      if logs else [])
    shown = [link["text"] for link in next_links("churn", 1, "v2", at, at + timedelta(hours=1), named)
             if "/requests" in link["href"]]
    assert shown == links
