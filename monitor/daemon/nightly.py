"""The nightly quality job: score every closed window of every quality window length within the
retention, matured or not (the immature get coverage and estimates), and prune what retention drops.

Idempotent: scoring reads only stored rows and draws its bootstrap from seeds fixed by the window, so a
rerun at the same clock rewrites identical findings in place; safe under cron or a Kubernetes CronJob.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime

from monitor.config import Config
from monitor.verdicts import evidence
from monitor.verdicts.quality import WindowQuality, realized_error, score_service
from monitor.verdicts.windows import floor_to
from storage.database import utc
from storage.store import Store


@dataclass
class ServiceNightly:
    """What the nightly job did for one service."""

    service: str
    failed_as_miss: bool
    windows: int = 0  # (window, model version) pairs scored
    matured: int = 0
    findings: int = 0
    pruned: int = 0  # scored predictions dropped by retention
    # Each breach in words: window start, version, check and labels, value vs baseline, n and interval.
    breaches: list[str] = field(default_factory=list)
    estimate_error: dict[str, float] = field(default_factory=dict)  # mean |estimate - realized| by metric:class
    scored: list[WindowQuality] = field(default_factory=list)


@dataclass
class NightlyReport:
    now: str
    services: list[ServiceNightly] = field(default_factory=list)
    seconds: float = 0.0


def run_nightly(config: Config, store: Store, now: datetime, service: str | None = None) -> NightlyReport:
    """Score every closed quality window of each service with a quality section (or only `service`)."""
    started = time.perf_counter()
    now = utc(now)
    report = NightlyReport(now=now.isoformat())
    for svc in config.services:
        if svc.quality is None or service not in (None, svc.name):
            continue
        q = svc.quality
        out = ServiceNightly(svc.name, q.failed_as_miss)
        with store.transaction() as session:
            out.pruned = store.labels.prune(session, svc.name, now - q.retention)
            first, last = store.labels.span(session, svc.name)
        windows: list[tuple[datetime, datetime]] = []
        if first is not None:
            for size in q.windows:
                start = floor_to(max(first, now - q.retention), size)
                end = min(floor_to(now, size), floor_to(last, size) + size)
                while start + size <= end:
                    windows.append((start, start + size))
                    start += size
        scored = score_service(config, svc, store, now, windows)
        out.scored = scored
        out.windows = len(scored)
        out.matured = sum(w.matured for w in scored)
        out.findings = sum(len(w.findings) for w in scored)
        out.breaches = [f"{w.start:%Y-%m-%d %H:%M} {w.model_version} "
                        + evidence.text(f.to_row(svc.name, w.model_version, w.start, w.end))
                        for w in scored for f in w.findings if f.status == "breach"]
        errors = realized_error([f for w in scored for f in w.findings])
        out.estimate_error = {f"{m}:{c}": round(sum(abs(e) for e in v) / len(v), 6) for (m, c), v in errors.items()}
        report.services.append(out)
    report.seconds = round(time.perf_counter() - started, 3)
    return report
