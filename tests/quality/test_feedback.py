"""Feedback labels (thumbs up / down, or a numeric score) scored without a `prediction` column: a rate or a
mean per group with its n and interval, acceptance rules on it, and the verdict that follows. Checked on a
public survey read as feedback (statsmodels' ANES 1996: `vote` as thumbs, the 1-7 `selfLR` scale as a
score, by education) against statsmodels' own intervals, and on the simulated generation service."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.proportion import proportion_confint
from statsmodels.stats.weightstats import DescrStatsW

from checks.quality import feedback_measure
from monitor import config as config_mod
from monitor.ingest.labels import feedback_scores, label_batch
from monitor.ingest.sources.batch import LINE
from monitor.verdicts.quality import reference_quality, score_window

T0 = datetime(2026, 11, 2, tzinfo=UTC)
HOUR = timedelta(hours=1)
THUMBS = {"positive": [1], "negative": [0]}  # ANES `vote`: 1.0 Dole, 0.0 Clinton, read as thumbs up / down


def anes() -> pd.DataFrame:
    from statsmodels.datasets import anes96

    d = anes96.load_pandas().data
    return pd.DataFrame({"educ": d["educ"].astype(int).astype(str), "vote": d["vote"], "selfLR": d["selfLR"]})


def service(root: Path, feedback: dict, rules: list[dict], reference: pd.DataFrame | None = None, **quality):
    """A service with no prediction, classes or scores: segment `educ`, labels that are feedback."""
    for sub in ("p", "l"):
        (root / sub).mkdir(exist_ok=True)
    svc = {"name": "chat", "sources": {"predictions": {"kind": "files", "path": str(root / "p")},
                                       "labels": {"kind": "files", "path": str(root / "l")}},
           "schema": {"features": {"educ": "categorical"}, "segments": ["educ"]},
           "quality": {"windows": ["1h"], "min_n": 30, "feedback": feedback, "rules": rules} | quality}
    if reference is not None:
        path = root / f"reference-{len(list(root.glob('reference-*')))}.parquet"
        reference.to_parquet(path, index=False)
        svc["reference"] = {"path": str(path)}
    return config_mod.parse({"storage": {"url": "sqlite://"}, "services": [svc]}, base_dir=root).services[0]


def rows(frame: pd.DataFrame, label: str, start: datetime, version: str = "v1", status: str = "ok",
         prefix: str = "r") -> list[tuple]:
    """Stored (prediction, label) rows as Store.labels.load gives them: no prediction, no scores."""
    step = HOUR / (len(frame) + 1)
    return [(f"{prefix}-{version}-{start:%H}-{i}", version, start + step * i, status, None, None, {"educ": e},
             None if pd.isna(v) else json.dumps(v), 0)
            for i, (e, v) in enumerate(zip(frame["educ"], frame[label], strict=True))]


def found(windows, check: str, status: str | None = None, **labels) -> list:
    return [f for w in windows for f in w.findings if f.check == check and status in (None, f.status)
            and all(f.labels.get(k) == v for k, v in labels.items())]


# -- the measure ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("values", "metric", "bounds", "value", "n"), [
    ([1, 1, 0, 1], "feedback_rate", (None, None), 0.75, 4),
    ([1, np.nan, 0], "feedback_rate", (None, None), 0.5, 2),  # a request without feedback is not a zero
    ([], "feedback_rate", (None, None), None, 0),
    ([5, 4, 4, 3, 5], "feedback_mean", (1, 5), 4.2, 5),
    ([5, 5], "feedback_mean", (1, 5), 5.0, 2),  # the interval stops at the scale's end
    ([3.0], "feedback_mean", (1, 5), 3.0, 1),  # one score: a value, no interval
])
def test_feedback_measure(values, metric, bounds, value, n):
    m = feedback_measure(np.array(values, dtype=float), metric, bounds)
    assert (m.metric, m.cls, m.n) == (metric, "all", n)
    assert m.value == (None if value is None else pytest.approx(value))
    if n >= 2:
        lo, hi = m.interval
        assert lo <= m.value <= hi and (bounds[1] is None or hi <= bounds[1])
    else:
        assert m.interval is None


def test_anes_per_group_matches_statsmodels(tmp_path):
    """Each education group's rate (Wilson) and mean (Student t) as statsmodels computes them."""
    d = anes()
    for label, feedback, metric in (("vote", THUMBS, "feedback_rate"), ("selfLR", {"min": 1, "max": 7}, "feedback_mean")):
        svc = service(tmp_path, feedback, [])
        w = score_window(svc, rows(d, label, T0), T0, T0 + HOUR, T0 + 30 * HOUR, reference_quality(svc))
        assert len(w) == 1 and w[0].matured and w[0].labelled == len(d)
        for educ, part in d.groupby("educ"):
            (f,) = found(w, "quality", group=f"educ={educ}", metric=metric)
            x = part[label].to_numpy(float)
            if metric == "feedback_rate":
                expected = proportion_confint(int(x.sum()), len(x), method="wilson")
            else:
                expected = DescrStatsW(x).tconfint_mean()
                expected = (max(1, expected[0]), min(7, expected[1]))
            assert f.n == len(x) and f.value == pytest.approx(x.mean())
            assert f.interval == pytest.approx(expected, abs=1e-9)
            assert f.status == ("ok" if len(x) >= 30 else "insufficient")
        assert not found(w, "quality_estimate") and not found(w, "label_bias") and not found(w, "version_compare")
        (cov,) = found(w, "label_coverage")
        assert cov.value == 1.0 and cov.labels == {"class": "all"}


# -- rules ----------------------------------------------------------------------------------------

def _drop(d: pd.DataFrame, educ: str, share: float, seed: int = 0) -> pd.DataFrame:
    """`d` with `share` of group `educ`'s thumbs up turned down (a regression only that group sees)."""
    out = d.copy()
    rng = np.random.default_rng(seed)
    up = np.flatnonzero((out["educ"] == educ).to_numpy() & (out["vote"] == 1).to_numpy())
    out.loc[out.index[rng.choice(up, int(len(up) * share), replace=False)], "vote"] = 0.0
    return out


def test_a_drop_in_one_group_breaches_its_rule_against_the_reference(tmp_path):
    d = anes()
    rng = np.random.default_rng(3)
    half = rng.permutation(len(d)) < len(d) // 2
    reference = d[half].rename(columns={"vote": "label"})[["educ", "label"]]
    rule = {"name": "thumbs up per education", "metric": "feedback_rate", "group": "*", "max_drop": 0.1}
    svc = service(tmp_path, THUMBS, [rule], reference)
    ref = reference_quality(svc)
    assert ref.measures[("feedback_rate", "all", "educ=6")].n == int((reference["educ"] == "6").sum())
    served = d[~half]
    healthy = score_window(svc, rows(served, "vote", T0), T0, T0 + HOUR, T0 + 30 * HOUR, ref)
    assert not found(healthy, "acceptance", status="breach")  # the other half of the same survey
    worse = score_window(svc, rows(_drop(served, "6", 0.6), "vote", T0), T0, T0 + HOUR, T0 + 30 * HOUR, ref)
    breaches = found(worse, "acceptance", status="breach")
    assert [f.labels["group"] for f in breaches] == ["educ=6"]
    (f,) = breaches
    assert f.labels["metric"] == "feedback_rate" and f.labels["class"] == "all" and f.baseline is not None
    assert f.detail["method"] == "newcombe" and f.detail["difference_interval"][1] < -0.1
    # the overall figure moves less than the rule's tolerance: only the group shows it
    (overall,) = found(worse, "quality", group="all")
    assert overall.value - ref.values[("feedback_rate", "all", "all")] > -0.1


def test_numeric_scores_and_a_min_rule(tmp_path):
    d = anes()
    svc = service(tmp_path, {"min": 1, "max": 7}, [{"metric": "feedback_mean", "group": "*", "min": 4.0}])
    w = score_window(svc, rows(d, "selfLR", T0), T0, T0 + HOUR, T0 + 30 * HOUR, reference_quality(svc))
    decided = {f.labels["group"]: f for f in found(w, "acceptance")}
    means = d.groupby("educ")["selfLR"].mean()
    for educ, mean in means.items():
        f = decided[f"educ={educ}"]
        assert f.status == "insufficient" or f.detail["method"] == "t"
        if f.status == "breach":
            assert mean < 4.0 and f.detail["difference_interval"][1] < 0
    assert any(f.status == "ok" for f in decided.values())  # every group's mean lies above 4 in ANES


def test_failed_requests_and_maturity(tmp_path):
    d = anes().iloc[:200]
    svc = service(tmp_path, THUMBS, [], maturity_horizon="2h", coverage_threshold=0.5)
    some = rows(d, "vote", T0)
    unlabelled = [r[:7] + (None, 0) for r in rows(d, "vote", T0, prefix="u")]
    failed = rows(d.iloc[:20], "vote", T0, status="timeout", prefix="f")
    early = score_window(svc, some[:100] + unlabelled, T0, T0 + HOUR, T0 + HOUR, reference_quality(svc))
    assert not early[0].matured and not found(early, "quality")
    (cov,) = found(early, "label_coverage")
    assert cov.value == pytest.approx(100 / 300) and cov.n == 300
    late = score_window(svc, some + failed, T0, T0 + HOUR, T0 + 3 * HOUR, reference_quality(svc))
    (q,) = found(late, "quality", group="all")
    assert q.n == 200 and late[0].predictions == 200  # the timed-out requests' feedback is left out


# -- config and labels ----------------------------------------------------------------------------

@pytest.mark.parametrize(("feedback", "rules", "error"), [
    ({"positive": ["up"]}, [], "list both positive and negative"),
    ({"positive": ["up"], "negative": ["up"]}, [], "both positive and negative"),
    ({"positive": ["up"], "negative": ["down"], "max": 5}, [], "min and max bound numeric scores"),
    ({"min": 5, "max": 1}, [], "is not above min"),
    (None, [{"metric": "feedback_rate", "max_drop": 0.1}], "feedback_rate needs quality.feedback"),
    ({"min": 1, "max": 5}, [{"metric": "feedback_rate", "max_drop": 0.1}], "feedback_rate needs quality.feedback"),
    ({"positive": ["up"], "negative": ["down"]}, [{"metric": "recall", "class": "up", "max_drop": 0.1}],
     "a rule judges feedback_rate, not recall"),
    ({"positive": ["up"], "negative": ["down"]}, [{"metric": "feedback_rate", "class": "up", "max_drop": 0.1}],
     "has no class"),
])
def test_config_refuses(tmp_path, feedback, rules, error):
    with pytest.raises(config_mod.ConfigError, match=error):
        service(tmp_path, feedback, rules)


def test_config_reads_thumbs_as_labels_are_named(tmp_path):
    svc = service(tmp_path, {"positive": [" up ", True], "negative": ["down", 0]},
                  [{"metric": "feedback_rate", "max_drop": 0.1}])
    fb = svc.quality.feedback
    assert (fb.positive, fb.negative, fb.metric) == (["up", "true"], ["down", "0"], "feedback_rate")
    assert svc.quality.rules[0].class_ == "all"
    scores = feedback_scores(pd.Series(["up", "true", "0", 0.0, "DOWN", None, "meh"]), fb)
    assert scores[:4].tolist() == [1.0, 1.0, 0.0, 0.0] and np.isnan(scores[4:]).all()


def test_labels_outside_the_feedback_values_are_quarantined(tmp_path):
    svc = service(tmp_path, {"min": 1, "max": 5}, [])
    batch = pd.DataFrame({"request_id": ["a", "b", "c", "d", "e"], "label": ["4", 5, "4.5", "9", "great"],
                          "_source": "l/f.jsonl", LINE: range(1, 6)})
    out = label_batch(batch, svc)
    assert [r["label"] for r in out.rows] == ["4", "5", "4.5"]
    assert [(r.reason.value, r.position) for r in out.rejects] == [("unknown_label", "l/f.jsonl:4"),
                                                                   ("unknown_label", "l/f.jsonl:5")]


# -- the simulated generation service ------------------------------------------------------------

def _generated(root: Path, scenario: str, hours: float, onset: float | None = None) -> tuple[list[tuple], object]:
    from monitor.simulate.generation import generate_generation

    gt = generate_generation(scenario, root, seed=4, hours=hours, rate_per_s=3.0, onset_hours=onset)
    read = lambda kind: pd.concat([pd.read_json(f, lines=True, dtype=False)  # noqa: E731
                                   for f in sorted((root / kind).glob("*.jsonl"))], ignore_index=True)
    p = read("predictions").merge(read("labels"), on="request_id", how="left")
    ts = pd.to_datetime(p["ts"], utc=True)
    return [(r, v, t.to_pydatetime(), s, None, None, {"lang": lang}, None if not isinstance(lab, str) else lab, 0)
            for r, v, t, s, lang, lab in zip(p["request_id"], p["model_version"], ts, p["status"], p["lang"],
                                             p["label"], strict=True)], gt


def test_generation_feedback_per_language(tmp_path):
    """The simulated service's config (monitor.simulate.generation_config) on its own logs: thumbs up per
    language with intervals holding the simulated rates; the ja drop breaches for ja alone."""
    from monitor.simulate import generation_config
    from monitor.simulate.generation import LANGS

    rows_, gt = _generated(tmp_path / "generated", "generation-worse-ja", hours=3, onset=1)
    for sub in ("predictions", "timings", "labels"):
        (tmp_path / "logs" / sub).mkdir(parents=True)
    svc = config_mod.parse(generation_config(), base_dir=tmp_path).services[0]
    ref = reference_quality(svc)
    for lang, _, _, up, _ in LANGS:  # the reference: the simulated rates, within 4 standard errors
        m = ref.measures[("feedback_rate", "all", f"lang={lang}")]
        assert abs(m.value - up) < 4 * math.sqrt(up * (1 - up) / m.n) and m.interval[0] < m.value < m.interval[1]
    end = T0 + 3 * HOUR
    decided = {}
    for h in range(3):
        start = T0 + h * HOUR
        mine = [r for r in rows_ if start <= r[2] < start + HOUR]
        w = score_window(svc, mine, start, start + HOUR, end + 3 * HOUR, ref)
        decided[h] = {f.labels["group"]: f.status for f in found(w, "acceptance")}
        if h == 0:
            (f,) = found(w, "quality", group="lang=ja")
            assert f.interval[0] <= 0.77 <= f.interval[1] and not math.isnan(f.value)
    assert "breach" not in decided[0].values()
    for h in (1, 2):  # after the new prompt template: ja, and no other language
        assert {g for g, s in decided[h].items() if s == "breach"} <= {"lang=ja"}
    assert "breach" in (decided[1]["lang=ja"], decided[2]["lang=ja"])
    assert gt.segment == "lang=ja" and gt.verdict == "worse"
