"""The web pages served for tests (and for bench/ui.py's screenshots): stores filled by the real pipeline
from simulator scenarios, and uvicorn on a free loopback port in a thread, over a config's store."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pandas as pd
import uvicorn
import yaml

from monitor import config as config_mod
from storage.store import Store

# A log line's text that would run script if a page wrote it unescaped.
HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
HOURS, ONSET_HOURS, SEED = 3.0, 1.5, 7
LABELS_AFTER = timedelta(days=4)  # the simulator's last labels land within 96 h of the run's end
# Acceptance rules as a user writes them (docs/quality.md): a floor for all traffic, a drop per group.
RULES = [{"name": "churn recall", "metric": "recall", "class": "Yes", "min": 0.6},
         {"name": "group recall", "metric": "recall", "class": "Yes", "group": "*", "max_drop": 0.05}]


def scenario_run(root: Path, scenario: str, hostile: bool = False, labels: bool = False) -> dict:
    """Generate, replay and tick `scenario` in `root` for HOURS (the fault from ONSET_HOURS), every 15 min
    by the daemon's tick job (verdicts and incidents), with the demo's malformed lines in the quarantine.
    `hostile`: then one more tick over a line holding HTML markup. `labels`: the service scores quality
    (groups, RULES against the accepted v1), and its labels, released once they have all landed, are
    read by one more tick LABELS_AFTER the run's end and scored by the nightly job."""
    from monitor.daemon.jobs import tick_job
    from monitor.daemon.nightly import run_nightly
    from monitor.demo import demo_config, replay
    from monitor.simulate import generate

    truth = generate(scenario, root / "generated", seed=SEED, hours=HOURS, onset_hours=ONSET_HOURS, otlp=False)
    for kind in ("predictions", "timings") + (("labels",) if labels else ()):
        (root / "logs" / kind).mkdir(parents=True, exist_ok=True)
    raw = demo_config(root)
    raw["ui"] = {"external_url": "https://tailwatch.example.org/ui/"}
    if labels:
        svc = raw["services"][0]
        svc["sources"]["labels"] = {"kind": "files", "path": "./logs/labels"}
        svc["accepted_versions"] = ["v1"]
        svc["quality"] = {"windows": ["1h"], "min_n": 30, "coverage_threshold": 0.6, "maturity_horizon": "3d",
                          "groups": {"short_tenure": "tenure < 12"}, "rules": RULES, "bootstrap_samples": 100,
                          "seed": 1}
    (root / "tailwatch.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = config_mod.load(root / "tailwatch.yaml")
    store = Store(cfg.storage.url)
    store.upgrade()
    try:
        reports = replay(root, cfg, store, truth, None, job=tick_job)
        if hostile:
            last = pd.Timestamp(truth.end) + timedelta(minutes=30)
            ts = f"{last - timedelta(minutes=5):%Y-%m-%dT%H:%M:%SZ}"
            line = {"request_id": HOSTILE, "ts": ts, "model_version": "v2", "status": HOSTILE}
            (root / "logs" / "predictions" / "hostile.jsonl").write_text(json.dumps(line) + "\n")
            reports += tick_job(cfg, store, last.to_pydatetime())
        if labels:
            for path in sorted((root / "generated" / "labels").glob("*.jsonl")):
                shutil.copy(path, root / "logs" / "labels" / path.name)
            late = (pd.Timestamp(truth.end) + LABELS_AFTER).to_pydatetime()
            reports += tick_job(cfg, store, late)
            run_nightly(cfg, store, late)
    finally:
        store.dispose()
    assert all(r.status == "ok" for r in reports), [r.error for r in reports]
    return {"root": root, "config": cfg, "truth": truth}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A uvicorn server of the app on 127.0.0.1 in a thread; `url` is its base address."""

    def __init__(self, app) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{self.server.config.port}"

    def __enter__(self) -> Served:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the ui server stopped before it started")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join()


@contextmanager
def serving(cfg, token_file: Path | None = None) -> Iterator[tuple[Served, Store]]:
    """The app over `cfg`'s store, served; with `token_file`, silences are writable with its token."""
    from monitor.ui.app import create_app

    if token_file is not None:
        cfg = cfg.model_copy(update={"ui": cfg.ui.model_copy(
            update={"silence_token": config_mod.Secret(file=token_file)})})
    store = Store(cfg.storage.url)
    try:
        with Served(create_app(cfg, store)) as served:
            yield served, store
    finally:
        store.dispose()




def fair_run(root: Path, days: float = 3, broken: tuple[float, float] = (1.0, 2.5)) -> dict:
    """statsmodels' Fair survey served by a gradient-boosting classifier for `days` (realcases.fair_case,
    labels 6-12 h late, recall rules per occupation), a version whose preprocessing breaks `managerial`
    rows over `broken` (days): built, profiled and backfilled in `root` as its config says."""
    from monitor.aggregate.profile import store_profile
    from monitor.daemon import backfill
    from monitor.simulate import realcases

    case = realcases.fair_case(days=days, broken=broken, name="ui-fair")
    truth = realcases.build_case(case, root)
    raw = yaml.safe_load((root / "tailwatch.yaml").read_text())
    raw["services"][0]["quality"] |= {"bootstrap_samples": 100, "seed": 1}  # the intervals' resamples: a test's
    (root / "tailwatch.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = config_mod.load(root / "tailwatch.yaml")
    store = Store(cfg.storage.url)
    store.upgrade()
    try:
        store_profile(store, cfg.services[0])
        backfill.run(cfg, store, pd.Timestamp(truth["start"]).to_pydatetime(), pd.Timestamp(truth["end"]).to_pydatetime())
    finally:
        store.dispose()
    return {"root": root, "config": cfg, "truth": truth}
