"""`tailwatch report`: one self-contained HTML file for a time range or an incident — matplotlib plots
embedded as base64 PNG (latency percentiles per stage over time with the incident marked, request and
failure rates, quality per group with intervals, drift per field, label coverage), the breaching findings,
and Evidently's data drift report of the window's raw rows against the reference, embedded (inline).
Nothing is fetched from the network when it opens."""

from __future__ import annotations

import base64
import html
import io
import math
from datetime import UTC, datetime, timedelta

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from monitor.config import Limits, Service  # noqa: E402
from monitor.ingest.sources.batch import Observer  # noqa: E402
from monitor.investigate import history, query  # noqa: E402
from storage.store import Store  # noqa: E402

CONTEXT = timedelta(hours=3)  # shown before an incident's first window, so "before" is on the plot
EVIDENTLY_MAX_ROWS = 20_000  # rows of the window sampled for Evidently (its report grows with rows)
PSI_FLOOR = 0.1  # the drift check's default PSI floor, drawn as a guide
STAGE_COLORS = {"p50": "#4c78a8", "p95": "#f58518", "p99": "#e45756"}


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _mark(ax, marked: tuple[datetime, datetime] | None) -> None:
    if marked is not None:
        ax.axvspan(marked[0], marked[1], color="#e45756", alpha=0.12, label="incident")


def _time_axis(ax) -> None:
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M", tz=UTC))
    ax.tick_params(axis="x", labelsize=8, rotation=30)
    ax.grid(alpha=0.3)


def latency_plot(metrics: pd.DataFrame, marked) -> str | None:
    """p50 / p95 / p99 (ms) of total latency and of each stage, one panel each, over time."""
    stages = sorted({c.rsplit("_", 2)[0] for c in metrics.columns if c.endswith("_p50_ms")},
                    key=lambda s: (s != "total", s))
    if metrics.empty or not stages:
        return None
    cols = 2
    rows = math.ceil(len(stages) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(12, 2.8 * rows), squeeze=False, sharex=True)
    for ax, stage in zip(axes.flat, stages, strict=False):
        for label, color in STAGE_COLORS.items():
            for version, part in metrics.groupby("model_version"):
                style = "-" if version == metrics["model_version"].iloc[-1] else "--"
                ax.plot(part["period_start"], part[f"{stage}_{label}_ms"], style, color=color, lw=1.2,
                        label=f"{label} {version}")
        _mark(ax, marked)
        ax.set_title(f"{stage} latency (ms)", fontsize=10)
        _time_axis(ax)
    for ax in list(axes.flat)[len(stages):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7, ncol=3)
    fig.suptitle("latency percentiles per stage (dashed: earlier version)", fontsize=11)
    return _png(fig)


def traffic_plot(metrics: pd.DataFrame, marked) -> str | None:
    """Requests per hour and the error / timeout / reject rates, per model version."""
    if metrics.empty:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 5), sharex=True)
    for version, part in metrics.groupby("model_version"):
        # Per hour, not per period: a compacted stretch is read in periods longer than the rest.
        hours = (part["period_end"] - part["period_start"]).dt.total_seconds() / 3600
        top.plot(part["period_start"], part["requests"] / hours, label=version)
        for name in ("error_rate", "timeout_rate", "reject_rate"):
            bottom.plot(part["period_start"], part[name], label=f"{name} {version}")
    top.set_title("requests per hour", fontsize=10)
    bottom.set_title("failure rates (share of requests)", fontsize=10)
    for ax in (top, bottom):
        _mark(ax, marked)
        _time_axis(ax)
        ax.legend(fontsize=7, ncol=3)
    return _png(fig)


def drift_plot(findings: pd.DataFrame, marked) -> str | None:
    """PSI per field (and prediction) vs the reference, per window, all traffic."""
    rows = findings[findings["check"].isin(["drift", "prediction_drift"]) & findings["value"].notna()]
    if rows.empty:
        return None
    rows = rows.assign(field=[lab.get("field") or lab.get("output") for lab in rows["labels"]],
                       length=rows["window_end"] - rows["window_start"])
    rows = rows[rows["length"] == rows["length"].min()]  # the shortest windows: the finest time resolution
    fig, ax = plt.subplots(figsize=(12, 3.5))
    for field, part in rows.groupby("field"):
        ax.plot(part["window_start"], part["value"], marker=".", lw=1, label=field)
    ax.axhline(PSI_FLOOR, color="grey", ls=":", lw=1, label=f"PSI {PSI_FLOOR}")
    _mark(ax, marked)
    _time_axis(ax)
    ax.set_title("drift per field: PSI against the reference", fontsize=10)
    ax.legend(fontsize=7, ncol=4)
    return _png(fig)


def quality_plot(findings: pd.DataFrame) -> str | None:
    """Quality per group and class with its 95% interval, over the range (n-weighted), when labels exist."""
    rows = findings[(findings["check"] == "quality") & findings["value"].notna()]
    if rows.empty:
        return None
    rows = rows.assign(name=[f"{lab.get('metric', '?')} {lab.get('class', '')} [{lab.get('group', 'all')}]"
                             for lab in rows["labels"]])
    latest = rows.sort_values("window_start").groupby("name").tail(1).sort_values("name")
    fig, ax = plt.subplots(figsize=(12, max(2.5, 0.3 * len(latest))))
    low = (latest["value"] - latest["interval_low"]).clip(lower=0).fillna(0)
    high = (latest["interval_high"] - latest["value"]).clip(lower=0).fillna(0)
    ax.errorbar(latest["value"], range(len(latest)), xerr=[low, high], fmt="o", capsize=3)
    ax.set_yticks(range(len(latest)), [f"{n} (n={k})" for n, k in zip(latest["name"], latest["n"], strict=True)],
                  fontsize=8)
    ax.set_xlim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title("quality per group and class, latest scored window, with 95% intervals", fontsize=10)
    return _png(fig)


def coverage_plot(findings: pd.DataFrame, marked) -> str | None:
    """Share of predictions with a label, per window, when label coverage is stored."""
    rows = findings[(findings["check"] == "label_coverage") & findings["value"].notna()]
    if rows.empty:
        return None
    fig, ax = plt.subplots(figsize=(12, 3))
    for version, part in rows.groupby("model_version"):
        ax.plot(part["window_start"], part["value"], marker=".", label=version)
    _mark(ax, marked)
    _time_axis(ax)
    ax.set_ylim(0, 1.02)
    ax.set_title("label coverage (share of predictions labelled)", fontsize=10)
    ax.legend(fontsize=7)
    return _png(fig)


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
    reference = read_reference(service.reference.path)
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


def build_report(store: Store, service: Service, limits: Limits, *, since: datetime | None = None,
                 until: datetime | None = None, incident_id: int | None = None, evidently: bool = True,
                 now: datetime | None = None, observe: Observer | None = None) -> str:
    """The report's HTML for [since, until), or for incident `incident_id` (its windows, plus CONTEXT before).
    `observe` is told the raw rows read for Evidently's report (the rest comes from the store)."""
    now = now or datetime.now(UTC)
    marked = None
    title = f"tailwatch report — {service.name}"
    intro = []
    if incident_id is not None:
        frame = query.incidents(store, service.name, incident_id=incident_id)
        if frame.empty:
            raise ValueError(f"no incident {incident_id} for service {service.name}")
        inc = frame.iloc[0]
        first = (inc["first_window_start"] if pd.notna(inc["first_window_start"]) else inc["opened_at"]).to_pydatetime()
        last = next((t.to_pydatetime() for t in (inc["last_window_end"], inc["resolved_at"]) if pd.notna(t)), now)
        marked = (first, last)
        since = since or first - CONTEXT
        until = until or last + timedelta(hours=1)
        title += f", incident {incident_id} ({inc['verdict']}, {inc['status']})"
        intro.append(f"incident {incident_id}: verdict <b>{html.escape(str(inc['verdict']))}</b>, "
                     f"model version {html.escape(str(inc['model_version']))}, windows "
                     f"{first:%Y-%m-%d %H:%M} .. {last:%Y-%m-%d %H:%M} UTC (shaded)")
    if since is None or until is None:
        raise ValueError("give --since and --until, or --incident")
    step = _step(since, until)
    metrics = history.metrics(store, service.name, since=since, until=until, every=step)
    findings = query.findings(store, service.name, since=since, until=until, segment="all")
    sections = [("Latency per stage", latency_plot(metrics, marked), "no stored buckets in the range"),
                ("Traffic and failures", traffic_plot(metrics, marked), "no stored buckets in the range"),
                ("Quality per group", quality_plot(findings), "no quality findings (labels not scored yet)"),
                ("Drift per field", drift_plot(findings, marked), "no drift findings (no reference profile?)"),
                ("Label coverage", coverage_plot(findings, marked), "no label coverage findings")]
    breaches = query.group_findings(findings[findings["status"] == "breach"], ["check", "model_version", "labels"])
    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<p>{since:%Y-%m-%d %H:%M} .. {until:%Y-%m-%d %H:%M} UTC, one point per {_human(step)}; "
             f"generated {now:%Y-%m-%d %H:%M} UTC.</p>"]
    parts += [f"<p>{line}</p>" for line in intro]
    for name, png, missing in sections:
        parts.append(f"<h2>{html.escape(name)}</h2>")
        parts.append(f'<img class="plot" alt="{html.escape(name)}" src="data:image/png;base64,{png}">' if png
                     else f'<p class="none">{html.escape(missing)}</p>')
    parts.append("<h2>Breaching findings</h2>")
    parts.append(_html_table(breaches.head(40)) if len(breaches) else '<p class="none">none in the range</p>')
    parts.append("<h2>Evidently data drift report</h2>")
    if evidently:
        doc, note = evidently_html(service, limits, since, until, observe)
        if doc is None:
            parts.append(f'<p class="none">not included: {html.escape(note)}</p>')
        else:
            parts.append(f"<p>{html.escape(note)}; Evidently's own page, embedded (inline, no network).</p>")
            parts.append(f'<iframe id="evidently" title="Evidently data drift" srcdoc="{html.escape(doc, quote=True)}">'
                         "</iframe>")
    else:
        parts.append('<p class="none">not requested</p>')
    return _PAGE.format(title=html.escape(title), body="\n".join(parts))


def _step(since: datetime, until: datetime) -> timedelta:
    """One point per 5 min up to a day, then coarser: at most ~300 points per line."""
    span = (until - since).total_seconds()
    for minutes in (5, 15, 60, 360, 1440):
        if span / (minutes * 60) <= 300:
            return timedelta(minutes=minutes)
    return timedelta(days=7)


def _human(step: timedelta) -> str:
    minutes = int(step.total_seconds() // 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h"


def _html_table(frame: pd.DataFrame) -> str:
    from monitor.investigate.output import cell

    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell(v))}</td>" for v in row) + "</tr>"
                   for row in frame.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
img.plot {{ max-width: 100%; border: 1px solid #ddd; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
td, th {{ border: 1px solid #ddd; padding: 2px 6px; text-align: left; }}
p.none {{ color: #888; }}
iframe {{ width: 100%; height: 900px; border: 1px solid #ddd; }}
</style></head>
<body>
{body}
</body></html>
"""
