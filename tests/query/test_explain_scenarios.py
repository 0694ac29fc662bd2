"""`explain` on every incident scenario: simulate two hours (onset at one), replay and tick every 15 min,
run the alert stage after each tick (verdicts and incidents), release the labels (they land up to four days
later), tick and run `nightly` then (quality per hour, per class and group, acceptance rules), then explain
the incident and check that it names what the ground truth says is affected: the stage, the field, the
segment or class, or the version.

When the alert stage opened no incident for the scenario's version (its verdicts stayed below alerting),
the test asks about the span an engineer would: an incident row from the onset to the end of the run,
carrying the stored verdict of that span. Seven runs, two at a time: 70-110 s on two cores.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest
import yaml

from monitor.config import expression_columns
from monitor.simulate import SCENARIOS

pytestmark = pytest.mark.slow

HOURS, ONSET_HOURS, SEED = 2.0, 1.0, 7
LABELS_AFTER = timedelta(days=4)  # the simulator's last labels land within 96 h of the run's end
GROUPS = {"short_tenure": "tenure < 12", "month_to_month": "Contract == 'Month-to-month'"}
# worse-preprocessing drops short-tenure recall by ~0.15 from a reference figure of ~200 positives: beyond
# 0.05 once both uncertainties count, not clearly beyond 0.10.
RULES = [{"name": "churn recall", "metric": "recall", "class": "Yes", "max_drop": 0.1},
         {"name": "group recall", "metric": "recall", "class": "Yes", "group": "*", "max_drop": 0.05}]


def truth_names(truth) -> set[str]:
    """What the ground truth says is affected, as the words explain may use."""
    a = truth.affected
    names = set()
    for key in ("stage", "field", "category"):
        if isinstance(a.get(key), str):
            names.add(a[key])
    names |= set(a.get("fields", [])) | set(a.get("versions", []))
    seg = a.get("segment")
    if isinstance(seg, dict):
        names.add(seg["field"])
    return names


def explained_names(named: dict) -> set[str]:
    out = {named["stage"]} if named.get("stage") else set()
    for key in ("cache_path", "fields", "classes", "groups", "signals", "outputs", "versions"):
        out |= set(named.get(key) or [])
    for seg in named.get("segments") or []:
        field, _, value = seg.partition("=")
        out |= {field, value}
    for expression in (named.get("group_definitions") or {}).values():
        out |= expression_columns(expression)  # a quality group names the fields it is defined on
    return out


def run(scenario: str, work: str) -> dict:
    from rich.console import Console

    from monitor import config as config_mod
    from monitor.alerts.evaluate import after_tick
    from monitor.daemon.nightly import run_nightly
    from monitor.daemon.runner import tick
    from monitor.demo import demo_config, replay
    from monitor.investigate import query
    from monitor.investigate.explain import explain, render
    from monitor.simulate import generate
    from storage.models import Incident
    from storage.store import Store

    root = Path(work)
    truth = generate(scenario, root / "generated", seed=SEED, hours=HOURS, onset_hours=ONSET_HOURS, otlp=False)
    for kind in ("predictions", "timings"):
        (root / "logs" / kind).mkdir(parents=True, exist_ok=True)
    raw = demo_config(root)
    svc = raw["services"][0]
    svc["buckets"]["windows"] = ["15m"]
    # Labels land hours to days after the predictions (the simulator's label_ts): released after the replay.
    svc["sources"]["labels"] = {"kind": "files", "path": "./labels", "pattern": "*.jsonl"}
    svc["quality"] = {"windows": ["1h"], "min_n": 30, "coverage_threshold": 0.6, "maturity_horizon": "3d",
                      "label_horizon": "2d", "groups": GROUPS, "rules": RULES, "bootstrap_samples": 100,
                      "seed": 1}
    (root / "labels").mkdir()
    (root / "tailwatch.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = config_mod.load(root / "tailwatch.yaml")
    store = Store(cfg.storage.url)
    store.upgrade()
    try:
        replay(root, cfg, store, truth, None, broken_lines=False)
        start, end = pd.Timestamp(truth.start), pd.Timestamp(truth.end)
        now = start + timedelta(minutes=15)
        while now <= end + timedelta(minutes=15):
            after_tick(cfg, store, now.to_pydatetime())
            now += timedelta(minutes=15)
        for path in sorted((root / "generated" / "labels").glob("*.jsonl")):
            shutil.copy(path, root / "labels" / path.name)
        late = (end + LABELS_AFTER).to_pydatetime()
        assert tick(cfg, store, late)[0].status == "ok"  # reads the labels, scores the matured windows
        run_nightly(cfg, store, late)
        version = truth.model_versions["after"]
        incidents = query.incidents(store, "churn", model_version=version)
        opened = not incidents.empty
        if opened:
            incident_id = int(incidents["id"].iloc[0])
        else:
            onset = pd.Timestamp(truth.onset).to_pydatetime()
            verdicts = query.verdicts(store, "churn", since=onset, model_version=version)
            verdict = verdicts["verdict"].mode().iloc[0] if len(verdicts) else "healthy"
            with store.transaction() as session:
                row = Incident(service="churn", model_version=version, verdict=verdict, status="resolved",
                               opened_at=onset, resolved_at=end.to_pydatetime(), first_window_start=onset,
                               last_window_end=end.to_pydatetime(), fingerprint=f"test-{scenario}",
                               updated_at=end.to_pydatetime())
                session.add(row)
                session.flush()
                incident_id = row.id
        result = explain(store, "churn", incident_id, groups=GROUPS)
        console = Console(record=True, width=200)
        render(result, console)
    finally:
        store.dispose()
    return {"truth": truth, "named": result.named, "opened": opened, "verdict": result.verdict,
            "queries": result.next_queries, "affected": result.affected, "stages": result.stages,
            "text": console.export_text()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    chosen = [s for s in SCENARIOS if s != "healthy"]
    with ProcessPoolExecutor(max_workers=2) as pool:
        futures = {s: pool.submit(run, s, str(tmp_path_factory.mktemp(s))) for s in chosen}
        return {s: f.result() for s, f in futures.items()}


# What explain must name, from each scenario's ground truth (`affected`). slower-cache's stage `model` is named
# as the path lost cache hits now take (`cache_path`: the stages a hit skips, from the stored time per hit and
# per miss); its p95 still grows most in batch_wait, where the verdict points. Not required: worse-threshold's
# `threshold` (a logged field no check follows); the version is what explain names for it.
# worse-preprocessing's segment `tenure < 12` is a label-quality group: named through its acceptance rule.
REQUIRED = {
    "slower-batching": {"batch_wait"},
    "slower-cache": {"model", "cache_hit", "v2"},
    "worse-preprocessing": {"tenure"},
    "worse-threshold": {"v2"},
    "both-long-inputs": {"notes"},
    "drift-new-category": {"Contract", "MonthlyCharges"},
    "missing-fields": {"InternetService"},
}


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "healthy"])
def test_explain_names_what_the_ground_truth_says(runs, scenario):
    got = runs[scenario]
    truth, named = got["truth"], got["named"]
    print(scenario, "incident opened by the alert stage" if got["opened"] else "incident row inserted",
          got["verdict"], named)
    assert REQUIRED[scenario] <= truth_names(truth)  # the table above only picks from the ground truth
    assert REQUIRED[scenario] <= explained_names(named), (truth.affected, named)
    if truth.affected.get("field") != "cache_hit":  # the cache path is named only when lost hits slowed it
        assert not named["cache_path"], named
    assert any(q.startswith("tailwatch query logs") for q in got["queries"])
    segment = truth.affected.get("segment")
    if isinstance(segment, dict) and segment["field"] in (named.get("group_definitions") or {}).get(
            "short_tenure", ""):
        # The group is the ground truth's segment, reported with its n and interval, below the baseline.
        assert named["group_definitions"]["short_tenure"] == f"{segment['field']} {segment['op']} {segment['value']}"
        rows = [a for a in got["affected"] if a["check"] == "acceptance" and a["labels"]["group"] == "short_tenure"]
        assert rows and all(a["n"] >= 30 and a["interval"][1] < a["baseline"] for a in rows), rows
        assert "Yes" in named["classes"]
        assert "group short_tenure (tenure < 12)" in got["text"], got["text"]
