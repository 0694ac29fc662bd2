"""Replay a generation scenario (monitor/simulate/generation.py) as tests/alerts/test_end_to_end.py replays
the churn ones: a tick every 15 minutes, then the alert stage and the outbox drain against a fake Slack,
each on a new Store; feedback labels are written to the label log when their `label_ts` comes."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import yaml

SEED = 7


def _label_lines(folder: Path) -> pd.DataFrame:
    """Every label line with its `label_ts`, in time order."""
    frames = []
    for part in sorted(folder.glob("part-*.jsonl")):
        raw = part.read_bytes().splitlines()
        if raw:
            at = pd.read_json(part, lines=True, dtype=False, convert_dates=False)["label_ts"]
            frames.append(pd.DataFrame({"line": raw, "at": pd.to_datetime(at, utc=True, format="ISO8601")}))
    if not frames:
        return pd.DataFrame({"line": [], "at": pd.to_datetime([], utc=True)})
    return pd.concat(frames, ignore_index=True).sort_values("at", kind="stable")


def run_generation(scenario: str, root: Path, fake, *, hours: float | None = None, onset: float | None = None,
                   fault_end: float | None = None, rate: float = 2.0, first_tick: datetime | None = None,
                   feedback: bool = True, seed: int = SEED) -> dict:
    """Generate `scenario` and replay it live, or as a backlog up to `first_tick` then live, alerting to
    `fake` (a FakeSlack; None: no Slack); returns the truth, the per-tick log, and the stored incidents,
    verdicts and findings."""
    from monitor import config as config_mod
    from monitor import demo
    from monitor.alerts.evaluate import after_tick
    from monitor.notify import drain
    from monitor.simulate.generation import SERVICE, generate_generation, generation_config
    from storage.store import Store

    truth = generate_generation(scenario, root / "generated", seed=seed, hours=hours, rate_per_s=rate,
                                onset_hours=onset, fault_end_hours=fault_end)
    for kind in ("predictions", "timings", "labels"):
        (root / "logs" / kind).mkdir(parents=True, exist_ok=True)
    raw = generation_config(feedback=feedback)
    if fake is not None:
        raw["alerts"] = {"slack": {"token": {"env": "TW_SLACK_TOKEN"}, "channel": "#alerts",
                                   "base_url": fake.base_url, "timeout": "2s"}}
    (root / "tailwatch.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    config = config_mod.load(root / "tailwatch.yaml")
    store = Store(config.storage.url)
    store.upgrade()
    labels = _label_lines(root / "generated" / "labels") if feedback else None
    written = [pd.Timestamp(truth.start) - timedelta(days=1)]
    log = []

    def tick_then_alert(cfg, st, now):
        if labels is not None:  # the feedback that has arrived by now, one file per hour as a logger rotates
            due = labels[(labels["at"] > written[0]) & (labels["at"] <= now)]
            for hour, group in due.groupby(due["at"].dt.floor("h")):
                with open(root / "logs" / "labels" / f"labels-{hour:%Y%m%d%H}.jsonl", "ab") as fh:
                    fh.write(b"\n".join(group["line"]) + b"\n")
            written[0] = pd.Timestamp(now)
        reports = demo.tick(cfg, st, now)
        fresh = Store(cfg.storage.url)  # alerting on a new Store every tick: a restart between ticks
        try:
            alerts = after_tick(cfg, fresh, now)
            sent = drain(cfg, fresh, now)
            later = drain(cfg, fresh, now + timedelta(minutes=1))
        finally:
            fresh.dispose()
        sent.sent += later.sent
        sent.errors += later.errors
        log.append((now, alerts, sent, reports))
        return reports

    try:
        demo.replay(root, config, store, truth, None, broken_lines=False, job=tick_then_alert, first_tick=first_tick)
        with store.transaction() as session:
            incidents = store.incidents.load(session, SERVICE)
            verdicts = store.verdicts.load(session, SERVICE)
            findings = store.findings.load(session, SERVICE)
    finally:
        store.dispose()
    return {"truth": truth, "log": log, "incidents": incidents, "verdicts": verdicts, "findings": findings}
