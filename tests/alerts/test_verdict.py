"""decide() on synthetic findings: one test per verdict shape."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from monitor.verdicts.verdict import Evidence, decide

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=15)
NOW = T1 + timedelta(minutes=10)


def f(check: str, labels: dict, status: str = "ok", value: float | None = 1.0, baseline: float | None = 1.0,
      n: int = 2000, version: str = "v2", **extra) -> dict:
    return {"check": check, "labels": labels, "status": status, "value": value, "baseline": baseline, "n": n,
            "model_version": version, "window_start": T0, "window_end": T1, "interval_low": extra.get("low"),
            "interval_high": extra.get("high"), "detail": extra.get("detail", {})}


def healthy_base() -> list[dict]:
    out = [f("latency", {"rate": r}, value=0.01, baseline=0.01) for r in ("failure", "timeout", "reject")]
    for stage, base in (("total", 60.0), ("model", 30.0), ("batch_wait", 5.0), ("preprocess", 10.0)):
        out.append(f("latency", {"stage": stage, "quantile": "p95"}, value=base, baseline=base))
    out += [f("drift", {"field": "tenure"}, value=0.01, baseline=0.0), f("cache_hit_rate", {}, value=0.8, baseline=0.8)]
    return out


def replace(findings: list[dict], check: str, labels: dict, **changes) -> list[dict]:
    out = [x for x in findings if not (x["check"] == check and x["labels"] == labels)]
    return out + [f(check, labels, **changes)]


def run(findings, **kw):
    return decide(findings, service="churn", model_version="v2", window_start=T0, window_end=T1, now=NOW, **kw)


def test_healthy():
    v = run(healthy_base())
    assert v.verdict == "healthy" and not v.estimated and v.evidence == () and v.rows == 2000
    assert v.rollback_to is None and v.what_changed == ()


def test_no_data_and_insufficient():
    assert run([]).verdict == "no_data"
    assert run([f("latency", {"rate": "timeout"}, status="insufficient", n=0)]).verdict == "no_data"
    thin = [f("latency", {"rate": "timeout"}, status="insufficient", n=20),
            f("drift", {"field": "tenure"}, status="insufficient", n=20)]
    assert run(thin).verdict == "insufficient_data"


def test_slower_attributed_to_stages_with_cache_signal_and_rollback():
    x = healthy_base()
    x = replace(x, "latency", {"stage": "total", "quantile": "p95"}, status="breach", value=160.0, baseline=60.0)
    x = replace(x, "latency", {"stage": "model", "quantile": "p95"}, status="breach", value=110.0, baseline=30.0)
    x = replace(x, "latency", {"stage": "preprocess", "quantile": "p95"}, value=30.0, baseline=10.0)
    x = replace(x, "cache_hit_rate", {}, status="breach", value=0.2, baseline=0.8, low=0.18, high=0.22)
    versions = [{"kind": "model_version", "value": "v1", "first_seen": T0 - timedelta(days=3)},
                {"kind": "model_version", "value": "v2", "first_seen": T0 - timedelta(minutes=20)}]
    v = run(x, versions=versions, accepted_versions=["v1"])
    assert v.verdict == "slower" and not v.estimated
    assert v.attribution["stages"] == {"model": 0.8, "preprocess": 0.2}
    assert [s["check"] for s in v.attribution["signals"]] == ["cache_hit_rate"]
    assert v.evidence[0].check == "latency" and v.evidence[0].labels["stage"] == "total"
    model = next(e for e in v.evidence if e.labels.get("stage") == "model")
    assert model.share == 0.8 and model.n == 2000
    assert v.rollback_to == "v1"
    assert [c["value"] for c in v.what_changed] == ["v2"]
    assert v.next_steps[0] == "consider rolling back to accepted version v1"
    assert any(s.startswith("cache:") for s in v.next_steps)
    assert "model" in v.summary and "cache_hit_rate" in v.summary


def test_a_cache_that_stopped_hitting_is_slower_before_latency_shows_it():
    x = replace(healthy_base(), "cache_hit_rate", {}, status="breach", value=0.07, baseline=0.22)
    v = run(x)
    assert v.verdict == "slower" and v.evidence[0].check == "cache_hit_rate"
    assert [s["check"] for s in v.attribution["signals"]] == ["cache_hit_rate"]
    assert any(s.startswith("cache:") for s in v.next_steps)


def test_accepted_version_is_never_its_own_rollback():
    x = replace(healthy_base(), "latency", {"rate": "timeout"}, status="breach", value=0.2, baseline=0.01)
    versions = [{"kind": "model_version", "value": "v2", "first_seen": T0 - timedelta(days=3)}]
    v = run(x, versions=versions, accepted_versions=["v2"])
    assert v.verdict == "slower" and v.rollback_to is None and v.what_changed == ()


def test_length_adjusted_latency_says_inputs_got_longer():
    x = replace(healthy_base(), "latency", {"stage": "total", "quantile": "p95"}, status="breach", value=200.0,
                baseline=60.0)
    x = replace(x, "length_distribution", {"field": "notes"}, status="breach", value=0.6, baseline=0.0)
    assert run(x).attribution["length"] == "unknown"
    per_length = x + [f("latency", {"stage": "total", "quantile": "p95", "length_bucket": b}, value=60.0,
                        baseline=60.0) for b in ("0-512", "512+")]
    assert run(per_length).attribution["length"] == "inputs"
    per_length[-1] = f("latency", {"stage": "total", "quantile": "p95", "length_bucket": "512+"},
                       status="breach", value=300.0, baseline=60.0)
    assert run(per_length).attribution["length"] == "service"


@pytest.mark.parametrize("quality_check", ["quality", "acceptance"])
def test_worse_confirmed_from_labels(quality_check):
    x = healthy_base() + [f(quality_check, {"metric": "recall", "class": "Yes", "group": "tenure<12"},
                            status="breach", value=0.41, baseline=0.7, n=300, low=0.35, high=0.47)]
    v = run(x)
    assert v.verdict == "worse" and not v.estimated
    assert v.evidence[0].check == quality_check and v.evidence[0].interval_low == 0.35
    assert any("preprocessing" in s for s in v.next_steps) and any("threshold" in s for s in v.next_steps)


def test_worse_estimated_from_prediction_drift_or_estimate():
    x = replace(healthy_base(), "prediction_drift", {"field": "prediction"}, status="breach", value=0.3, baseline=0)
    v = run(x)
    assert v.verdict == "worse" and v.estimated
    est = healthy_base() + [f("quality", {"metric": "f1"}, status="breach", value=0.5, baseline=0.7,
                              detail={"estimated": True})]
    assert (run(est).verdict, run(est).estimated) == ("worse", True)


def test_prediction_drift_with_new_categories_is_drift_not_worse():
    x = replace(healthy_base(), "prediction_drift", {"field": "prediction"}, status="breach", value=0.3, baseline=0)
    x = replace(x, "unseen_categories", {"field": "Contract"}, status="breach", value=0.15, baseline=0.0)
    v = run(x)
    assert v.verdict == "drift" and not v.estimated
    assert {e.check for e in v.evidence} == {"unseen_categories", "prediction_drift"}
    assert "Contract" in v.next_steps[-1]


def test_input_drift_alone_is_drift():
    x = replace(healthy_base(), "missing_rate", {"field": "InternetService"}, status="breach", value=0.2,
                baseline=0.0)
    assert run(x).verdict == "drift"


def test_both_when_slower_and_worse():
    x = replace(healthy_base(), "latency", {"stage": "total", "quantile": "p99"}, status="breach", value=400.0,
                baseline=90.0)
    x = replace(x, "prediction_drift", {"field": "prediction"}, status="breach", value=0.3, baseline=0)
    v = run(x)
    assert v.verdict == "both" and v.estimated and v.attribution["quantile"] == "p99"


def test_slo_breach_alone_is_slower_and_errors_are_carried():
    x = healthy_base() + [f("drift", {"field": "x"}, status="insufficient", detail={"error": "ValueError: boom"})]
    v = run(x, rule_breaches=[Evidence("slo:p95", {"slo": "p95 total latency <= 50 ms"}, 60.0, None, 2000)])
    assert v.verdict == "slower" and v.evidence[0].check == "slo:p95"
    assert v.errors == ("drift: ValueError: boom",)


def test_other_versions_and_windows_are_ignored():
    x = [dict(r, model_version="v1") for r in healthy_base()]
    assert run(x).verdict == "no_data"


def test_row_round_trip_fields():
    row = run(healthy_base()).to_row()
    assert set(row) == {"service", "model_version", "window_start", "window_end", "verdict", "estimated", "rows",
                        "evidence", "attribution", "what_changed", "next_steps", "rollback_to", "summary"}


def test_an_estimate_explains_prediction_drift_only_when_it_says_quality_held():
    drifted = replace(healthy_base(), "prediction_drift", {"field": "prediction"}, status="breach", value=0.3,
                      baseline=0)
    labels = {"metric": "accuracy", "class": "all", "group": "all"}
    held = drifted + [f("quality_estimate", labels, value=0.95, baseline=0.96, low=0.93, high=0.97,
                        detail={"estimated": True})]
    assert run(held).verdict == "drift"  # the estimate reaches the reference: the new inputs explain it
    dropped = drifted + [f("quality_estimate", labels, value=0.80, baseline=0.96, low=0.77, high=0.83,
                           detail={"estimated": True})]
    assert (run(dropped).verdict, run(dropped).estimated) == ("worse", True)
    # An estimate with no reference value to compare with says nothing either way.
    bare = drifted + [f("quality_estimate", labels, value=0.95, baseline=None, low=0.93, high=0.97,
                        detail={"estimated": True})]
    assert (run(bare).verdict, run(bare).estimated) == ("worse", True)


def test_one_segments_prediction_drift_is_estimated_harm():
    """A preprocessing bug that hits one segment moves all traffic's predictions too little to breach."""
    x = healthy_base() + [f("prediction_drift", {"field": "prediction", "segment": "tenure<12"}, status="breach",
                            value=0.4, baseline=0)]
    v = run(x)
    assert v.verdict == "worse" and v.estimated
    assert [(e.check, e.labels.get("segment"), e.status) for e in v.evidence] == [
        ("prediction_drift", "tenure<12", "breach")]


def test_an_episode_holds_on_its_prediction_drift_while_it_stays_shifted():
    """Under the floor that opens an episode, a segment's prediction drift still significant against its
    baseline keeps the episode's verdict worse; back (or never part of the episode) it does not."""
    labels = {"output": "score:Yes", "segment": "Contract=Month-to-month"}
    shifted = healthy_base() + [f("prediction_drift", labels, value=0.086, baseline=0.0,
                                  detail={"shifted": True})]
    key = ("prediction_drift", tuple(sorted(labels.items())))
    v = run(shifted, held={key})
    assert (v.verdict, v.estimated) == ("worse", True)
    assert [(e.check, e.status) for e in v.evidence] == [("prediction_drift", "held")]
    assert "held: still shifted" in v.summary
    assert run(shifted).verdict == "healthy"  # no episode open: under the floor, nothing opens one
    back = healthy_base() + [f("prediction_drift", labels, value=0.01, baseline=0.0, detail={"shifted": False})]
    assert run(back, held={key}).verdict == "healthy"
    other = ("prediction_drift", (("output", "prediction"),))
    assert run(shifted, held={other}).verdict == "healthy"


def test_next_steps_are_only_those_the_evidence_supports():
    slower = replace(healthy_base(), "latency", {"stage": "total", "quantile": "p95"}, status="breach", value=160.0,
                     baseline=60.0)
    slower = replace(slower, "latency", {"stage": "batch_wait", "quantile": "p95"}, status="breach", value=105.0,
                     baseline=5.0)
    slower = replace(slower, "cache_hit_rate", {}, status="breach", value=0.95, baseline=0.8)  # rose: no cache step
    v1 = {"kind": "model_version", "value": "v1", "first_seen": T0 - timedelta(days=10)}
    old_version = [v1, {"kind": "model_version", "value": "v2", "first_seen": T0 - timedelta(days=3)},
                   {"kind": "config_hash", "value": "pp0", "first_seen": T0 - timedelta(days=10)},
                   {"kind": "config_hash", "value": "abc", "first_seen": T0}]
    v = run(slower, versions=old_version, accepted_versions=["v1"])
    assert v.verdict == "slower" and v.rollback_to == "v1"
    # No rollback (the version did not change at the onset), no cache, memory or generic queue step, and the
    # config change is in what_changed, not repeated as a step.
    assert v.next_steps == ("micro-batcher: max wait and max batch size",)
    assert [c["value"] for c in v.what_changed] == ["abc"]
    new_version = [v1, {"kind": "model_version", "value": "v2", "first_seen": T0 - timedelta(minutes=5)}]
    assert run(slower, versions=new_version, accepted_versions=["v1"]).next_steps[0] == \
        "consider rolling back to accepted version v1"
    # A stage's share of an increase that did not breach points nowhere.
    flat = replace(healthy_base(), "cache_hit_rate", {}, status="breach", value=0.07, baseline=0.22)
    flat = replace(flat, "latency", {"stage": "batch_wait", "quantile": "p95"}, value=9.0, baseline=5.0)
    assert run(flat).next_steps == ("cache: hit rate and cache key (did a deploy change the key or flush the cache?)",)
