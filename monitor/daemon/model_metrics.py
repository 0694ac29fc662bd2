"""The monitored model's figures as Prometheus series: for each service, model version and window length, the
last closed window's stored findings and verdict. Read from the store at each scrape, so every replica and a
restarted daemon export the same numbers. What is exported and how many series: the `metrics:` config."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from monitor.config import Config, MetricsExport, Service
from monitor.durations import duration_text
from monitor.verdicts.verdict import HARMFUL, VERDICTS
from storage.store import Store

BASE = ("service", "model_version", "window")

# name -> (help, extra labels), in export order within a family.
SERIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "tailwatch_verdict": ("1 for the verdict of the last closed window, 0 for the other states.", ("verdict",)),
    "tailwatch_window_requests": ("Requests in the last closed window.", ()),
    "tailwatch_window_end_timestamp_seconds": ("Unix time the last closed window ended.", ()),
    "tailwatch_stage_latency_seconds": ("Latency quantile per stage ('total': the whole request).",
                                        ("stage", "quantile")),
    "tailwatch_failed_requests_ratio": ("Share of requests that failed, timed out or were rejected.", ("reason",)),
    "tailwatch_throughput_requests_per_second": ("Requests per second over the window.", ()),
    "tailwatch_cache_hit_ratio": ("Share of cache lookups that hit.", ()),
    "tailwatch_field_missing_ratio": ("Share of rows with the field missing.", ("field",)),
    "tailwatch_field_out_of_range_ratio": ("Share of present numeric values outside the reference range.",
                                           ("field",)),
    "tailwatch_field_unseen_ratio": ("Share of present categorical values the reference never had.", ("field",)),
    "tailwatch_field_drift_psi": ("Population stability index of the field against its baseline.", ("field",)),
    "tailwatch_prediction_drift_psi": ("Population stability index of the predictions against their baseline.",
                                       ("output",)),
    "tailwatch_quality_score": ("Quality metric from matured labels (0..1; log loss in nats).",
                                ("metric", "class", "group")),
    "tailwatch_quality_samples": ("Labelled predictions the quality score rests on (its n).",
                                  ("metric", "class", "group")),
    "tailwatch_signal_mean": ("Mean of a declared service signal, in its own unit.", ("signal",)),
    "tailwatch_segment_requests": ("Requests of one segment in the last closed window.", ("segment",)),
    "tailwatch_segment_latency_seconds": ("Latency quantile of one segment ('total': the whole request; 'ttft': "
                                          "time to first token).", ("segment", "stage", "quantile")),
    "tailwatch_segment_failed_requests_ratio": ("Share of one segment's requests that failed, timed out or were "
                                                "rejected.", ("segment", "reason")),
    "tailwatch_segment_signal_mean": ("Mean of a declared service signal over one segment's requests.",
                                      ("segment", "signal")),
}
SEGMENT_STAGES = ("total", "ttft")  # a segment's stages exported: the request and its first token
CHECKS = {"verdict": ("latency",), "latency": ("latency", "service_signal"), "failures": ("latency",), "throughput": ("latency",), "cache": ("cache_hit_rate",),
          "completeness": ("missing_rate",), "ranges": ("out_of_range", "unseen_categories"), "drift": ("drift",),
          "prediction_drift": ("prediction_drift",), "quality": ("quality",)}
PER_FIELD = {"missing_rate": "tailwatch_field_missing_ratio", "out_of_range": "tailwatch_field_out_of_range_ratio",
             "unseen_categories": "tailwatch_field_unseen_ratio", "drift": "tailwatch_field_drift_psi"}
FIELD_FAMILY = {"missing_rate": "completeness", "out_of_range": "ranges", "unseen_categories": "ranges",
                "drift": "drift"}


@dataclass
class Series:
    """Samples collected under a cap: past `cap` a sample is counted in `dropped`, not kept."""

    cap: int
    samples: dict[str, list[tuple[tuple[str, ...], float]]] = field(default_factory=dict)
    count: int = 0
    dropped: int = 0

    def add(self, name: str, labels: tuple[str, ...], value: float | None) -> None:
        if value is None:
            return
        if self.count >= self.cap:
            self.dropped += 1
            return
        self.samples.setdefault(name, []).append((labels, float(value)))
        self.count += 1


class ModelMetrics(Collector):
    """A prometheus_client collector of the model's figures; `clock` gives the time windows are closed at."""

    def __init__(self, config: Config, store: Store, clock: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self.config, self.store, self.clock = config, store, clock
        self.dropped_total = 0

    def describe(self) -> list[Metric]:
        return []  # registering must not read the store

    def collect(self) -> Iterator[Metric]:
        spec = self.config.metrics
        series = Series(spec.max_series)
        if spec.enabled:
            now = self.clock()
            for service in self.config.services:
                self._service(spec, service, now, series)
        self.dropped_total += series.dropped
        for name, (doc, extra) in SERIES.items():
            if name in series.samples:
                family = GaugeMetricFamily(name, doc, labels=BASE + extra)
                for labels, value in series.samples[name]:
                    family.add_metric(labels, value)
                yield family
        yield GaugeMetricFamily("tailwatch_model_series", "Model series exported by the last scrape.",
                                value=series.count)
        yield CounterMetricFamily("tailwatch_model_series_dropped", "Model series left out because the "
                                  "metrics.max_series cap was reached.", value=self.dropped_total)

    def _service(self, spec: MetricsExport, service: Service, now: datetime, series: Series) -> None:
        chosen = set(spec.windows) or None
        windows = [w for w in service.buckets.windows if chosen is None or w in chosen]
        quality = service.quality
        q_windows = [w for w in (quality.windows if quality else []) if chosen is None or w in chosen]
        checks = sorted({c for f in spec.families for c in CHECKS.get(f, ())} - {"quality"})
        scored = quality is not None and "quality" in spec.families
        step = timedelta(microseconds=1)  # load_findings' `until` is exclusive: include windows ending at `now`
        with self.store.transaction() as session:
            verdicts = self.store.verdicts.load(session, service.name, since=now - spec.lookback, until=now)
            # A version with an open incident is not healthy, whatever one window says (the episode holds
            # until its signals are back): its verdict series say the incident's kind.
            held = {i["model_version"]: i["verdict"] for i in self.store.incidents.load(
                session, service.name, status="open") if i["model_version"] and i["verdict"] in HARMFUL + ("drift",)}
            # One query per check and length: each reads the windows that may be its last closed one, and
            # only its own rows (a window holds many more findings of other checks and of segments).
            rows = {w: [r for c in checks for r in self.store.findings.load(
                session, service.name, since=now - spec.lookback - w, until=now - w + step, check=c)]
                for w in windows}
            q_rows = {w: self.store.findings.load(
                session, service.name, since=now - spec.lookback - quality.maturity_horizon - w,
                until=now - w + step, check="quality") for w in q_windows} if scored else {}
        fields = spec.fields or list(service.schema_.features)[:spec.top_k]
        per_window: dict[tuple[str, timedelta], dict[str, list[dict]]] = {}
        for length, found in [*rows.items(), *q_rows.items()]:
            for (version, check), newest in _last_closed(found, length, now).items():
                per_window.setdefault((version, length), {})[check] = newest
        last_verdict = {(v["model_version"], _utc(v["window_end"]) - _utc(v["window_start"])): v for v in verdicts}
        for family in spec.families:
            if family == "verdict":
                for (version, length), v in sorted(last_verdict.items()):
                    if length in windows:
                        _verdict(series, (service.name, version, duration_text(length)), v, held.get(version))
                for (version, length), checks in sorted(per_window.items()):
                    _segments(series, family, (service.name, version, duration_text(length)), checks, spec.top_k)
                continue
            for (version, length), checks in sorted(per_window.items()):
                base = (service.name, version, duration_text(length))
                _family(series, family, base, checks, fields, spec)
                _segments(series, family, base, checks, spec.top_k)


def _last_closed(rows: list[dict], length: timedelta, now: datetime) -> dict[tuple[str, str], list[dict]]:
    """The findings of the newest closed window of `length`, per model version and check."""
    newest: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        end = _utc(r["window_end"])
        if end > now or end - _utc(r["window_start"]) != length:
            continue
        key = (r["model_version"], r["check"])
        kept = newest.get(key)
        if kept is None or _utc(kept[0]["window_end"]) < end:
            newest[key] = [r]
        elif _utc(kept[0]["window_end"]) == end:
            kept.append(r)
    return newest


def _verdict(series: Series, base: tuple[str, ...], v: dict[str, Any], incident: str | None = None) -> None:
    """The verdict series of one window; `incident`: the kind of an incident open on its version, said
    instead of `healthy`."""
    shown = incident if incident and v["verdict"] == "healthy" else v["verdict"]
    for state in VERDICTS:
        series.add("tailwatch_verdict", base + (state,), 1.0 if shown == state else 0.0)
    series.add("tailwatch_window_requests", base, v.get("rows"))
    series.add("tailwatch_window_end_timestamp_seconds", base, _utc(v["window_end"]).timestamp())


def _family(series: Series, family: str, base: tuple[str, ...], checks: dict[str, list[dict]],
            fields: list[str], spec: MetricsExport) -> None:
    """Add one family's series of one version's last closed window (all traffic; segments: _segments)."""
    if family in ("latency", "failures", "throughput"):
        for r in checks.get("latency", []):
            labels = r["labels"] or {}
            if family == "latency" and labels.keys() == {"stage", "quantile"}:
                value = None if r["value"] is None else r["value"] / 1000.0  # stored in ms
                series.add("tailwatch_stage_latency_seconds", base + (labels["stage"], labels["quantile"]), value)
            elif family == "failures" and labels.keys() == {"rate"}:
                series.add("tailwatch_failed_requests_ratio", base + (labels["rate"],), r["value"])
            elif family == "throughput" and labels.keys() == {"throughput"}:
                series.add("tailwatch_throughput_requests_per_second", base, r["value"])
        if family == "latency":
            for r in checks.get("service_signal", []):
                if (r["labels"] or {}).keys() == {"signal"}:
                    series.add("tailwatch_signal_mean", base + (r["labels"]["signal"],), r["value"])
    elif family == "cache":
        for r in checks.get("cache_hit_rate", []):
            if not r["labels"]:
                series.add("tailwatch_cache_hit_ratio", base, r["value"])
    elif family in ("completeness", "ranges", "drift"):
        for check, name in PER_FIELD.items():
            if FIELD_FAMILY[check] != family:
                continue
            by_field = {(r["labels"] or {}).get("field"): r for r in checks.get(check, [])
                        if (r["labels"] or {}).keys() == {"field"}}
            for f in fields:
                if f in by_field:
                    series.add(name, base + (f,), by_field[f]["value"])
    elif family == "prediction_drift":
        for r in checks.get("prediction_drift", []):
            if (r["labels"] or {}).keys() == {"output"}:
                series.add("tailwatch_prediction_drift_psi", base + (r["labels"]["output"],), r["value"])
    elif family == "quality":
        rows = [r for r in checks.get("quality", []) if (r["labels"] or {}).keys() == {"metric", "class", "group"}]
        groups = spec.groups or _largest_groups(rows, spec.top_k)
        for r in rows:
            labels = r["labels"]
            if labels["group"] in groups:
                key = base + (labels["metric"], labels["class"], labels["group"])
                series.add("tailwatch_quality_score", key, r["value"])
                series.add("tailwatch_quality_samples", key, r["n"])


def _segments(series: Series, family: str, base: tuple[str, ...], checks: dict[str, list[dict]], k: int) -> None:
    """One family's segment series of one version's last closed window: the `k` segments with the most
    requests (the n of their rate findings, which count every request), busiest first; the verdict family
    their request counts, latency their total and ttft quantiles and signal means, failures their rates."""
    if family not in ("verdict", "latency", "failures"):
        return
    rows = [r for r in checks.get("latency", []) if "segment" in (r["labels"] or {})]
    n: dict[str, int] = {}
    for r in rows:
        if r["labels"].keys() == {"segment", "rate"}:
            n[r["labels"]["segment"]] = max(n.get(r["labels"]["segment"], 0), int(r["n"] or 0))
    top = sorted(n, key=lambda seg: (-n[seg], seg))[:k]
    if family == "verdict":
        for seg in top:
            series.add("tailwatch_segment_requests", base + (seg,), n[seg])
        return
    chosen = set(top)
    for r in sorted(rows, key=lambda r: (top.index(r["labels"]["segment"]) if r["labels"]["segment"] in chosen
                                         else k, sorted(r["labels"].items()))):
        labels = r["labels"]
        if labels["segment"] not in chosen:
            continue
        if family == "latency" and labels.keys() == {"segment", "stage", "quantile"} \
                and labels["stage"] in SEGMENT_STAGES:
            value = None if r["value"] is None else r["value"] / 1000.0  # stored in ms
            series.add("tailwatch_segment_latency_seconds", base + (labels["segment"], labels["stage"],
                                                                    labels["quantile"]), value)
        elif family == "failures" and labels.keys() == {"segment", "rate"}:
            series.add("tailwatch_segment_failed_requests_ratio", base + (labels["segment"], labels["rate"]),
                       r["value"])
    if family == "latency":
        for r in checks.get("service_signal", []):
            labels = r["labels"] or {}
            if labels.keys() == {"segment", "signal"} and labels["segment"] in chosen:
                series.add("tailwatch_segment_signal_mean", base + (labels["segment"], labels["signal"]),
                           r["value"])


def _largest_groups(rows: list[dict], k: int) -> set[str]:
    """`all` and the other groups with the most labelled predictions, `k` in all."""
    n: dict[str, int] = {}
    for r in rows:
        n[r["labels"]["group"]] = max(n.get(r["labels"]["group"], 0), int(r["n"] or 0))
    others = sorted((g for g in n if g != "all"), key=lambda g: (-n[g], g))
    return {"all", *others[:k - 1]}


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)
