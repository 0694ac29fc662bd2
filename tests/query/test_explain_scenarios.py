"""`explain` on every incident scenario: simulate two hours (onset at one), replay and tick every 15 min,
run the alert stage after each tick (verdicts and incidents), then explain the incident and check that it
names what the ground truth says is affected: the stage, the field, the segment or class, or the version.

When the alert stage opened no incident for the scenario's version (its verdicts stayed below alerting),
the test asks about the span an engineer would: an incident row from the onset to the end of the run,
carrying the stored verdict of that span. Seven runs, two at a time: about a minute on two cores.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest
import yaml

from monitor.simulate import SCENARIOS

pytestmark = pytest.mark.slow

HOURS, ONSET_HOURS, SEED = 2.0, 1.0, 7


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
    for key in ("fields", "classes", "groups", "signals", "outputs", "versions"):
        out |= set(named.get(key) or [])
    for seg in named.get("segments") or []:
        field, _, value = seg.partition("=")
        out |= {field, value}
    return out


def run(scenario: str, work: str) -> dict:
    from monitor import config as config_mod
    from monitor import query
    from monitor.alerts import after_tick
    from monitor.demo import demo_config, replay
    from monitor.investigate.explain import explain
    from monitor.simulate import generate
    from storage.models import Incident
    from storage.store import Store

    root = Path(work)
    truth = generate(scenario, root / "generated", seed=SEED, hours=HOURS, onset_hours=ONSET_HOURS, otlp=False)
    for kind in ("predictions", "timings"):
        (root / "logs" / kind).mkdir(parents=True, exist_ok=True)
    raw = demo_config(root)
    raw["services"][0]["buckets"]["windows"] = ["15m"]
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
        result = explain(store, "churn", incident_id)
    finally:
        store.dispose()
    return {"truth": truth, "named": result.named, "opened": opened, "verdict": result.verdict,
            "queries": result.next_queries}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    chosen = [s for s in SCENARIOS if s != "healthy"]
    with ProcessPoolExecutor(max_workers=2) as pool:
        futures = {s: pool.submit(run, s, str(tmp_path_factory.mktemp(s))) for s in chosen}
        return {s: f.result() for s, f in futures.items()}


# What explain must name, from each scenario's ground truth (`affected`). Not required: slower-cache's
# stage `model` (the cache misses add model time to a minority of requests; the p95 moves most in
# batch_wait, and the verdict attributes it there) and worse-threshold's `threshold` (a logged field no
# check follows); the cache and the version are what explain names for them.
REQUIRED = {
    "slower-batching": {"batch_wait"},
    "slower-cache": {"cache_hit", "v2"},
    "worse-threshold": {"v2"},
    "both-long-inputs": {"notes"},
    "drift-new-category": {"Contract", "MonthlyCharges"},
    "missing-fields": {"InternetService"},
}

# Needs the label-quality groups of issue 5 scored in the replay (tenure < 12 is a quality group, not a
# logged field that moves): explain then names the group; without them it only sees the prediction shift.
NEEDS_LABELS = {"worse-preprocessing"}


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "healthy"])
def test_explain_names_what_the_ground_truth_says(runs, scenario):
    got = runs[scenario]
    truth, named = got["truth"], got["named"]
    print(scenario, "incident opened by the alert stage" if got["opened"] else "incident row inserted",
          got["verdict"], named)
    if scenario in NEEDS_LABELS:
        pytest.xfail(f"{scenario}: the affected group is a label-quality group (issue 5); named {named}")
    assert REQUIRED[scenario] <= truth_names(truth)  # the table above only picks from the ground truth
    assert REQUIRED[scenario] <= explained_names(named), (truth.affected, named)
    assert any(q.startswith("tailwatch query logs") for q in got["queries"])
