"""Evidence worded with units and ranked by effect size across families: the one ranking Slack, the
Alertmanager annotation and explain share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from monitor.verdicts.evidence import effect, gathered, ranked, text


def item(check, labels, value, baseline, n=1000, low=None, high=None):
    return {"check": check, "labels": labels, "value": value, "baseline": baseline, "n": n,
            "interval_low": low, "interval_high": high, "status": "breach"}


@pytest.mark.parametrize("e, expected", [
    (item("latency", {"stage": "total", "quantile": "p95"}, 50.9, 13.9, 1796, 49.4, 52.5),
     "latency quantile=p95 stage=total: 50.9 ms vs 13.9 ms (3.7x, n=1,796 requests, 95% CI 49.4–52.5 ms)"),
    (item("unseen_categories", {"field": "Contract"}, 0.28, 0.0, 1796, 0.26, 0.30),
     "unseen_categories field=Contract: 28% vs 0% (+28 pp, n=1,796 present values, 95% CI 26–30%)"),
    (item("drift", {"field": "Contract"}, 1.11, 0.0, 1796, 0.987, 1.26),
     "drift field=Contract: PSI 1.11 (n=1,796 window values, 95% CI PSI 0.987–1.26)"),
    (item("service_signal", {"signal": "batch_size"}, 6.1, 3.4, 900),
     "service_signal signal=batch_size: 6.1 requests vs 3.4 requests (1.8x, n=900 values)"),
    (item("latency", {"rate": "timeout"}, 0.05, 0.01, 2000),
     "latency rate=timeout: 5% vs 1% (+4 pp, n=2,000 requests)"),
    (item("cache_hit_rate", {}, 0.07, 0.22, 20000),
     "cache_hit_rate: 7% vs 22% (-15 pp, n=20,000 lookups)"),
])
def test_every_value_has_its_unit(e, expected):
    assert text(e) == expected


def test_a_new_category_on_28_percent_of_traffic_outranks_a_length_bucket():
    bucket = item("latency", {"stage": "total", "quantile": "p95", "length": "len:notes", "bucket": "512+"},
                  400.0, 100.0, n=90)  # 4x, on 90 of 2,000 requests
    total = item("latency", {"stage": "total", "quantile": "p95"}, 130.0, 100.0, n=2000)
    category = item("unseen_categories", {"field": "merchant_type"}, 0.28, 0.0, n=2000)
    order = ranked([bucket, total, category], quantile="p95")
    assert [e["check"] for e in order] == ["unseen_categories", "latency", "latency"]
    assert "bucket" in order[-1]["labels"]
    # Counted by the requests it covers: the same bucket over all traffic would lead.
    assert effect(bucket) > effect(category) > effect(bucket, whole_n=2000)


def test_one_line_per_measure_at_the_verdicts_quantile_and_each_item_once():
    quantiles = [item("latency", {"stage": "model", "quantile": q}, v, 10.0) for q, v in
                 (("p50", 100.0), ("p95", 40.0), ("p99", 30.0))]
    signal = {"check": "service_signal", "labels": {"signal": "queue_depth"}, "value": 3.0, "baseline": 1.0,
              "n": 500}
    notes = {"evidence": quantiles + [{**signal, "interval_low": 2.5, "interval_high": 3.5}],
             "attribution": {"quantile": "p95", "signals": [signal]}, "rows": 1000}
    order = gathered(notes)
    assert [(e["check"], e["labels"].get("quantile")) for e in order] == [("latency", "p95"),
                                                                         ("service_signal", None)]
    assert order[1]["interval_low"] == 2.5  # the evidence item, not the attribution's copy
    # Without the verdict's quantile, the strongest one stands for the measure.
    assert ranked(quantiles)[0]["labels"]["quantile"] == "p50"


def test_slo_rules_first_and_items_without_an_effect_last():
    order = ranked([item("label_coverage", {}, None, None), item("missing_rate", {"field": "x"}, 0.2, 0.0),
                    {"check": "slo:fast", "labels": {"slo": "p95 total latency <= 100 ms"}, "value": 140.0,
                     "baseline": None, "n": 300}])
    assert [e["check"] for e in order] == ["slo:fast", "missing_rate", "label_coverage"]
    assert text(order[0]) == "slo:fast slo=p95 total latency <= 100 ms: 140 ms (n=300 requests)"


def test_alertmanager_annotates_the_same_ranked_evidence():
    from monitor.config import Alertmanager
    from monitor.notify.alertmanager import render

    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    notes = {"summary": "slower", "evidence": [item("latency", {"stage": "total", "quantile": "p95"}, 130.0, 100.0),
                                               item("latency", {"stage": "total", "quantile": "p50"}, 90.0, 80.0)],
             "attribution": {"quantile": "p95", "inputs": [item("unseen_categories", {"field": "c"}, 0.28, 0.0)]}}
    incident = {"id": 1, "service": "churn", "model_version": "v2", "verdict": "slower", "status": "open",
                "opened_at": now - timedelta(minutes=30),
                "summary": {"alerts": [{"labels": {"alertname": "ModelRegression"}, "state": "firing",
                                        "annotations": notes}]}}
    [alert] = render(incident, Alertmanager(urls=["http://127.0.0.1:9"]), now)
    assert alert["annotations"]["evidence"].splitlines() == [text(e) for e in gathered(notes)]
    assert alert["annotations"]["evidence"].startswith("unseen_categories field=c: 28% vs 0%")
