"""End to end: simulate a scenario, replay its logs tick by tick (monitor.demo.replay) with after_tick and
drain after every tick (each on a new Store: a restart between ticks) against the fake Slack server: one
thread for the slower-cache incident with the right verdict and the cache named, none for healthy."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml

HOURS, ONSET, RATE, SEED = 3.0, 1.5, 3.0, 7


def run(scenario: str, root: Path, fake, monkeypatch, *, hours: float = HOURS, onset: float | None = ONSET,
        fault_end: float | None = None, rate: float = RATE, first_tick=None) -> dict:
    """Generate `scenario` (fault from `onset` to `fault_end` hours; `onset` None: the scenario's own) and
    replay it live, or as a backlog up to `first_tick` then live; returns the truth, the per-tick log and
    the stored incidents and verdicts."""
    from monitor import config as config_mod
    from monitor import demo
    from monitor.alerts.evaluate import after_tick
    from monitor.notify import drain
    from monitor.simulate import generate
    from storage.store import Store

    truth = generate(scenario, root / "generated", seed=SEED, hours=hours, onset_hours=onset,
                     fault_end_hours=fault_end, rate_per_s=rate, otlp=False)
    for kind in ("predictions", "timings"):
        (root / "logs" / kind).mkdir(parents=True, exist_ok=True)
    raw = demo.demo_config(root)
    raw["services"][0]["buckets"]["windows"] = ["15m"]
    raw["services"][0]["accepted_versions"] = ["v1"]
    raw["alerts"] = {"slack": {"token": {"env": "TW_SLACK_TOKEN"}, "channel": "#alerts", "base_url": fake.base_url,
                               "timeout": "2s"}}
    (root / "tailwatch.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    config = config_mod.load(root / "tailwatch.yaml")
    store = Store(config.storage.url)
    store.upgrade()
    real_tick = demo.tick
    log = []

    def tick_then_alert(cfg, st, now):
        reports = real_tick(cfg, st, now)
        fresh = Store(cfg.storage.url)  # alerting on a new Store every tick: a restart between ticks
        try:
            alerts = after_tick(cfg, fresh, now)
            sent = drain(cfg, fresh, now)
            # The daemon drains every minute or so: a post held for group_wait goes out before the next tick.
            later = drain(cfg, fresh, now + timedelta(minutes=1))
        finally:
            fresh.dispose()
        sent.sent += later.sent
        sent.errors += later.errors
        log.append((now, alerts, sent))
        return reports

    try:
        demo.replay(root, config, store, truth, None, broken_lines=False, job=tick_then_alert, first_tick=first_tick)
        with store.transaction() as session:
            incidents = store.incidents.load(session, "churn")
            verdicts = store.verdicts.load(session, "churn")
    finally:
        store.dispose()
    return {"truth": truth, "log": log, "incidents": incidents, "verdicts": verdicts}


def test_slower_cache_one_thread_with_verdict_and_cache(tmp_path, fake_slack, monkeypatch):
    from datetime import datetime

    result = run("slower-cache", tmp_path, fake_slack, monkeypatch)
    onset = datetime.fromisoformat(result["truth"].onset.replace("Z", "+00:00"))
    regressions = [i for i in result["incidents"] if i["verdict"] in ("slower", "both", "worse")]
    assert len(fake_slack.top_level) == 1, [m["text"] for m in fake_slack.top_level]
    msg = fake_slack.top_level[0]
    assert len(regressions) == 1 and regressions[0]["verdict"] == "slower" and regressions[0]["model_version"] == "v2"
    header = msg["blocks"][0]["text"]["text"]
    assert "SLOWER" in header and "v2" in header
    body = str(msg["blocks"])
    assert "cache_hit_rate" in body and "Rollback to" in body and "`v1`" in body
    assert "model_version v2 first seen" in body
    before = [v for v in result["verdicts"] if v["window_end"] <= onset]
    assert before and {v["verdict"] for v in before} <= {"healthy", "insufficient_data"}
    first_post = next(now for now, _, o in result["log"] if o.sent)
    delay = (first_post - onset).total_seconds() / 60
    print(f"\nslower-cache: first message {delay:.0f} min after onset; "
          f"messages {fake_slack.calls.count('chat.postMessage')} posts, {fake_slack.calls.count('chat.update')} updates")
    assert delay <= 60


@pytest.mark.parametrize("scenario", ["healthy"])
def test_healthy_sends_nothing(tmp_path, fake_slack, monkeypatch, scenario):
    result = run(scenario, tmp_path, fake_slack, monkeypatch)
    assert fake_slack.messages == [] and result["incidents"] == []
    assert {v["verdict"] for v in result["verdicts"]} <= {"healthy", "insufficient_data", "no_data"}


INCIDENTS = ["slower-batching", "worse-preprocessing", "worse-threshold", "both-long-inputs", "drift-new-category",
             "missing-fields"]


@pytest.mark.slow
@pytest.mark.parametrize("scenario", INCIDENTS)
def test_every_scenario_gets_its_verdict_in_one_thread(tmp_path, fake_slack, monkeypatch, scenario):
    """~25 s each: the README's scenario table (slower-cache and healthy run above)."""
    result = run(scenario, tmp_path, fake_slack, monkeypatch)
    truth = result["truth"]
    assert [(i["verdict"], i["model_version"]) for i in result["incidents"]] == [
        (truth.verdict, truth.model_versions["after"])]
    assert len(fake_slack.top_level) == 1
    assert truth.verdict.upper() in fake_slack.top_level[0]["blocks"][0]["text"]["text"]
