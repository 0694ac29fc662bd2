"""`tailwatch report`: a page of the web UI saved as one self-contained HTML file — the incident page, or
the service overview for a range — rendered by the same templates and drawn by the same scripts (inlined,
so nothing is fetched when it opens). Appended: for a range, its breaching findings (an incident page
shows its evidence already); for both, Evidently's data drift report of the raw rows against the
reference, embedded inline."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pandas as pd

from monitor.config import Config, Limits, Service, page_url
from monitor.ingest.sources.batch import Observer
from monitor.investigate import query
from monitor.investigate.output import cell
from monitor.ui import pages, views
from storage.store import Store

EVIDENTLY_MAX_ROWS = 20_000  # rows of the window sampled for Evidently (its report grows with rows)
BREACHES_SHOWN = 40  # rows of the breaching findings table


def evidently_html(service: Service, limits: Limits, since: datetime, until: datetime,
                   observe: Observer | None = None) -> tuple[str | None, str]:
    """Evidently's DataDriftPreset report of the window's raw rows vs the reference (standalone HTML),
    or None with the reason; `observe` is told the raw rows read (see `drill`)."""
    import os

    os.environ.setdefault("DO_NOT_TRACK", "1")  # before evidently is imported
    from monitor.aggregate.profile import read_reference
    from monitor.investigate.logs import LogsError, drill

    if service.reference is None:
        return None, "no reference configured"
    kinds = service.schema_.features
    numeric = [f for f, k in kinds.items() if k == "numeric"]
    categorical = [f for f, k in kinds.items() if k == "categorical"]
    if not numeric and not categorical:
        return None, "no numeric or categorical features declared"
    try:
        current = drill(service, limits, since=since, until=until, top=1 << 62, features=True,
                        observe=observe).requests
    except (LogsError, OSError) as exc:
        return None, f"raw rows not readable: {exc}"
    if current.empty:
        return None, "no raw rows in the window"
    if len(current) > EVIDENTLY_MAX_ROWS:  # a uniform sample: the drill-down orders rows by latency
        current = current.sample(EVIDENTLY_MAX_ROWS, random_state=0)
    from evidently import DataDefinition, Dataset, Report
    from evidently.presets import DataDriftPreset

    columns = [c for c in numeric + categorical if c in current.columns]
    reference = read_reference(service.reference, service.schema_.fold_case)
    columns = [c for c in columns if c in reference.columns]
    definition = DataDefinition(numerical_columns=[c for c in columns if c in numeric],
                                categorical_columns=[c for c in columns if c in categorical])

    def plain(frame: pd.DataFrame) -> pd.DataFrame:
        out = pd.DataFrame({c: frame[c].astype("float64") if c in numeric else frame[c].astype(object)
                            for c in columns})
        return out.reset_index(drop=True)

    snapshot = Report([DataDriftPreset()]).run(Dataset.from_pandas(plain(current), data_definition=definition),
                                               Dataset.from_pandas(plain(reference), data_definition=definition))
    return snapshot.get_html_str(as_iframe=False), f"{len(current):,} rows of the window vs {len(reference):,} reference rows"


def breaches(store: Store, service: str, since: datetime, until: datetime) -> dict[str, Any]:
    """The findings that breached in [since, until), all traffic, counted per check, version and labels
    (most breaches first, the first BREACHES_SHOWN): column names and rows of cells as text."""
    found = query.findings(store, service, since=since, until=until, status="breach", segment="all")
    frame = query.group_findings(found, ["check", "model_version", "labels"])
    return {"columns": list(frame.columns), "total": len(frame),
            "rows": [[cell(v) for v in row] for row in frame.head(BREACHES_SHOWN).itertuples(index=False)]}


def build_report(cfg: Config, store: Store, service: Service, *, since: datetime | None = None,
                 until: datetime | None = None, incident_id: int | None = None, evidently: bool = True,
                 now: datetime | None = None, observe: Observer | None = None) -> str:
    """The incident page of `incident_id` (Evidently over its windows), or else the overview of `service`
    for [since, until), as one HTML file. Its links point at `ui.external_url` when set, else they are plain
    text. `observe` is told the raw rows read for Evidently's report (the rest comes from the store)."""
    now = now or datetime.now(UTC)
    if incident_id is not None:
        try:
            context = views.incident(cfg, store, incident_id, now)
        except views.NotFound:
            context = {}
        if context.get("service") != service.name:
            raise ValueError(f"no incident {incident_id} for service {service.name}")
        page, (since, until) = "incident.html", context["explanation"].window
        found = None  # the page's evidence table holds them
    elif since is None or until is None:
        raise ValueError("give --since and --until, or --incident")
    else:
        page = "service.html"
        context = views.overview(cfg, store, service.name, now, since=since, until=until)
        found = breaches(store, service.name, since, until)
    doc, note = evidently_html(service, cfg.limits, since, until, observe) if evidently else (None, "not requested")
    saved = {"page": page, "at": now, "breaches": found, "evidently": doc, "note": note,
             "linked": cfg.ui.external_url is not None}
    return pages.render("report.html", {**context, "services": [s.name for s in cfg.services], "writable": False,
                                        "saved": saved}, inline=True, url=lambda path: page_url(cfg, path))
