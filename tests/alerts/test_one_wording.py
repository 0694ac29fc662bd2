"""One wording for every figure and rule, wherever it is written: the tick report's breach lines word each
finding as the evidence lines do (evidence.text: its unit, an acceptance rule against its floor), `explain`
words a rule against its floor when it has only the windows' findings to go on, a `max_drop` that passes
the bottom of a 0..1 figure says it holds no floor, and the alert's digest (what updates a firing message)
names the segment the verdict rests on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from checks.acceptance import acceptance_finding
from checks.base import Finding
from checks.stats import wilson
from monitor.config import QualityRule

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
T1 = T0 + timedelta(hours=1)


def recall(k: int, n: int) -> Finding:
    """Recall of class `Yes` in all traffic: k of n positives found, as the quality check stores it."""
    return Finding("quality", {"metric": "recall", "class": "Yes", "group": "all"}, k / n, "ok", n,
                   interval=wilson(k, n))


def rule(observed: Finding, baseline: Finding, **tolerance) -> Finding:
    """One acceptance rule on recall of `Yes`, `observed` (version v2) against v1's `baseline`."""
    spec = QualityRule(name="yes recall", metric="recall", **{"class": "Yes"}, **tolerance)
    return acceptance_finding(spec, "all", observed, baseline, "version v1", min_n=30)


def row(f: Finding) -> dict:
    return f.to_row("churn", "v2", T0, T1) | {"check": f.check}


def test_the_tick_reports_breach_lines_word_each_finding_as_the_evidence_lines_do():
    from monitor.verdicts.evidence import text
    from monitor.verdicts.stage import breach

    # A rule's line holds the figure against the rule's floor, not against v1's figure.
    f = rule(recall(60, 210), recall(166, 210), min=0.6)
    assert f.status == "breach"
    line = breach(T0, T1, "v2", f)
    assert line.startswith("2026-11-02 12:00+60m v2 acceptance ")
    assert "recall 0.286 vs floor 0.60 (v1 0.79)" in line and line.count("n=") == 1, line
    assert line.endswith(text(row(f))), line

    # A tiny failure rate in percent, as Slack writes it: never in scientific notation.
    rate = Finding("latency", {"rate": "failure"}, 3e-05, "breach", 400_000, baseline=0.0)
    line = breach(T0, T1, "v2", rate)
    assert "0.003% vs 0%" in line and "e-05" not in line, line

    # A latency in ms with its ratio; a segment value from the logs cannot reach the terminal raw.
    slow = Finding("latency", {"stage": "total", "quantile": "p95", "segment": "lang=\x1b[31mde"}, 1600.0,
                   "breach", 110, baseline=800.0)
    line = breach(T0, T1, "v2", slow)
    assert "1,600 ms vs 800 ms (2x, n=110" in line and "\x1b" not in line and "\\x1b[31mde" in line, line


def test_a_drop_past_the_bottom_of_the_figure_holds_no_floor():
    from monitor.verdicts.evidence import parts, rule_text

    near_zero = row(rule(recall(1, 100), recall(3, 100), max_drop=0.05))  # v1 0.03 less 0.05: below 0
    assert near_zero["detail"]["floor"] < 0
    assert rule_text(near_zero) == "recall 0.01 vs no floor (v1 0.03 - 0.05 < 0)"
    assert parts(near_zero)["baseline"] == "no floor (v1 0.03 - 0.05 < 0)"
    # A floor within the figure's range reads as ever; the mean of the user's own scale has no bottom at 0.
    assert rule_text(row(rule(recall(20, 100), recall(80, 100), max_drop=0.05))) == (
        "recall 0.2 vs floor 0.75 (v1 0.8 - 0.05)")
    score = {**near_zero, "labels": {**near_zero["labels"], "metric": "feedback_mean"}}
    assert rule_text(score) == "feedback_mean 0.01 vs floor -0.02 (v1 0.03 - 0.05)"


def test_explain_without_verdict_evidence_words_a_rule_against_its_floor(store):
    from monitor.investigate.explain import explain
    from monitor.verdicts.evidence import parts
    from storage.models import Incident

    f = rule(recall(60, 210), recall(166, 210), min=0.6)
    with store.transaction() as session:
        store.findings.upsert(session, [f.to_row("churn", "v2", T0, T1)])
        incident = Incident(service="churn", model_version="v2", verdict="worse", status="open", opened_at=T1,
                            first_window_start=T0, last_window_end=T1, fingerprint="fp-rule",
                            summary={"text": "v2 misses churners"}, updated_at=T1)
        session.add(incident)
        session.flush()
        incident_id = incident.id

    result = explain(store, "churn", incident_id, now=T1 + timedelta(hours=1))
    assert result.verdicts == {}  # no verdict stored: the windows' findings are the evidence
    [item] = [e for e in result.evidence if e["check"] == "acceptance"]
    p = parts(item)
    assert (p["value"], p["baseline"]) == ("recall 0.286", "floor 0.60 (v1 0.79)"), p


def window(slow: str) -> list[dict]:
    """Findings of one window of a service split by `lang`: segment `slow`'s total and decode p95 twice their
    baseline, the others and all traffic held."""
    def f(labels: dict, value: float = 0.0, baseline: float = 0.0, n: int = 880) -> dict:
        return {"check": "latency", "labels": labels, "status": "breach" if value > 1.4 * baseline > 0 else "ok",
                "value": value, "baseline": baseline, "n": n, "model_version": "llm-7b", "window_start": T0,
                "window_end": T1, "detail": {}}

    out = [f({"rate": r}) for r in ("failure", "timeout", "reject")]
    out.append(f({"stage": "total", "quantile": "p95"}, 900.0, 800.0))
    for lang, n in {"en": 600, "es": 170, "de": 110}.items():
        seg, ratio = {"segment": f"lang={lang}"}, 2.0 if lang == slow else 1.0
        out += [f({**seg, "rate": r}, n=n) for r in ("failure", "timeout", "reject")]
        out.append(f({**seg, "stage": "total", "quantile": "p95"}, 800.0 * ratio, 800.0, n))
        out.append(f({**seg, "stage": "decode", "quantile": "p95"}, 700.0 * ratio, 700.0, n))
    return out


def test_a_slowdown_that_moves_to_another_segment_changes_the_alerts_digest():
    from monitor.alerts.samples import verdict_annotations
    from monitor.verdicts.verdict import decide

    de, es = (decide(window(lang), service="gen", model_version="llm-7b", window_start=T0, window_end=T1,
                     now=T1 + timedelta(minutes=5)) for lang in ("de", "es"))
    assert (de.verdict, de.attribution.get("segment")) == ("slower", "lang=de"), de.summary
    assert (es.verdict, es.attribution.get("segment")) == ("slower", "lang=es"), es.summary
    assert de.attribution.get("top_stage") == es.attribution.get("top_stage")  # all else alike
    assert verdict_annotations(de)["digest"] != verdict_annotations(es)["digest"]
    assert verdict_annotations(de)["digest"] == verdict_annotations(
        decide(window("de"), service="gen", model_version="llm-7b", window_start=T0, window_end=T1,
               now=T1 + timedelta(minutes=9)))["digest"]
