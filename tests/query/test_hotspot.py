"""A hotspot named by its value: scikit-learn's Digits classifier served by four replicas, an even split for an
hour, then `api-2` takes 40% of the traffic and its `model` stage runs 4x slower (the others unchanged). Ticked
every 15 min on growing log files with the alert stage after each tick: the verdict, the Slack message,
`explain` (with the hot value's per-stage table from the raw logs) and `query logs` name `replica=api-2`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
import yaml

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
HOURS, ONSET, RATE, SEED = 2.0, 1.0, 2.0, 11  # hours, hours, requests per second
REPLICAS = ("api-1", "api-2", "api-3", "api-4")
EVERY = timedelta(minutes=15)


def _z(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _logs(seed: int) -> tuple[list[dict], dict[str, list[dict]]]:
    """Predictions (replica, two pixels, the predicted digit) and per-stage timings, in time order."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(seed)
    digits = load_digits()
    model = LogisticRegression(max_iter=300).fit(digits.data[:1200], digits.target[:1200])
    pool = digits.data[1200:]
    predicted = model.predict(pool)
    n = int(HOURS * 3600 * RATE)
    onset = START + timedelta(hours=ONSET)
    preds, timings = [], {}
    for i, seconds in enumerate(np.sort(rng.uniform(0, HOURS * 3600, n))):
        t = START + timedelta(seconds=float(seconds))
        during = t >= onset
        replica = REPLICAS[rng.choice(4, p=[0.2, 0.4, 0.2, 0.2] if during else [0.25] * 4)]
        k = int(rng.integers(len(pool)))
        slow = 4.0 if during and replica == "api-2" else 1.0
        stages = {"parse": rng.lognormal(0.0, 0.2), "preprocess": rng.lognormal(np.log(2.0), 0.2),
                  "model": rng.lognormal(np.log(10.0), 0.25) * slow}
        rid = f"r{i:06d}"
        preds.append({"request_id": rid, "ts": _z(t), "model_version": "v1", "status": "ok", "replica": replica,
                      "prediction": str(int(predicted[k])), "latency_ms": round(sum(stages.values()) + 0.3, 3),
                      "pixel_20": float(pool[k][20]), "pixel_36": float(pool[k][36])})
        timings[rid] = [{"request_id": rid, "stage": s, "duration_ms": round(d, 3)} for s, d in stages.items()]
    return preds, timings


@pytest.fixture(scope="module")
def hot_run(tmp_path_factory) -> dict:
    from monitor import config as config_mod
    from monitor.alerts.evaluate import after_tick
    from monitor.daemon.runner import tick
    from storage.store import Store

    root = tmp_path_factory.mktemp("hotspot")
    for kind in ("predictions", "timings"):
        (root / "logs" / kind).mkdir(parents=True)
    raw = {"storage": {"url": f"sqlite:///{root / 'tw.db'}"},
           "services": [{"name": "digits",
                         "sources": {kind: {"kind": "files", "path": str(root / "logs" / kind)}
                                     for kind in ("predictions", "timings")},
                         "schema": {"features": {"pixel_20": "numeric", "pixel_36": "numeric"},
                                    "classes": [str(c) for c in range(10)]},
                         "buckets": {"size": "5m", "windows": ["15m"]}, "join": {"lateness": "5m"},
                         "accepted_versions": ["v1"]}]}
    (root / "tailwatch.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = config_mod.load(root / "tailwatch.yaml")
    preds, timings = _logs(SEED)
    store = Store(cfg.storage.url)
    store.upgrade()
    try:
        now, i, part = START + EVERY, 0, 0
        while now <= START + timedelta(hours=HOURS) + EVERY:
            batch = []
            while i < len(preds) and preds[i]["ts"] < _z(now):
                batch.append(preds[i])
                i += 1
            part += 1
            for kind, rows in (("predictions", batch), ("timings", [t for p in batch for t in timings[p["request_id"]]])):
                (root / "logs" / kind / f"part-{part:04d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            assert all(r.status == "ok" for r in tick(cfg, store, now))
            after_tick(cfg, store, now)
            now += EVERY
        with store.transaction() as session:
            verdicts = store.verdicts.load(session, "digits")
            incidents = store.incidents.load(session, "digits")
    finally:
        store.dispose()
    return {"root": root, "config": cfg, "verdicts": verdicts, "incidents": incidents,
            "onset": START + timedelta(hours=ONSET)}


def test_the_verdict_names_the_hot_replica_with_its_latency_against_the_others(hot_run):
    during = [v for v in hot_run["verdicts"] if v["window_start"] >= hot_run["onset"]]
    assert during and {v["verdict"] for v in during} == {"slower"}
    for v in during:
        assert "hotspot replica=api-2" in v["summary"] and "ms on the other replicas" in v["summary"], v["summary"]
        hot = [e for e in v["evidence"] if e["check"] == "hotspot"]
        assert hot and all(e["labels"]["replica"] == "api-2" for e in hot)
    before = [v for v in hot_run["verdicts"] if v["window_end"] <= hot_run["onset"]]
    assert before and {v["verdict"] for v in before} <= {"healthy", "insufficient_data"}


def test_the_slack_message_names_the_hot_replica_escaped(hot_run):
    from monitor.alerts.render import render

    [incident] = [i for i in hot_run["incidents"] if i["verdict"] == "slower"]
    message = render(incident, "post", "post", None)
    body = json.dumps(message["blocks"])
    assert "hotspot replica=api-2" in message["text"]
    assert "measure=latency replica=api-2" in body and "field=replica" not in body

    # A value from the logs reaches Slack escaped: no mention, no link.
    hostile = json.loads(json.dumps(incident, default=str).replace("api-2", "<!channel>"))
    for key in ("first_window_start", "opened_at", "last_window_end"):
        hostile[key] = incident[key]
    escaped = json.dumps(render(hostile, "post", "post", None))
    assert "<!channel>" not in escaped and "replica=&lt;!channel&gt;" in escaped


def test_explain_names_the_hot_replica_and_shows_its_stages(hot_run):
    from typer.testing import CliRunner

    from monitor.cli import app

    config = str(hot_run["root"] / "tailwatch.yaml")
    [incident] = [i for i in hot_run["incidents"] if i["verdict"] == "slower"]
    runner = CliRunner()
    done = runner.invoke(app, ["--config", config, "explain", str(incident["id"]), "--format", "json"])
    assert done.exit_code == 0, done.output
    found = json.loads(done.output)
    assert found["named"]["hotspots"] == ["replica=api-2"] and "replica" not in found["named"]["fields"]
    hot = found["hotspot"]
    assert (hot["field"], hot["value"]) == ("replica", "api-2")
    assert hot["requests"]["during"] > 0.3 * (hot["requests"]["during"] + hot["requests"]["others_during"])
    stages = {r["stage"]: r for r in hot["stages"]}
    assert set(stages) == {"total", "parse", "preprocess", "model"}
    model = stages["model"]
    # api-2's model stage: about 4x its own before and the others' during; the other stages unchanged.
    assert 3 < model["p50_during"] / model["p50_before"] < 5 and 3 < model["p50_during"] / model["others_p50_during"] < 5
    for stage in ("parse", "preprocess"):
        assert 0.8 < stages[stage]["p50_during"] / stages[stage]["others_p50_during"] < 1.25
    table = runner.invoke(app, ["--config", config, "explain", str(incident["id"])], env={"COLUMNS": "160"})
    assert table.exit_code == 0, table.output
    assert "points at: stage model; hotspot replica=api-2" in table.output
    assert "replica=api-2 (" in table.output and "vs the other replicas" in table.output


def test_query_logs_compares_the_hot_replica_latency_with_the_others(hot_run):
    from monitor.investigate.logs import drill

    cfg = hot_run["config"]
    onset = hot_run["onset"]
    result = drill(cfg.services[0], cfg.limits, since=onset, until=onset + timedelta(hours=HOURS - ONSET),
                   stage="model", top=5)
    replicas = result.aggregates[result.aggregates["dimension"] == "replica"].set_index("value")
    hot = replicas.loc["api-2"]
    assert 3 < hot["p95_ms"] / hot["others_p95_ms"] < 5
    for other in ("api-1", "api-3", "api-4"):
        assert replicas.loc[other, "p95_ms"] < replicas.loc[other, "others_p95_ms"]
