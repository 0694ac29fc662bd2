"""What `explain` suggests running next: commands filled in with an incident's range, version, stage and fields,
each one the configured sources can answer (the raw-log drill-down ranks only by what the rows carry)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd

from monitor.aggregate.partial import Partial
from monitor.investigate import history


def measured(during: Partial | None) -> list[str]:
    """The latency measures (`total`, stage names) the rows of a merged partial carry, `total` first."""
    if during is None:
        return []
    found = {c.rsplit("_", 2)[0] for c, v in history.partial_metrics(during).items()
             if c.endswith("_p95_ms") and v is not None and not pd.isna(v)}
    return sorted(found, key=lambda s: (s != "total", s))


def next_queries(service: str, incident_id: int, version: str | None, first: datetime, last: datetime,
                 named: dict, stages: list[dict], verdicts: pd.DataFrame, served_before: str | None,
                 before: timedelta) -> list[str]:
    """Commands to run next, filled in with this incident's range, version, stage and fields."""
    t0, t1 = f"{first:%Y-%m-%dT%H:%MZ}", f"{last:%Y-%m-%dT%H:%MZ}"
    span = f"--since {t0} --until {t1}"
    out = []
    stage = named.get("stage")
    ranked = named.get("measured", ())
    if stage:
        p95 = next((r.get("p95_during") for r in stages if r.get("stage") == stage), None)
        floor = f" --min-ms {p95:.3g}" if p95 else ""
        out.append(f"tailwatch query logs -s {service} {span} --stage {stage}{floor} --top 20")
        out.append(f"tailwatch query findings -s {service} {span} --check latency --label stage={stage}")
    elif "total" in ranked:
        out.append(f"tailwatch query logs -s {service} {span} --top 20")
    elif ranked:
        # The rows carry no latency_ms: the drill-down ranks by a stage that has timings.
        out.append(f"tailwatch query logs -s {service} {span} --stage {ranked[0]} --top 20")
    for hot in named.get("hotspots", [])[:1]:
        out.append(f"tailwatch query findings -s {service} {span} --check hotspot --label field={hot.split('=')[0]}")
    for f in named.get("fields", [])[:2]:
        out.append(f"tailwatch query findings -s {service} {span} --label field={f}")
    for seg in named.get("segments", [])[:2]:
        out.append(f"tailwatch query metrics -s {service} {span} --segment '{seg}' --every 15m")
    around = f"--since {(first - before):%Y-%m-%dT%H:%MZ} --until {t1}"
    out.append(f"tailwatch query metrics -s {service} {around} --every 15m")
    rollback = next((r for r in (verdicts["rollback_to"] if len(verdicts) else []) if r), None)
    previous = rollback or served_before
    if version and previous and previous != version:
        # Over the span before the incident too: a version the incident's replaced served only then.
        out.append(f"tailwatch compare -s {service} --baseline {previous} --candidate {version} {around}")
    out.append(f"tailwatch query findings -s {service} {span} --status breach --group-by check,model_version")
    out.append(f"tailwatch report -s {service} --incident {incident_id} -o incident-{incident_id}.html")
    return out
