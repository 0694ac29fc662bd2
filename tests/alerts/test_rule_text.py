"""An acceptance rule is shown against its own number: `recall 0.286 vs floor 0.60 (v1 0.789)`, its value
against the rule's threshold with the accepted version's figure beside it, one n per rule, wherever a rule
finding is written as text: the verdict's summary, evidence lines (Slack, `explain`'s table) and why an
episode still holds.

On data nobody here wrote: scikit-learn's breast-cancer set (569 tumours), a logistic regression trained on
half of it; version v1 flags malignant at p >= 0.5, version v2 (its threshold pushed to 0.99999) misses most of
them. Recall of `malignant` on the held-out half is what the rules judge."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from checks.acceptance import acceptance_finding
from checks.base import Finding
from checks.stats import wilson
from monitor.config import QualityRule

T0 = datetime(2026, 11, 2, tzinfo=UTC)
T1 = T0 + timedelta(days=1)


@pytest.fixture(scope="module")
def recalls() -> dict[str, Finding]:
    """Recall of `malignant` per version on the held-out half, as the quality check stores it."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = load_breast_cancer(return_X_y=True)
    malignant = y == 0  # the set's class 0
    x_fit, x_test, m_fit, m_test = train_test_split(x, malignant, test_size=0.5, random_state=0, stratify=malignant)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(x_fit, m_fit)
    p = model.predict_proba(x_test)[:, 1]
    out = {}
    for version, threshold in (("v1", 0.5), ("v2", 0.99999)):
        k, n = int(np.sum((p >= threshold) & m_test)), int(m_test.sum())
        out[version] = Finding("quality", {"metric": "recall", "class": "malignant", "group": "all"}, k / n, "ok", n,
                               interval=wilson(k, n), detail={"failed_as_miss": False})
    return out


def rule_finding(recalls, **tolerance) -> dict:
    """v2's finding of one rule against v1's same-window figure, as a stored finding row."""
    rule = QualityRule(name="malignant recall", metric="recall", **{"class": "malignant"}, **tolerance)
    f = acceptance_finding(rule, "all", recalls["v2"], recalls["v1"], "version v1", min_n=30)
    return {"check": f.check, "labels": f.labels, "status": f.status, "value": f.value, "baseline": f.baseline,
            "n": f.n, "interval_low": f.interval[0], "interval_high": f.interval[1], "detail": f.detail,
            "model_version": "v2", "window_start": T0, "window_end": T1, "effect": f.effect}


def g3(x: float) -> str:
    return f"{x:.3g}"


@pytest.mark.parametrize("tolerance, floor", [({"min": 0.6}, "0.60"), ({"min": 0.725}, "0.725"),
                                              ({"max_drop": 0.05}, None)])
def test_the_rule_text_is_the_figure_against_its_own_number(recalls, tolerance, floor):
    from monitor.verdicts.evidence import rule_text

    row = rule_finding(recalls, **tolerance)
    v1, v2 = recalls["v1"].value, recalls["v2"].value
    assert row["status"] == "breach" and v2 < 0.5 < 0.9 < v1  # the data say what the rule is about
    if floor is None:  # max_drop: the floor is v1's figure less the drop, and it says so
        assert rule_text(row) == f"recall {g3(v2)} vs floor {g3(v1 - 0.05)} (v1 {g3(v1)} - 0.05)"
    else:
        assert rule_text(row) == f"recall {g3(v2)} vs floor {floor} (v1 {g3(v1)})"
    reference = {**row, "detail": {**row["detail"], "baseline_from": "reference"}}
    assert rule_text(reference) == rule_text(row).replace("(v1 ", "(reference ")


def verdict(recalls, **tolerance):
    from monitor.verdicts.verdict import decide

    rate = [{"check": "latency", "labels": {"rate": r}, "status": "ok", "value": 0.0, "baseline": 0.0, "n": 285,
             "model_version": "v2", "window_start": T0, "window_end": T1} for r in ("failure", "timeout", "reject")]
    return decide(rate + [rule_finding(recalls, **tolerance)], service="cancer", model_version="v2", window_start=T0,
                  window_end=T1, now=T1 + timedelta(hours=1))


def test_the_summary_slack_and_explain_say_the_rule_against_its_floor(recalls):
    from monitor.alerts.render import render
    from monitor.alerts.samples import verdict_annotations
    from monitor.verdicts.evidence import gathered, parts, text

    v = verdict(recalls, min=0.6)
    v1, v2, n = recalls["v1"].value, recalls["v2"].value, recalls["v2"].n
    said = f"recall {g3(v2)} vs floor 0.60 (v1 {g3(v1)})"
    assert v.verdict == "worse" and not v.estimated
    assert v.summary == f"worse: rule malignant recall: {said} (n={n})", v.summary

    # Slack: the evidence line, one n for the rule.
    notes = verdict_annotations(v)
    incident = {"id": 1, "revision": 1, "service": "cancer", "model_version": "v2", "verdict": "worse",
                "status": "open", "first_window_start": T0,
                "summary": {"severity": "page", "alerts": [{"labels": {"alertname": "ModelRegression"},
                                                            "state": "firing", "annotations": notes}]}}
    message = render(incident, "post", "post", None)
    section = next(b["text"]["text"] for b in message["blocks"] if b.get("text", {}).get("text", "").startswith(
        "*Evidence*"))
    [line] = [x for x in section.splitlines() if "acceptance" in x]
    assert f"*recall {g3(v2)}* vs floor 0.60 (v1 {g3(v1)})" in line, line
    assert len(re.findall(r"n=", line)) == 1 and f"n={n} labelled predictions" in line, line
    assert said in message["text"]

    # explain's evidence table and the plain text line word it the same.
    [item] = [e for e in gathered(notes) if e["check"] == "acceptance"]
    p = parts(item)
    assert (p["value"], p["baseline"], p["n"]) == (f"recall {g3(v2)}", f"floor 0.60 (v1 {g3(v1)})",
                                                   f"n={n} labelled predictions")
    assert "metric=" not in p["labels"] and "rule=malignant recall" in p["labels"]
    assert said in text(item) and text(item).count("n=") == 1


def test_an_episode_held_by_a_rule_says_it_against_its_floor(recalls):
    from monitor.alerts.lifecycle import not_back, pre_incident
    from monitor.config import VerdictAlerts

    v = verdict(recalls, min=0.6)
    pre = pre_incident([[e.as_dict() for e in v.evidence]])
    row = rule_finding(recalls, min=0.6)
    [why] = not_back(pre, [row], VerdictAlerts())
    v1, v2 = recalls["v1"].value, recalls["v2"].value
    assert why.endswith(f"still breaching: recall {g3(v2)} vs floor 0.60 (v1 {g3(v1)})"), why


@pytest.mark.parametrize("value, unit, written", [
    (3e-05, "", "0.00003"), (4.56e-05, "ms", "0.000046 ms"), (-2.5e-06, "", "-0.0000025"),
    (5e-07, "%", "0.00005%"), (1110.0, "ms", "1,110 ms"), (0.002, "", "0.002"), (0.0, "%", "0%")])
def test_numbers_in_slack_and_the_terminal_are_never_in_scientific_notation(value, unit, written):
    """What Slack, `explain` and the tick report write for a figure (evidence.show): a tiny error rate or a
    near-zero difference in plain decimals, as the pages write them."""
    from monitor.verdicts.evidence import show

    assert show(value, unit) == written
    assert "e-" not in show(value, unit) and "e+" not in show(value, unit)
