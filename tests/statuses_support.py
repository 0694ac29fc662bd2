"""Two services stored for the readers of request statuses: `gen`, a text-generation service whose logs say
`finished`, `aborted` and `length` (its source's `values:` maps them onto ok, cancelled and truncated), v1
for an hour then v2 for an hour, with cancellations and cut-short answers only under v2; and `churn`, the
same traffic with only ok and timeout (a service that never logs either). Rows are read through the contract
from the log files, folded into 5-minute partials, and v2's hour of `gen` stored as a slower incident."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

START = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ONSET = START + timedelta(hours=1)  # v2 from here
END = START + timedelta(hours=2)
EVERY_S = 10  # one request per 10 s
WORDS = {"finished": "ok", "aborted": "cancelled", "length": "truncated"}  # gen's statuses, as written


def log_rows(service: str) -> pd.DataFrame:
    """The prediction log lines of `service`: v1 then v2, latency a deterministic spread, v2's twice v1's."""
    i = np.arange(int((END - START).total_seconds() // EVERY_S))
    v2 = i >= len(i) // 2
    status = np.where(i % 50 == 7, "timeout", "ok").astype(object)
    if service == "gen":
        status = np.where(status == "ok", "finished", status)
        status = np.where(v2 & (i % 10 == 3), "aborted", status)
        status = np.where(v2 & (i % 25 == 11), "length", status)
    ts = [START + timedelta(seconds=EVERY_S * int(k)) for k in i]
    return pd.DataFrame({
        "request_id": [f"{service}-{k:05d}" for k in i],
        "ts": [t.isoformat().replace("+00:00", "Z") for t in ts],
        "model_version": np.where(v2, "v2", "v1"), "status": status,
        "lang": np.where(i % 3 == 0, "de", "en"),
        "latency_ms": (40.0 + (i * 37) % 101) * np.where(v2, 2.0, 1.0),
    })


def fill(root: Path) -> dict:
    """Write both services' logs and config (tailwatch.yaml) under `root`, store their partials and gen's
    incident; `root`, the config, the rows as the contract read them per service, and the incident's id."""
    from monitor import config as config_mod
    from monitor.aggregate.fold import fold
    from monitor.aggregate.partial import merge_bytes
    from monitor.contract import RecordKind
    from monitor.ingest.accept import check_batch
    from monitor.ingest.sources import open_source
    from storage.models import Incident, VerdictRow
    from storage.store import Store

    services = []
    for name in ("gen", "churn"):
        (root / name).mkdir(parents=True)
        lines = "".join(json.dumps(r) + "\n" for r in log_rows(name).to_dict("records"))
        (root / name / "predictions.jsonl").write_text(lines)
        source = {"kind": "files", "path": str(root / name)}
        if name == "gen":
            source["values"] = {"status": WORDS}
        services.append({"name": name, "sources": {"predictions": source},
                         "schema": {"features": {"lang": "categorical"}}})
    (root / "tailwatch.yaml").write_text(yaml.safe_dump(
        {"storage": {"url": f"sqlite:///{root / 'tw.db'}"}, "services": services}, sort_keys=False))
    cfg = config_mod.load(root / "tailwatch.yaml")
    store = Store(cfg.storage.url)
    rows = {}
    try:
        store.upgrade()
        for svc in cfg.services:
            frames = []
            for batch in open_source(f"{svc.name}/predictions", svc.sources.predictions, cfg.limits).read({}):
                ok, bad = check_batch(batch, RecordKind.predictions, svc.schema_, cfg.limits, END, svc.sources.predictions)
                assert bad == []
                frames.append(ok)
            rows[svc.name] = pd.concat(frames, ignore_index=True)
            parts = fold(rows[svc.name], timedelta(minutes=5), [], timed=False, schema=svc.schema_)
            with store.transaction() as session:
                store.partials.upsert(session, svc.name, parts, merge_bytes)
        with store.transaction() as session:
            incident = Incident(service="gen", model_version="v2", verdict="slower", status="resolved",
                                opened_at=ONSET + timedelta(minutes=15), resolved_at=END, first_window_start=ONSET,
                                last_window_end=END, fingerprint="fp", summary={"text": "slower"}, updated_at=END)
            session.add(incident)
            session.flush()
            session.add(VerdictRow(service="gen", model_version="v2", window_start=ONSET, window_end=END,
                                   verdict="slower", estimated=False, rows=360, evidence=[], attribution={},
                                   what_changed=[], next_steps=[], rollback_to="v1", summary="slower: total latency",
                                   incident_id=incident.id, created_at=END, updated_at=END))
            incident_id = incident.id
    finally:
        store.dispose()
    return {"root": root, "config": cfg, "rows": rows, "incident_id": incident_id}
