"""Plotly figures as plain JSON-ready dicts (data, layout): drawn in the browser by the plotly.js that the
`plotly` package bundles, so the pages need no network. Every axis names its unit; times are UTC. Numbers are
written in plain decimals (axes and hover text alike), never in scientific notation. A figure's title is in
its layout for whoever reads the JSON; the pages write it as a heading above the chart, clear of plotly's
toolbar."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import Any

import pandas as pd

from monitor.investigate.history import LOGGED, RATE_OF
from monitor.investigate.query import jsonable

PSI_FLOOR = 0.1  # the drift check's default PSI floor, drawn as a guide
COLORS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d", "#bab0ac")
INCIDENT_FILL = "rgba(228, 87, 86, 0.15)"
TIME_AXIS = {"type": "date", "title": {"text": "time (UTC)", "standoff": 8}, "tickformat": "%H:%M<br>%b %d",
             "tickangle": 0, "nticks": 6, "automargin": True}
# A numeric axis's ticks in plain decimals with thousands separated (plotly's default writes 1e-5 and 2B).
PLAIN = {"exponentformat": "none", "separatethousands": True}
# Hover text of a figure in its own unit: 3 significant digits in plain decimals (d3-format `r`).
DIGITS = ",.3~r"
# Room above the plot for plotly's toolbar (px), so it covers neither the plot's title nor its data.
TOOLBAR = 32
# Each status's rate (history's columns) as a chart names it: errors, timeouts, rejects, cancelled, truncated.
RATE_LABELS = {rate: status if status in LOGGED else f"{rate.split('_')[0]}s" for status, rate in RATE_OF.items()}


def _axis(axis: dict[str, Any]) -> dict[str, Any]:
    return axis if axis.get("type") in ("date", "category") else {**PLAIN, **axis}


def _layout(title: str, yaxis: dict[str, Any], xaxis: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"title": {"text": title, "font": {"size": 14}}, "xaxis": _axis(xaxis or dict(TIME_AXIS)),
            "yaxis": _axis({"automargin": True, **yaxis}), "margin": {"l": 16, "r": 16, "t": TOOLBAR, "b": 16},
            "height": 360, "autosize": True, "legend": {"orientation": "h", "yanchor": "top", "y": -0.35},
            "hovermode": "x unified", **{k: _axis(v) if k.startswith("yaxis") else v for k, v in extra.items()}}


def _times(values: Iterable[Any]) -> list[Any]:
    return [jsonable(v) for v in values]


def _values(values: Iterable[Any]) -> list[Any]:
    return [jsonable(v) for v in values]


def ranged(figure: dict[str, Any] | None, since: datetime, until: datetime) -> dict[str, Any] | None:
    """`figure` (a time chart, or None) with its time axis fixed to [since, until): the range the page
    shows, whether or not its data reaches either end."""
    if figure is not None:
        figure["layout"]["xaxis"] = {**figure["layout"]["xaxis"], "range": [jsonable(since), jsonable(until)]}
    return figure


def spans(incidents: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Shaded rectangles over the full height, one per incident ({start, end, name} with times)."""
    return [{"type": "rect", "xref": "x", "yref": "paper", "x0": jsonable(i["start"]), "x1": jsonable(i["end"]),
             "y0": 0, "y1": 1, "fillcolor": INCIDENT_FILL, "line": {"width": 0}, "layer": "below",
             "name": i["name"]} for i in incidents]


def vertical(at: datetime, name: str, color: str, dash: str = "solid") -> dict[str, Any]:
    """A full-height line at `at` named `name` (read by the browser tests)."""
    return {"type": "line", "xref": "x", "yref": "paper", "x0": jsonable(at), "x1": jsonable(at), "y0": 0,
            "y1": 1, "line": {"color": color, "width": 2, "dash": dash}, "name": name}


def stage_lines(metrics: pd.DataFrame, quantile: str, shapes: list[dict[str, Any]], title: str) -> dict[str, Any]:
    """`quantile` latency (ms) of the whole request and of each stage over time, all versions together."""
    stages = sorted({c.rsplit("_", 2)[0] for c in metrics.columns if c.endswith(f"_{quantile}_ms")},
                    key=lambda s: (s != "total", s))
    data = []
    for i, stage in enumerate(stages):
        frame = metrics.dropna(subset=[f"{stage}_{quantile}_ms"])
        data.append({"type": "scatter", "mode": "lines+markers", "name": stage, "x": _times(frame["period_start"]),
                     "y": _values(frame[f"{stage}_{quantile}_ms"]), "marker": {"size": 4},
                     "line": {"color": COLORS[i % len(COLORS)], "width": 3 if stage == "total" else 1.5},
                     "hovertemplate": f"%{{y:{DIGITS}}} ms"})
    return {"data": data, "layout": _layout(title, {"title": {"text": f"{quantile} latency (ms)"},
                                                     "rangemode": "tozero"}, shapes=shapes)}


def traffic(metrics: pd.DataFrame, shapes: list[dict[str, Any]]) -> dict[str, Any]:
    """Requests per hour (left axis) and the error, timeout and reject rates in % (right axis), and the
    cancelled and truncated rates where the range holds one (history's columns)."""
    hours = (metrics["period_end"] - metrics["period_start"]).dt.total_seconds() / 3600
    data = [{"type": "bar", "name": "requests per hour", "x": _times(metrics["period_start"]),
             "y": _values(metrics["requests"] / hours), "marker": {"color": "#bab0ac"},
             "hovertemplate": "%{y:,.0f} req/h"}]
    for i, (name, label) in enumerate(RATE_LABELS.items()):
        if name in metrics:
            data.append({"type": "scatter", "mode": "lines", "name": f"{label} (%)", "yaxis": "y2",
                         "x": _times(metrics["period_start"]), "y": _values(metrics[name] * 100),
                         "line": {"color": COLORS[(i + 3) % len(COLORS)]}, "hovertemplate": "%{y:.2f} %"})
    return {"data": data, "layout": _layout(
        "Traffic and failures", {"title": {"text": "requests per hour"}, "rangemode": "tozero"}, shapes=shapes,
        yaxis2={"title": {"text": "failure rate (%)"}, "overlaying": "y", "side": "right", "rangemode": "tozero",
                "automargin": True})}


def cache(metrics: pd.DataFrame, shapes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Cache hit rate (%) over time; None when the service logs no cache outcome."""
    if "cache_hit_rate" not in metrics or metrics["cache_hit_rate"].isna().all():
        return None
    frame = metrics.dropna(subset=["cache_hit_rate"])
    data = [{"type": "scatter", "mode": "lines+markers", "name": "cache hit rate", "x": _times(frame["period_start"]),
             "y": _values(frame["cache_hit_rate"] * 100), "marker": {"size": 4}, "hovertemplate": "%{y:.1f} %"}]
    return {"data": data, "layout": _layout("Cache hit rate", {"title": {"text": "hits (% of lookups)"},
                                                               "range": [0, 100]}, shapes=shapes)}


def drift(findings: pd.DataFrame, shapes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """PSI against the reference per field, per window (the shortest windows stored), all traffic."""
    rows = findings[findings["check"].isin(["drift", "prediction_drift"]) & findings["value"].notna()]
    if rows.empty:
        return None
    rows = rows.assign(field=[lab.get("field") or lab.get("output") or "prediction" for lab in rows["labels"]],
                       length=rows["window_end"] - rows["window_start"])
    rows = rows[rows["length"] == rows["length"].min()]
    data = [{"type": "scatter", "mode": "lines+markers", "name": str(field), "x": _times(part["window_start"]),
             "y": _values(part["value"]), "marker": {"size": 4}, "line": {"color": COLORS[i % len(COLORS)]},
             "hovertemplate": "PSI %{y:.3f}"}
            for i, (field, part) in enumerate(rows.groupby("field"))]
    guide = {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": PSI_FLOOR, "y1": PSI_FLOOR,
             "line": {"color": "grey", "dash": "dot", "width": 1}, "name": f"PSI {PSI_FLOOR}"}
    return {"data": data, "layout": _layout("Drift per field against the reference",
                                            {"title": {"text": "PSI (unitless)"}, "rangemode": "tozero"},
                                            shapes=[*shapes, guide])}


def quality_lines(findings: pd.DataFrame, shapes: list[dict[str, Any]],
                  wanted: Collection[tuple[str, str]] = ()) -> dict[str, Any] | None:
    """Matured quality over time, all traffic (group `all`), one line per model version, metric and class,
    from the label-quality findings of the shortest quality window; only the (metric, class) pairs in
    `wanted` when given (the acceptance rules'). None when no window is scored."""
    rows = findings[(findings["check"] == "quality") & findings["value"].notna()]
    keep = [(lab or {}).get("group", "all") == "all"
            and (not wanted or ((lab or {}).get("metric"), (lab or {}).get("class")) in wanted) for lab in rows["labels"]]
    rows = rows[pd.Series(keep, index=rows.index, dtype=bool)]
    if rows.empty:
        return None
    rows = rows[(rows["window_end"] - rows["window_start"]) == (rows["window_end"] - rows["window_start"]).min()]
    rows = rows.assign(name=[f"{v or '-'} {lab.get('metric', '?')} {lab.get('class', '')}".strip()
                             for v, lab in zip(rows["model_version"], rows["labels"], strict=True)])
    data = [{"type": "scatter", "mode": "lines+markers", "name": name, "x": _times(part["window_start"]),
             "y": _values(part["value"]), "customdata": _values(part["n"]), "marker": {"size": 5},
             "line": {"color": COLORS[i % len(COLORS)]}, "hovertemplate": "%{y:.3f} (n=%{customdata:,})"}
            for i, (name, part) in enumerate(rows.sort_values("window_start").groupby("name"))]
    return {"data": data, "layout": _layout("Matured quality (labelled windows)",
                                            {"title": {"text": "metric value (0..1)"}, "range": [0, 1.02]},
                                            shapes=shapes)}


def signal_lines(metrics: pd.DataFrame, signal: str, shapes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A declared service signal's mean and p95 over time (in the unit it is logged in), all versions
    together; None when no period holds it."""
    columns = [c for c in (f"{signal}_mean", f"{signal}_p95") if c in metrics]
    if not columns or metrics[columns].isna().all().all():
        return None
    data = []
    for i, column in enumerate(columns):
        frame = metrics.dropna(subset=[column])
        data.append({"type": "scatter", "mode": "lines+markers", "name": column.rsplit("_", 1)[1],
                     "x": _times(frame["period_start"]), "y": _values(frame[column]), "marker": {"size": 4},
                     "line": {"color": COLORS[i % len(COLORS)], "width": 2.5 if i == 0 else 1.5},
                     "hovertemplate": f"%{{y:{DIGITS}}}"})
    return {"data": data, "layout": _layout(f"Signal {signal}: mean and p95",
                                            {"title": {"text": f"{signal} (as logged)"}}, shapes=shapes)}


def stacked_stages(before: dict[str, float], during: dict[str, float]) -> dict[str, Any]:
    """Mean ms per request spent in each stage, before vs during, stacked (means add up; quantiles do not)."""
    names = sorted(set(before) | set(during))
    data = [{"type": "bar", "name": stage, "x": ["before", "during"], "y": [before.get(stage), during.get(stage)],
             "marker": {"color": COLORS[i % len(COLORS)]}, "hovertemplate": f"{stage}: %{{y:.2f}} ms"}
            for i, stage in enumerate(names)]
    return {"data": data, "layout": _layout("Mean time per request by stage", {"title": {"text": "mean ms per request"}},
                                            {"title": {"text": "span"}, "type": "category", "automargin": True},
                                            barmode="stack", hovermode="closest")}


def failure_bars(before: dict[str, float | None], during: dict[str, float | None]) -> dict[str, Any]:
    """Error, timeout and reject rates (%) before vs during (partial_metrics of each span); the cancelled and
    truncated rates too when either span holds one (0 in a span with requests and none)."""
    logged = {RATE_OF[s] for s in LOGGED}
    names = [n for n in RATE_LABELS if n not in logged or n in before or n in during]

    def rate(values: dict[str, float | None], name: str) -> float | None:
        value = values.get(name, 0.0 if name in logged and values.get("requests") else None)
        return None if value is None else value * 100

    data = [{"type": "bar", "name": span, "x": [RATE_LABELS[n] for n in names], "y": [rate(values, n) for n in names],
             "hovertemplate": "%{y:.2f} %"} for span, values in (("before", before), ("during", during))]
    return {"data": data, "layout": _layout("Failure rates", {"title": {"text": "share of requests (%)"},
                                                              "rangemode": "tozero"},
                                            {"title": {"text": "outcome"}, "type": "category", "automargin": True},
                                            barmode="group", hovermode="closest")}


def histogram(field: str, detail: dict[str, Any]) -> dict[str, Any] | None:
    """A drifting field's window vs reference, as the share of rows per reference bin (%)."""
    ref, win = detail.get("reference"), detail.get("window")
    if not ref or not win or len(ref) != len(win):
        return None
    labels = [f"bin {i + 1}" for i in range(len(ref))]
    data = [{"type": "bar", "name": name, "x": labels, "y": [100 * c / (sum(counts) or 1) for c in counts],
             "hovertemplate": "%{y:.1f} % of rows"} for name, counts in (("reference", ref), ("during", win))]
    return {"data": data, "layout": _layout(f"{field}: share of rows per reference bin",
                                            {"title": {"text": "rows (%)"}, "rangemode": "tozero"},
                                            {"title": {"text": "reference bin"}, "type": "category", "automargin": True},
                                            barmode="group", hovermode="closest", height=260)}


def intervals(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Quality per rule, class and group: the value with its 95% interval, the accepted version's (or the
    reference's) value and, for an acceptance rule, its floor as markers; values 0..1."""
    rows = [r for r in rows if r.get("value") is not None]
    if not rows:
        return None
    names = [r["name"] for r in rows]
    low = [max(r["value"] - r["interval"][0], 0) if r.get("interval") else 0 for r in rows]
    high = [max(r["interval"][1] - r["value"], 0) if r.get("interval") else 0 for r in rows]
    data = [{"type": "scatter", "mode": "markers", "name": "during (95% interval)", "y": names,
             "x": [r["value"] for r in rows], "error_x": {"type": "data", "array": high, "arrayminus": low},
             "marker": {"size": 9, "color": COLORS[3]}, "hovertemplate": "%{x:.3f}"},
            {"type": "scatter", "mode": "markers", "name": "accepted version", "y": names,
             "x": [r.get("baseline") for r in rows], "marker": {"symbol": "line-ns-open", "size": 16,
                                                               "color": COLORS[0]}, "hovertemplate": "%{x:.3f}"}]
    if any(r.get("floor") is not None for r in rows):
        data.append({"type": "scatter", "mode": "markers", "name": "floor", "y": names,
                     "x": [r.get("floor") for r in rows], "marker": {"symbol": "triangle-right", "size": 10,
                                                                    "color": "grey"}, "hovertemplate": "%{x:.3f}"})
    return {"data": data, "layout": _layout("Quality per rule, class and group",
                                            {"type": "category", "automargin": True, "autorange": "reversed"},
                                            {"title": {"text": "metric value (0..1)"}, "range": [0, 1.02], "automargin": True},
                                            hovermode="closest", height=max(220, 40 * len(rows) + 120))}


def quarantine(counts: pd.DataFrame) -> dict[str, Any] | None:
    """Quarantined rows per reason, per tick, over time (stacked bars)."""
    if counts.empty:
        return None
    data = [{"type": "bar", "name": str(reason), "x": _times(part["first"]), "y": _values(part["rows"]),
             "hovertemplate": "%{y:,} rows"} for reason, part in counts.groupby("reason")]
    return {"data": data, "layout": _layout("Quarantined rows by reason", {"title": {"text": "rows per tick"}},
                                            barmode="stack")}
