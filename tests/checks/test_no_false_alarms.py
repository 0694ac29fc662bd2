"""Healthy data must not alarm: windows sampled from the reference's own distribution."""

from __future__ import annotations

import numpy as np

from checks.evaluate import evaluate

DRIFT_CHECKS = {"drift", "prediction_drift", "length_distribution"}


def test_twenty_healthy_windows_of_600_rows_raise_no_breach(sample, window, schema, reference_profile, trailing):
    rng = np.random.default_rng(2024)
    breaches = []
    for _ in range(20):
        w = window(sample(600, rng), schema, reference_profile)
        breaches += [(f.check, f.labels, f.value, f.p_value) for f in evaluate(w, reference_profile, trailing)
                     if f.status == "breach"]
    assert breaches == []


def test_windows_of_100_rows_never_report_drift(sample, window, schema, reference_profile, trailing):
    rng = np.random.default_rng(99)
    for _ in range(20):
        w = window(sample(100, rng), schema, reference_profile)
        statuses = {f.status for f in evaluate(w, reference_profile, trailing) if f.check in DRIFT_CHECKS}
        assert statuses <= {"ok", "insufficient"}
