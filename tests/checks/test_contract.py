"""The check contract: families, bounded parameters, the shared decision rules, and min_n policies."""

from __future__ import annotations

import re

import pytest

from checks.catalog import family_of, names, thresholds
from checks.contract import REGISTRY, decide, measured
from checks.stats import wilson
from monitor.config import Quality, SloRule


def test_every_check_declares_family_unit_min_n_and_where_it_is_set():
    for c in REGISTRY.values():
        assert c.family and c.unit and c.n_of and c.configured and c.doc, c.name
        assert c.min_n is not None and c.min_n >= 1, c.name
        assert (c.fn is not None) == (c.kind == "window"), c.name


def test_families_name_the_checks_the_verdict_reads():
    assert names("completeness", "ranges") == ("missing_rate", "out_of_range", "unseen_categories")
    assert set(names("drift", "predictions", "lengths")) == {"drift", "prediction_drift", "length_distribution"}
    assert names("quality", "versions") == ("quality", "acceptance", "version_compare")
    assert names("estimates", "predictions") == ("quality_estimate", "prediction_drift")
    assert family_of("slo:p95-latency") == "slo" and family_of("nope") is None


@pytest.mark.parametrize("overrides, message", [
    ({"latency": {"min_n": 0}}, "latency.min_n: must be at least 1 (got 0)"),
    ({"drift": {"alpha": 1.5}}, "drift.alpha: must be at most 1 (got 1.5)"),
    ({"hotspot": {"max_ratio": 0}}, "hotspot.max_ratio: must be above 0 (got 0)"),
    ({"oov_rate": {"max_increase": -0.1}}, "oov_rate.max_increase: must be at least 0 (got -0.1)"),
    ({"quality": {"min_n": 5}}, "unknown check 'quality'; it is set in services[].quality"),
])
def test_a_value_out_of_bounds_names_the_check_and_parameter(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        thresholds(overrides)


def test_bounds_admit_their_edges():
    assert thresholds({"latency": {"min_n": 1, "max_rate_increase": 0}})["latency"].min_n == 1
    assert thresholds({"drift": {"alpha": 1}})["drift"].alpha == 1


@pytest.mark.parametrize("k, n, limit, enough, status", [
    (30, 100, 0.1, True, "breach"),  # Wilson low 0.218 > 0.1
    (12, 100, 0.1, True, "ok"),
    (30, 100, 0.1, False, "insufficient"),
    (30, 100, None, True, "insufficient"),
])
def test_the_rate_decision_rule(k, n, limit, enough, status):
    assert decide(k, n, limit, enough) == (wilson(k, n), status)


def test_a_measure_without_decision_is_ok_or_insufficient():
    assert measured(0.5, 30, 30) == "ok"
    assert measured(0.5, 29, 30) == measured(None, 100, 30) == "insufficient"


def test_the_config_defaults_are_the_contracts():
    quality = Quality()
    assert quality.min_n == REGISTRY["quality"].min_n == REGISTRY["acceptance"].min_n
    assert quality.bias_tolerance == REGISTRY["label_bias"].params.tolerance
    assert quality.fdr_q == REGISTRY["acceptance"].params.fdr_q
    assert SloRule.model_fields["min_n"].default is None  # unset: the rule's own policy (RuleThreshold)
