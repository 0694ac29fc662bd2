"""Segment breaches in the verdict, on synthetic findings of a generation service split by `lang`: when one
segment's own service regression is `slower` (and for which segment), what the attribution, evidence and
summary then say, and `tailwatch_verdict` while an incident is open. End to end: tests/alerts/
test_segment_slowdown.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from monitor.verdicts.verdict import decide

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=15)
LANGS = {"en": 600, "es": 170, "de": 110}  # requests per segment in the window


def f(check: str, labels: dict, status: str = "ok", value: float = 1.0, baseline: float = 1.0, n: int = 880) -> dict:
    return {"check": check, "labels": labels, "status": status, "value": value, "baseline": baseline, "n": n,
            "model_version": "llm-7b", "window_start": T0, "window_end": T1, "detail": {}}


def window(slow: dict[str, float], signal: dict[str, tuple[float, float]], *, whole: float = 1.0,
           queue: bool = True) -> list[dict]:
    """Findings of one window: total p95 per segment (ratio `slow[lang]`, breaching from 1.5x), spec_accept
    per segment (`signal[lang]`: value, baseline; breaching when they differ), the same for all traffic
    (`whole`), and a diurnal queue depth of all traffic that breached (`queue`)."""
    out = [f("latency", {"rate": r}, value=0.0, baseline=0.0) for r in ("failure", "timeout", "reject")]
    out.append(f("latency", {"stage": "total", "quantile": "p95"}, "breach" if whole >= 1.5 else "ok",
                 800.0 * whole, 800.0))
    out.append(f("service_signal", {"signal": "queue_depth"}, "breach" if queue else "ok", 3.1 if queue else 1.2, 1.2))
    for lang, n in LANGS.items():
        seg = {"segment": f"lang={lang}"}
        ratio = slow.get(lang, 1.0)
        out += [f("latency", {**seg, "rate": r}, value=0.0, baseline=0.0, n=n) for r in ("failure", "timeout", "reject")]
        out.append(f("latency", {**seg, "stage": "total", "quantile": "p95"}, "breach" if ratio >= 1.5 else "ok",
                     800.0 * ratio, 800.0, n))
        out.append(f("latency", {**seg, "stage": "decode", "quantile": "p95"}, "breach" if ratio >= 1.5 else "ok",
                     700.0 * ratio, 700.0, n))
        value, base = signal.get(lang, (0.71, 0.71))
        out.append(f("service_signal", {**seg, "signal": "spec_accept"}, "breach" if value != base else "ok",
                     value, base, n))
    return out


def burst(rates: dict[str, tuple[float, str]]) -> list[dict]:
    """A window where every latency held and each segment's reject rate is `rates[lang]` (value, status)
    against a baseline of none; all traffic's rate is their mix and held (a clump widens its interval)."""
    out = [g for g in window({}, {}, queue=False) if g["labels"].get("rate") != "reject"]
    n = sum(LANGS.values())
    mix = sum(rates.get(lang, (0.0, "ok"))[0] * k for lang, k in LANGS.items()) / n
    out.append(f("latency", {"rate": "reject"}, value=mix, baseline=0.0))
    for lang, k in LANGS.items():
        value, status = rates.get(lang, (0.0, "ok"))
        out.append(f("latency", {"segment": f"lang={lang}", "rate": "reject"}, status, value, 0.0, k))
    return out


CASES = {
    "a client's burst of rejects spread over every segment, one of them breaching: no segment's": (
        burst({"en": (0.052, "ok"), "es": (0.045, "ok"), "de": (0.063, "breach")}), "healthy", None, "healthy"),
    "one segment's rejects, the others held": (
        burst({"de": (0.063, "breach"), "es": (0.004, "ok")}), "slower", "lang=de", "slower for segment lang=de"),

    # name: (window, verdict, segment named, summary starts with)
    "one segment slower, the others held": (
        window({"de": 2.0}, {"de": (0.21, 0.71)}), "slower", "lang=de", "slower for segment lang=de: p95 total"),
    "a segment's signal alone is no verdict": (window({}, {"de": (0.21, 0.71)}, queue=False), "healthy", None, "healthy"),
    "all traffic slower, one segment carries it": (
        window({"de": 2.0}, {"de": (0.21, 0.71)}, whole=1.6), "slower", "lang=de", "slower for segment lang=de"),
    "all traffic slower, one segment breaches, another 1.4x without breaching: the service": (
        window({"de": 2.0, "es": 1.4}, {}, whole=1.6), "slower", None, "slower: p95 total latency"),
    "all traffic and two segments slower: the service": (
        window({"de": 2.0, "es": 1.8}, {}, whole=1.6), "slower", None, "slower: p95 total latency 1,280 ms vs 800 ms"),
    "every segment slower, all traffic not: all traffic's word holds": (
        window({"de": 2.0, "es": 1.8, "en": 1.6}, {}, queue=False), "healthy", None, "healthy"),
}


@pytest.mark.parametrize("findings, verdict, segment, head", CASES.values(), ids=CASES.keys())
def test_when_a_segment_makes_the_verdict(findings, verdict, segment, head):
    v = decide(findings, service="gen", model_version="llm-7b", window_start=T0, window_end=T1, now=T1)
    assert v.verdict == verdict, v.summary
    assert v.attribution.get("segment") == segment
    assert v.summary.startswith(head), v.summary
    assert v.rows == 880


def test_the_segment_leads_the_evidence_and_the_summary_names_its_strongest_signal():
    from monitor.alerts.samples import verdict_annotations
    from monitor.verdicts.evidence import gathered

    v = decide(window({"de": 2.0}, {"de": (0.21, 0.71)}), service="gen", model_version="llm-7b",
               window_start=T0, window_end=T1, now=T1)
    assert v.attribution["top_stage"] == "decode" and v.attribution["total"]["value"] == 1600.0
    assert [s["labels"] for s in v.attribution["signals"]] == [{"segment": "lang=de", "signal": "spec_accept"},
                                                              {"signal": "queue_depth"}]
    assert ("slower for segment lang=de: p95 total latency 1,600 ms vs 800 ms; 100% of the increase in stage "
            "decode; service_signal spec_accept 0.21 vs 0.71; service_signal queue_depth 3.1 requests vs 1.2 "
            "requests (all traffic)") == v.summary
    assert [(e.check, e.labels.get("segment")) for e in v.evidence][:3] == [
        ("latency", "lang=de"), ("latency", "lang=de"), ("service_signal", "lang=de")]
    assert v.evidence[0].labels["stage"] == "total" and v.evidence[1].share == 1.0
    assert any(s.startswith("segment lang=de:") for s in v.next_steps)
    assert any(s.startswith("speculative decoding:") for s in v.next_steps)
    # As Slack and explain rank it: the segment's items ahead of all traffic's diurnal queue depth, whose
    # 2.6x would outrank a 12%-of-traffic slice scaled by its share.
    ranked = gathered(verdict_annotations(v))
    first_whole = next(i for i, e in enumerate(ranked) if "segment" not in e["labels"])
    assert all(e["labels"].get("segment") == "lang=de" for e in ranked[:first_whole])
    assert {e["labels"].get("signal") for e in ranked[:first_whole]} >= {"spec_accept"}
    assert ranked[first_whole]["labels"] == {"signal": "queue_depth"}


def test_tailwatch_verdict_says_the_open_incident_while_a_window_is_healthy(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from monitor import config as config_mod
    from monitor.daemon.health import Metrics
    from monitor.daemon.model_metrics import ModelMetrics
    from storage.store import Store

    (tmp_path / "logs").mkdir()
    cfg = config_mod.parse({"storage": {"url": f"sqlite:///{tmp_path / 'tw.db'}"}, "services": [{
        "name": "gen", "sources": {"predictions": {"kind": "files", "path": str(tmp_path / "logs")}},
        "schema": {"features": {}, "segments": ["lang"]}, "buckets": {"size": "5m", "windows": ["15m"]}}]},
        base_dir=tmp_path)
    store = Store(cfg.storage.url)
    store.upgrade()
    now = T1 + timedelta(minutes=1)
    try:
        with store.transaction() as session:
            store.verdicts.upsert(session, [
                {"service": "gen", "model_version": v, "window_start": T0, "window_end": T1, "verdict": "healthy",
                 "rows": 880} for v in ("llm-7b", "llm-13b")])
            store.incidents.add(session, service="gen", model_version="llm-7b", verdict="slower", status="open",
                                opened_at=T0 - timedelta(hours=1), fingerprint="f", group_labels={}, revision=1,
                                updated_at=T0, first_window_start=T0 - timedelta(hours=1))
        text = Metrics(ModelMetrics(cfg, store, clock=lambda: now)).render().decode()
    finally:
        store.dispose()
    shown = {(s.labels["model_version"], s.labels["verdict"]): s.value for family in
             text_string_to_metric_families(text) for s in family.samples if s.name == "tailwatch_verdict"}
    assert shown[("llm-7b", "slower")] == 1 and shown[("llm-7b", "healthy")] == 0
    assert shown[("llm-13b", "healthy")] == 1  # another version's window says what it says


def test_one_segments_slowdown_never_becomes_its_own_baseline(store):
    """Twelve hours of `lang=de` (a tenth of the traffic) 1.6x slower, all traffic under the 1.5x a breach
    needs, scored in one call (a backlog, before any incident holds the baseline): each of de's windows is
    compared with its history before the first of them, so the last still breaches, where a trailing day
    holding eleven slow hours would call it ok."""
    import numpy as np
    import pandas as pd

    from monitor.aggregate.fold import fold
    from monitor.aggregate.partial import merge_bytes
    from monitor.verdicts.windows import score

    hour, start = timedelta(hours=1), datetime(2026, 3, 8, tzinfo=UTC)
    rng = np.random.default_rng(5)
    frames = []
    for h in range(15):
        for lang, n in (("en", 600), ("de", 60)):
            slow = 1.6 if lang == "de" and h >= 3 else 1.0
            frames.append(pd.DataFrame({
                "request_id": [f"{h}-{lang}-{i}" for i in range(n)],
                "ts": pd.Timestamp(start + h * hour) + pd.to_timedelta(np.linspace(0, 3599, n), unit="s"),
                "model_version": "v1", "status": "ok", "joined": True, "stage_rows": 1, "lang": lang,
                "latency_ms": 200.0 * slow * rng.lognormal(0, 0.2, n)}))
    rows = fold(pd.concat(frames, ignore_index=True), hour, ["lang"], timed=False)
    with store.transaction() as session:
        store.partials.upsert(session, "gen", rows, merge_bytes)
    windows = [(start + h * hour, start + (h + 1) * hour) for h in range(3, 15)]
    scored = score(store, "gen", None, windows)

    def p50(segment: str, at: datetime):
        s = next(s for s in scored if s.segment == segment and s.start == at)
        return next(f for f in s.findings if f.labels.get("stage") == "total" and f.labels.get("quantile") == "p50")

    for lo, _ in windows:
        de = p50("lang=de", lo)
        assert de.status == "breach" and de.baseline == pytest.approx(200, rel=0.1), (lo, de.value, de.baseline)
        assert p50("lang=en", lo).status == p50("", lo).status == "ok"
