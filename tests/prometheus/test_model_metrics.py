"""Model metrics on /metrics: the values are the stored findings and verdicts of each version's last closed
window, a second reader (another replica, a restart) exports the same text, and the series count stays
under the documented cap for a wide service."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor import config as config_mod
from monitor.daemon.health import Metrics
from monitor.daemon.model_metrics import ModelMetrics
from monitor.durations import duration_text
from monitor.verdicts.verdict import VERDICTS
from storage.store import Store


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every model sample of an exposition, by name and sorted labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def render(cfg, store, now) -> str:
    return Metrics(ModelMetrics(cfg, store, clock=lambda: now)).render().decode()


def newest(rows: list[dict], length: timedelta, **match) -> list[dict]:
    rows = [r for r in rows if r["window_end"] - r["window_start"] == length
            and all(r.get(k) == v for k, v in match.items())]
    end = max(r["window_end"] for r in rows)
    return [r for r in rows if r["window_end"] == end]


def key(name: str, **labels) -> tuple[str, tuple]:
    return name, tuple(sorted(labels.items()))


def test_values_are_the_stored_last_closed_window(filled_run):
    cfg, now = filled_run["config"], filled_run["now"]
    store = Store(cfg.storage.url)
    try:
        got = samples(render(cfg, store, now))
        with store.transaction() as session:
            findings = store.findings.load(session, "churn")
            verdicts = store.verdicts.load(session, "churn")
    finally:
        store.dispose()
    findings = [r | {"window_start": _utc(r["window_start"]), "window_end": _utc(r["window_end"])} for r in findings]
    checked = 0
    for version in ("v1", "v2"):
        for length in (timedelta(minutes=15), timedelta(hours=1)):
            base = {"service": "churn", "model_version": version, "window": duration_text(length)}
            last = [v for v in verdicts if v["model_version"] == version
                    and _utc(v["window_end"]) - _utc(v["window_start"]) == length][-1]
            for state in VERDICTS:
                assert got[key("tailwatch_verdict", **base, verdict=state)] == (state == last["verdict"])
            assert got[key("tailwatch_window_requests", **base)] == last["rows"]
            for r in newest(findings, length, check="latency", model_version=version):
                if r["labels"].keys() == {"stage", "quantile"}:
                    value = got[key("tailwatch_stage_latency_seconds", **base, **r["labels"])]
                    assert value == pytest.approx(r["value"] / 1000)
                    checked += 1
            for r in newest(findings, length, check="drift", model_version=version):
                if r["labels"].keys() == {"field"}:
                    assert got[key("tailwatch_field_drift_psi", **base, **r["labels"])] == pytest.approx(r["value"])
                    checked += 1
    # v2 is the slower version; its cache hit rate fell.
    assert got[key("tailwatch_verdict", service="churn", model_version="v2", window="1h", verdict="slower")] == 1
    quality = newest(findings, timedelta(hours=1), check="quality", model_version="v2")
    assert quality, "the scenario stores matured quality"
    for r in quality:
        base = {"service": "churn", "model_version": "v2", "window": "1h", **r["labels"]}
        if r["value"] is not None:
            assert got[key("tailwatch_quality_score", **base)] == pytest.approx(r["value"])
        assert got[key("tailwatch_quality_samples", **base)] == r["n"]
        checked += 1
    assert checked > 100


def test_another_reader_exports_the_same_text(filled_run):
    cfg, now = filled_run["config"], filled_run["now"]
    texts = []
    for _ in range(2):  # two stores, two collectors: a replica or a restarted daemon
        store = Store(cfg.storage.url)
        try:
            texts.append("\n".join(line for line in render(cfg, store, now).splitlines() if "tailwatch_" in line
                                   and "heartbeat" not in line))
        finally:
            store.dispose()
    assert texts[0] == texts[1] and "tailwatch_stage_latency_seconds{" in texts[0]


def test_metrics_config_chooses_what_is_exported(filled_run):
    cfg, now = filled_run["config"], filled_run["now"]
    narrow = cfg.model_copy(update={"metrics": cfg.metrics.model_copy(update={
        "families": ["verdict", "drift"], "fields": ["tenure"], "windows": [timedelta(hours=1)]})})
    off = cfg.model_copy(update={"metrics": cfg.metrics.model_copy(update={"enabled": False})})
    store = Store(cfg.storage.url)
    try:
        names = {(n, dict(labels).get("field"), dict(labels).get("window")) for n, labels in
                 samples(render(narrow, store, now))}
        disabled = samples(render(off, store, now))
    finally:
        store.dispose()
    model = {n for n in names if n[0] not in ("tailwatch_model_series", "tailwatch_model_series_dropped_total")
             and not n[0].startswith(("tailwatch_outbox", "tailwatch_active", "tailwatch_is_leader",
                                      "tailwatch_heartbeat", "tailwatch_notifications"))}
    assert {n[0] for n in model} == {"tailwatch_verdict", "tailwatch_window_requests", "tailwatch_segment_requests",
                                     "tailwatch_window_end_timestamp_seconds", "tailwatch_field_drift_psi"}
    assert {n[1] for n in model if n[0] == "tailwatch_field_drift_psi"} == {"tenure"}
    assert {n[2] for n in model} == {"1h"}
    assert disabled[key("tailwatch_model_series")] == 0
    with pytest.raises(config_mod.ConfigError, match="not features of any service"):
        config_mod.parse({**_raw_wide(filled_run["root"]), "metrics": {"fields": ["nope"]}},
                         base_dir=filled_run["root"])


# --- cardinality ---

FIELDS, GROUPS, CLASSES, STAGES, QUANTILES = 50, 20, 5, 6, ("p50", "p95", "p99")
SEGMENTS, SIGNALS = 30, 2  # segment values (more than top_k: the busiest are exported) and declared signals
METRICS = ("precision", "recall", "f1", "roc_auc")
WINDOWS = (timedelta(minutes=15), timedelta(hours=1), timedelta(days=1))


def _raw_wide(root) -> dict:
    (root / "wide-logs").mkdir(exist_ok=True)
    return {
        "storage": {"url": f"sqlite:///{root / 'wide.db'}"},
        "services": [{
            "name": "wide",
            "sources": {"predictions": {"kind": "files", "path": str(root / "wide-logs")},
                        "labels": {"kind": "files", "path": str(root / "wide-logs")}},
            "schema": {"features": {f"f{i:02d}": "numeric" for i in range(FIELDS)},
                       "classes": [f"c{i}" for i in range(CLASSES)]},
            "buckets": {"size": "5m", "windows": ["15m", "1h", "1d"]},
            "quality": {"windows": ["1d"], "groups": {f"g{i:02d}": f"f{i:02d} > 0" for i in range(GROUPS)}},
        }],
    }


def _wide_rows(version: str, now: datetime) -> tuple[list[dict], list[dict]]:
    findings, verdicts = [], []

    def add(check, labels, value, length, n=100):
        findings.append({"service": "wide", "check": check, "model_version": version, "window_start": now - length,
                         "window_end": now, "status": "ok", "labels": labels, "value": value, "n": n})

    for length in WINDOWS:
        verdicts.append({"service": "wide", "model_version": version, "window_start": now - length,
                         "window_end": now, "verdict": "healthy", "rows": 1000})
        for s in range(STAGES):
            for q in QUANTILES:
                add("latency", {"stage": f"s{s}", "quantile": q}, 12.0, length)
                add("latency", {"stage": f"s{s}", "quantile": q, "segment": "x=1"}, 12.0, length)
        for rate in ("failure", "timeout", "reject"):
            add("latency", {"rate": rate}, 0.01, length)
        for j in range(SEGMENTS):
            seg = f"x={j}"
            for stage in ("total", "ttft"):
                for q in QUANTILES:
                    add("latency", {"stage": stage, "quantile": q, "segment": seg}, 12.0, length)
            for rate in ("failure", "timeout", "reject"):
                add("latency", {"rate": rate, "segment": seg}, 0.01, length, n=100 + j)
            for sig in range(SIGNALS):
                add("service_signal", {"signal": f"sig{sig}", "segment": seg}, 0.5, length)
        for sig in range(SIGNALS):
            add("service_signal", {"signal": f"sig{sig}"}, 0.5, length)
        add("latency", {"throughput": "samples"}, 3.0, length)
        add("cache_hit_rate", {}, 0.5, length)
        for i in range(FIELDS):
            for check in ("missing_rate", "drift", "out_of_range"):
                add(check, {"field": f"f{i:02d}"}, 0.01, length)
        for output in ["prediction"] + [f"score:c{i}" for i in range(CLASSES)]:
            add("prediction_drift", {"output": output}, 0.02, length)
    for g in ["all"] + [f"g{i:02d}" for i in range(GROUPS)]:
        for c in [f"c{i}" for i in range(CLASSES)] + ["macro", "all"]:
            for m in METRICS:
                add("quality", {"metric": m, "class": c, "group": g}, 0.8, timedelta(days=1),
                    n=1000 if g == "all" else 10 + int(g[1:]))
    return findings, verdicts


def test_wide_service_stays_under_the_cap_and_the_rest_is_counted(tmp_path):
    cfg = config_mod.parse(_raw_wide(tmp_path), base_dir=tmp_path)
    now = datetime(2026, 3, 2, tzinfo=UTC)
    store = Store(cfg.storage.url)
    store.upgrade()
    try:
        with store.transaction() as session:
            for version in ("v1", "v2"):
                findings, verdicts = _wide_rows(version, now)
                store.findings.upsert(session, findings)
                store.verdicts.upsert(session, verdicts)
        got = samples(render(cfg, store, now))
        # The formula of docs/prometheus.md, per version: per window W: 9 + S*Q + 5 + 3*top_k + (1 + C) + G
        # + top_k segments * (1 + 2*Q + 3 + G); per quality window: top_k groups * (C + 2) * M * 2.
        k = cfg.metrics.top_k
        per_window = (9 + STAGES * len(QUANTILES) + 5 + 3 * k + (1 + CLASSES) + SIGNALS
                      + k * (1 + 2 * len(QUANTILES) + 3 + SIGNALS))
        expected = 2 * (len(WINDOWS) * per_window + k * (CLASSES + 2) * len(METRICS) * 2)
        assert got[key("tailwatch_model_series")] == expected <= cfg.metrics.max_series
        assert got[key("tailwatch_model_series_dropped_total")] == 0
        segments = {dict(labels)["segment"] for n, labels in got if n.startswith("tailwatch_segment_")}
        assert segments == {f"x={j}" for j in range(SEGMENTS - k, SEGMENTS)}  # the busiest top_k
        groups = {dict(labels)["group"] for n, labels in got if n == "tailwatch_quality_score"}
        assert groups == {"all", "g19", "g18", "g17", "g16", "g15", "g14", "g13", "g12", "g11"}  # the largest

        small = cfg.model_copy(update={"metrics": cfg.metrics.model_copy(update={"max_series": 100})})
        collector = ModelMetrics(small, store, clock=lambda: now)
        metrics = Metrics(collector)
        first = samples(metrics.render().decode())
        second = samples(metrics.render().decode())
        assert first[key("tailwatch_model_series")] == 100
        assert first[key("tailwatch_model_series_dropped_total")] == expected - 100
        assert second[key("tailwatch_model_series_dropped_total")] == 2 * (expected - 100)
        # Verdicts come first: a cap never hides the verdict.
        assert sum(1 for n, _ in first if n == "tailwatch_verdict") == 2 * len(WINDOWS) * len(VERDICTS)
    finally:
        store.dispose()


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=UTC)
