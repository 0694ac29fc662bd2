"""The registry, evaluate, and findings as storage rows."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace
from datetime import UTC, datetime

import numpy as np
import pytest

from checks.base import Finding
from checks.catalog import names
from checks.contract import REGISTRY
from checks.drift import DriftThreshold
from checks.evaluate import evaluate
from monitor.aggregate.partial import Partial

NAMES = {"missing_rate", "out_of_range", "unseen_categories", "drift", "latency", "cache_hit_rate",
         "length_distribution", "prediction_drift", "service_signal", "stale_cache", "hotspot", "oov_rate"}
QUALITY = {"quality", "quality_estimate", "version_compare", "label_coverage", "label_bias", "acceptance"}


def test_every_check_is_registered_once_with_default_thresholds():
    assert set(names(kind="window")) == NAMES
    assert set(REGISTRY) == NAMES | QUALITY | {"slo"}
    for reg in REGISTRY.values():
        assert (reg.fn is None or reg.fn.__doc__) and reg.doc and reg.params() == reg.params()  # thresholds construct with defaults
        with pytest.raises(FrozenInstanceError):
            setattr(reg.params(), next(iter(reg.params.__dataclass_fields__)), 0)


def test_evaluate_runs_every_check_and_takes_params(sample, window, schema, reference_profile, trailing):
    w = window(sample(600, np.random.default_rng(13)), schema, reference_profile)
    findings = evaluate(w, reference_profile, trailing)
    assert {f.check for f in findings} == NAMES
    assert all(f.status in ("ok", "breach", "insufficient") for f in findings)
    strict = evaluate(w, reference_profile, trailing, {"drift": DriftThreshold(alpha=1.0, psi_floor=0.0, band="none")})
    assert {f.status for f in strict if f.check == "drift"} == {"breach"}


def test_evaluate_on_an_empty_window_without_reference_or_baseline():
    findings = evaluate(Partial(), None, None)
    assert all(f.status == "insufficient" for f in findings)


def test_a_failing_check_yields_an_insufficient_finding(monkeypatch, reference_profile):
    def boom(*args):
        raise RuntimeError("bad bins")

    monkeypatch.setitem(REGISTRY, "drift", replace(REGISTRY["drift"], fn=boom))
    [f] = [f for f in evaluate(Partial(), reference_profile, None) if f.check == "drift"]
    assert f.status == "insufficient" and "bad bins" in f.detail["error"]


def test_findings_store_and_load(store, sample, window, schema, reference_profile, trailing):
    w = window(sample(600, np.random.default_rng(14)), schema, reference_profile)
    findings = evaluate(w, reference_profile, trailing)
    start, end = datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 1, 1, tzinfo=UTC)
    with store.transaction() as session:
        store.findings.upsert(session, [f.to_row("svc", "v1", start, end) for f in findings])
    with store.transaction() as session:
        loaded = store.findings.load(session, "svc")
    assert len(loaded) == len(findings)
    drift_x = next(r for r in loaded if r["check"] == "drift" and r["labels"] == {"field": "x"})
    assert drift_x["detail"]["bins"] == 10 and drift_x["p_value"] is not None


def test_finding_is_frozen():
    f = Finding("drift", {"field": "x"}, 0.1, "ok", 10)
    with pytest.raises(FrozenInstanceError):
        f.value = 1.0  # type: ignore[misc]
