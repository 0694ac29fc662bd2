"""Queries, `explain`, `compare` and `report` over history that retention has compacted in part: buckets of
5 minutes beside hourly ones read together, with the same counts, histograms and sketch bins as before."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from monitor.aggregate.fold import fold
from monitor.aggregate.partial import merge_bytes
from monitor.aggregate.profile import build_profile
from monitor.cli import app
from monitor.daemon import retention
from monitor.investigate import history
from monitor.investigate.explain import explain
from monitor.schema import Schema
from storage.models import Incident, VerdictRow
from storage.store import Store

DAY0 = datetime(2026, 11, 2, tzinfo=UTC)
DAYS = 3
BOUNDARY = DAY0 + timedelta(days=1, hours=12)  # compacted to hourly buckets before this
ONSET, END = DAY0 + timedelta(days=1, hours=9), DAY0 + timedelta(days=1, hours=15)  # the incident spans it
SCHEMA = Schema(features={"x": "numeric"}, segments=["region"])
PROFILE = build_profile(pd.DataFrame({"x": np.linspace(-3, 3, 200)}), SCHEMA)


def _frame(seed: int = 5) -> pd.DataFrame:
    """Three days at one request a minute: v1, then v2 from ONSET with a model stage three times slower."""
    rng = np.random.default_rng(seed)
    ts = pd.date_range(DAY0, DAY0 + timedelta(days=DAYS), freq="1min", inclusive="left", tz="UTC")
    ts = ts + pd.to_timedelta(rng.uniform(0, 59, len(ts)), unit="s")
    slow = ts >= ONSET
    model = rng.gamma(4, 5, len(ts)) * np.where(slow, 3.0, 1.0)
    parse = rng.gamma(2, 1, len(ts))
    return pd.DataFrame({
        "request_id": [f"r{i:06d}" for i in range(len(ts))], "ts": ts,
        "model_version": np.where(slow, "v2", "v1"),
        "status": rng.choice(["ok", "ok", "ok", "ok", "ok", "ok", "ok", "ok", "ok", "timeout"], len(ts)),
        "x": rng.normal(0, 1, len(ts)), "region": rng.choice(["eu", "us"], len(ts)),
        "stage.model": model, "stage.parse": parse, "latency_ms": model + parse,
        "joined": True, "stage_rows": 2,
    })


def _fill(store: Store) -> int:
    """Store the frame's 5-minute partials and an incident (slower, v2) from ONSET to END; its id."""
    rows = fold(_frame(), timedelta(minutes=5), SCHEMA.segments, timed=True, schema=SCHEMA, profile=PROFILE)
    with store.transaction() as session:
        store.partials.upsert(session, "svc", rows, merge_bytes)
        incident = Incident(service="svc", model_version="v2", verdict="slower", status="resolved",
                            opened_at=ONSET + timedelta(minutes=15), resolved_at=END, first_window_start=ONSET,
                            last_window_end=END, fingerprint="fp", summary={"text": "model stage"}, updated_at=END)
        session.add(incident)
        session.flush()
        for hour in range(int((END - ONSET) / timedelta(hours=1))):
            start = ONSET + timedelta(hours=hour)
            session.add(VerdictRow(service="svc", model_version="v2", window_start=start,
                                   window_end=start + timedelta(hours=1), verdict="slower", estimated=False,
                                   rows=60, evidence=[], attribution={"stages": {"model": 1.0}}, what_changed=[],
                                   next_steps=[], rollback_to="v1", summary="slower: model stage",
                                   incident_id=incident.id, created_at=END, updated_at=END))
        return incident.id


def _sizes(store: Store) -> set[int]:
    with store.transaction() as session:
        return {r.bucket_seconds for r in store.partials.load(session, "svc", DAY0, DAY0 + timedelta(days=DAYS))}


def _merged(store: Store, since: datetime, until: datetime, **kw) -> dict:
    """The merged partials as comparable values: counts, histograms and sketch bins exact."""
    return {tuple(sorted((k, str(v)) for k, v in key.items() if k != "period_end")):
            (dict(p.counts), p.hists, {k: (s.count, s.zero, s.pos, s.neg) for k, s in p.sketches.items()})
            for key, p in history.merged_partials(store, "svc", since=since, until=until, **kw)}


def test_explain_and_metrics_across_the_compaction_boundary(store):
    incident_id = _fill(store)
    whole = dict(since=DAY0, until=DAY0 + timedelta(days=DAYS))
    metrics_before = history.metrics(store, "svc", **whole)
    hourly_before = history.metrics(store, "svc", **whole, every=timedelta(hours=1))
    merged_before = _merged(store, ONSET, END, model_version="v2", group_by=(), segment=None)
    explained_before = explain(store, "svc", incident_id)

    removed, written = retention.compact(store, BOUNDARY, timedelta(hours=1))  # what the nightly run does
    assert removed > written > 0 and _sizes(store) == {300, 3600}

    explained = explain(store, "svc", incident_id)
    assert explained.stages == explained_before.stages and explained.named == explained_before.named
    assert {r["stage"] for r in explained.stages} >= {"model", "parse"}
    assert _merged(store, ONSET, END, model_version="v2", group_by=(), segment=None) == merged_before
    cols = [c for c in metrics_before.columns if c != "period_end"]
    pd.testing.assert_frame_equal(history.metrics(store, "svc", **whole)[cols], metrics_before[cols])
    pd.testing.assert_frame_equal(history.metrics(store, "svc", **whole, every=timedelta(hours=1))[cols],
                                  hourly_before[cols])

    # Periods finer than the compacted buckets: an hour each where compacted, 15 minutes after.
    fine = history.metrics(store, "svc", **whole, every=timedelta(minutes=15))
    length = fine["period_end"] - fine["period_start"]
    compacted = fine["period_start"] < pd.Timestamp(BOUNDARY)
    assert (length[compacted] == timedelta(hours=1)).all() and (length[~compacted] == timedelta(minutes=15)).all()
    assert fine["requests"].sum() == metrics_before["requests"].sum()
    per_hour = fine.assign(hour=fine["period_start"].dt.floor("1h")).groupby(["hour", "model_version"])["requests"]
    assert per_hour.sum().tolist() == hourly_before["requests"].tolist()
    # A period that is not a multiple of the hour: every 90 minutes, still each row once.
    odd = history.metrics(store, "svc", **whole, every=timedelta(minutes=90))
    assert odd["requests"].sum() == metrics_before["requests"].sum()
    assert (odd["period_end"] > odd["period_start"]).all()
    starts = sorted(set(odd["period_start"]))
    ends = {s: e for s, e in zip(odd["period_start"], odd["period_end"], strict=True)}
    assert all(ends[a] <= b for a, b in zip(starts, starts[1:], strict=False))  # periods never overlap


def test_cli_query_metrics_compare_and_report_after_compaction(tmp_path):
    db = tmp_path / "tw.db"
    for kind in ("predictions", "timings"):
        (tmp_path / "logs" / kind).mkdir(parents=True)
    config = tmp_path / "tailwatch.yaml"
    config.write_text(yaml.safe_dump({
        "storage": {"url": f"sqlite:///{db}"},
        "services": [{"name": "svc", "sources": {"predictions": {"kind": "files", "path": str(tmp_path / "logs/predictions")},
                                                 "timings": {"kind": "files", "path": str(tmp_path / "logs/timings")}},
                      "schema": {"features": {"x": "numeric"}, "segments": ["region"]}}]}))
    store = Store(f"sqlite:///{db}")
    try:
        store.upgrade()
        incident_id = _fill(store)
        hours_before = history.metrics(store, "svc", since=DAY0, until=DAY0 + timedelta(days=DAYS),
                                 every=timedelta(hours=1))
        retention.compact(store, BOUNDARY, timedelta(hours=1))
    finally:
        store.dispose()

    def cli(*args):
        return CliRunner().invoke(app, ["--config", str(config), *args], catch_exceptions=False,
                                  env={"COLUMNS": "200", "NO_COLOR": "1"})

    res = cli("query", "metrics", "--since", f"{DAY0:%Y-%m-%dT%H:%M:%SZ}", "--until",
              f"{DAY0 + timedelta(days=DAYS):%Y-%m-%dT%H:%M:%SZ}", "--every", "1h", "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["requests"] for r in rows] == hours_before["requests"].tolist()
    res = cli("explain", str(incident_id), "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["named"]["stage"] == "model"
    # v1 served 33 hours, v2 39: 5-minute buckets and hourly ones counted at their own length.
    res = cli("compare", "--baseline", "v1", "--candidate", "v2", "--since", f"{DAY0:%Y-%m-%dT%H:%M:%SZ}",
              "--until", f"{DAY0 + timedelta(days=DAYS):%Y-%m-%dT%H:%M:%SZ}", "--format", "json")
    assert res.exit_code == 0, res.output
    table = {r["metric"]: r for r in json.loads(res.stdout)["metrics"]}
    assert table["serving_hours"]["baseline"] == pytest.approx(33) and table["serving_hours"]["candidate"] == \
        pytest.approx(39)
    out = tmp_path / "report.html"
    res = cli("report", "--incident", str(incident_id), "-o", str(out), "--no-evidently")
    assert res.exit_code == 0, res.output
    html = out.read_text()
    # The incident page's charts, drawn from the hourly buckets before BOUNDARY and the 5-minute ones after.
    found = re.search(r'<script type="application/json" id="timeline-json">(.*?)</script>', html, flags=re.S)
    total = next(t for t in json.loads(found.group(1))["data"] if t["name"] == "total")
    drawn = [pd.Timestamp(x) for x, y in zip(total["x"], total["y"], strict=True) if y is not None]
    assert min(drawn) < BOUNDARY - timedelta(hours=1) and max(drawn) > BOUNDARY + timedelta(hours=1)
    assert 'id="failures-json"' in html and 'id="stages-json"' in html
