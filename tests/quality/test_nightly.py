"""End to end on simulated scenarios: predictions ingested by the tick, labels landing in three waves,
windows maturing and re-scored in place, then `nightly` (idempotent) — on SQLite and PostgreSQL.

Six simulated hours at 1 request/s (~15,000 predictions, ~11,000 labels), quality per 1-hour window.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support import RULES, at, quality_config, quality_raw, release_labels, simulate
from typer.testing import CliRunner

from monitor.daemon.nightly import run_nightly
from monitor.daemon.runner import tick
from storage.store import Store

pytestmark = pytest.mark.slow

WAVES = (0.2, 24.0, 96.0)  # hours after the run's end: few labels, most Yes labels, nearly all
RARE = {"rare": "MonthlyCharges > 116"}  # 10-16 requests an hour: always below min_n
RARE_RULE = {"name": "rare floor", "metric": "recall", "class": "Yes", "group": "rare", "min": 0.99}


def findings(store, check: str) -> list[dict]:
    with store.transaction() as session:
        return store.findings.load(session, "churn", check=check)


def one(rows: list[dict], **labels) -> list[dict]:
    return [r for r in rows if all(r["labels"].get(k) == v for k, v in labels.items())]


@pytest.fixture(scope="module")
def worse_threshold(tmp_path_factory):
    root = tmp_path_factory.mktemp("worse-threshold")
    truth, labels = simulate("worse-threshold", root)
    return root, truth, labels


def test_worse_threshold_labels_in_waves_then_nightly(store, worse_threshold, tmp_path: Path) -> None:
    root, truth, labels = worse_threshold
    work = tmp_path / "run"
    work.mkdir()
    (work / "generated").symlink_to(root / "generated")
    cfg = quality_config(work, "sqlite://", coverage_threshold=0.3)

    # Wave 1: a few labels. Nothing has matured: coverage, bias and estimates only, no quality figure.
    release_labels(work, labels, at(truth, WAVES[0]), 0)
    r = tick(cfg, store, at(truth, WAVES[0]))[0]
    assert r.status == "ok", r.error
    assert r.read["predictions"] == truth.counts["predictions"] and r.quality_windows == 6
    assert not findings(store, "quality") and not findings(store, "acceptance")
    coverage = one(findings(store, "label_coverage"), **{"class": "all"})
    assert len(coverage) == 6 and all(c["value"] < 0.3 and not c["detail"]["matured"] for c in coverage)
    estimates = one(findings(store, "quality_estimate"), metric="recall", group="all", **{"class": "Yes"})
    assert estimates and all(e["detail"]["estimated"] and e["detail"]["realized"] is None for e in estimates)
    # The simulator's labels arrive faster and more often for churners: biased coverage is flagged as soon
    # as a window has labels enough (the oldest windows first).
    bias = findings(store, "label_bias")
    shares = bias[0]["detail"]["labelled_share"]
    assert bias[0]["status"] == "breach" and shares["Yes"] > shares["No"] + 0.05

    # Wave 2: windows pass 30% coverage and are scored; v2's churn recall breaches its rule.
    release_labels(work, labels, at(truth, WAVES[1]), 1)
    r = tick(cfg, store, at(truth, WAVES[1]))[0]
    assert r.status == "ok", r.error
    second = {(x["window_start"], x["model_version"]): x
              for x in one(findings(store, "quality"), metric="recall", group="all", **{"class": "Yes"})}
    assert len(second) == 6
    rule2 = one(findings(store, "acceptance"), rule="churn recall")
    assert {x["model_version"] for x in rule2 if x["status"] == "breach"} == {"v2"}

    # Wave 3: the rest lands; the same rows are rewritten with more labels (scores and rule state follow).
    release_labels(work, labels, at(truth, WAVES[2]), 2)
    r = tick(cfg, store, at(truth, WAVES[2]))[0]
    assert r.status == "ok", r.error and r.labels_new > 0
    third = {(x["window_start"], x["model_version"]): x
             for x in one(findings(store, "quality"), metric="recall", group="all", **{"class": "Yes"})}
    assert third.keys() == second.keys()
    for key, f in third.items():
        assert f["id"] == second[key]["id"] and f["n"] > second[key]["n"]
    assert any(third[k]["value"] != second[k]["value"] for k in third)
    rule3 = {x["id"]: x for x in one(findings(store, "acceptance"), rule="churn recall")}
    assert rule3.keys() == {x["id"] for x in rule2}  # rewritten in place: the alert state follows them
    assert all(rule3[x["id"]]["n"] > x["n"] for x in rule2)

    report = run_nightly(cfg, store, at(truth, WAVES[2]))
    s = report.services[0]
    assert (s.windows, s.matured) == (6, 6) and not s.failed_as_miss
    breaches = [b for b in s.breaches if " acceptance " in b]
    assert breaches and all(" v2 " in b for b in breaches)  # v1 (before the onset) never breaches
    # Each in words a person acts on: the rule's figure against its floor, with n and the interval.
    assert all("rule=" in b and " vs floor " in b and "n=" in b and "95% CI" in b for b in breaches), breaches
    assert s.estimate_error["recall:Yes"] < 0.1  # the estimate's error, reported per metric and class
    assert all(b["status"] == "breach" for b in findings(store, "label_bias"))
    first_run = {x["id"]: x for c in ("quality", "acceptance", "quality_estimate") for x in findings(store, c)}
    again = run_nightly(cfg, store, at(truth, WAVES[2]))
    assert again.services[0].findings == s.findings
    second_run = {x["id"]: x for c in ("quality", "acceptance", "quality_estimate") for x in findings(store, c)}
    assert second_run == first_run  # a rerun gives identical stored results

    v2 = one(findings(store, "quality"), metric="recall", group="all", **{"class": "Yes"})
    for f in v2:
        assert f["interval_low"] <= f["value"] <= f["interval_high"] and f["baseline"] is not None


def sqlite_store(root: Path) -> Store:
    store = Store(f"sqlite:///{root / 'tw.db'}")
    store.upgrade()
    return store


def test_worse_preprocessing_finds_the_segment_not_the_whole(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path)
    truth, labels = simulate("worse-preprocessing", tmp_path)
    # The segment's recall falls from 0.86 (214 reference positives, +-0.05) to ~0.70: a drop beyond 0.05
    # with both uncertainties, not clearly beyond 0.10.
    rules = [dict(r, max_drop=0.05) if r["name"] == "short tenure recall" else r for r in RULES]
    cfg = quality_config(tmp_path, "sqlite://", groups={"short_tenure": "tenure < 12"} | RARE,
                         rules=[*rules, RARE_RULE])
    release_labels(tmp_path, labels, at(truth, WAVES[2]), 0)
    assert tick(cfg, store, at(truth, WAVES[2]))[0].status == "ok"
    s = run_nightly(cfg, store, at(truth, WAVES[2])).services[0]
    rules = findings(store, "acceptance")
    onset = truth.onset[:13]
    segment = [r for r in one(rules, rule="short tenure recall") if r["window_start"].isoformat() >= onset]
    assert any(r["status"] == "breach" for r in segment)
    for r in segment:  # found with its n and its interval
        assert r["n"] >= 30 and r["interval_high"] < r["baseline"]
    before = [r for r in one(rules, rule="short tenure recall") if r["window_start"].isoformat() < onset]
    assert before and all(r["status"] != "breach" for r in before)
    assert all(r["status"] != "breach" for r in one(rules, rule="macro f1"))  # overall F1 within tolerance
    rare = one(rules, rule="rare floor")
    assert rare and all(r["status"] == "insufficient" and r["n"] < 30 for r in rare)
    assert all(f["status"] == "insufficient" for f in one(findings(store, "quality"), group="rare"))
    assert s.estimate_error


def test_healthy_has_no_quality_breach(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path)
    truth, labels = simulate("healthy", tmp_path)
    cfg = quality_config(tmp_path, "sqlite://", groups={"short_tenure": "tenure < 12"} | RARE)
    release_labels(tmp_path, labels, at(truth, WAVES[2]), 0)
    assert tick(cfg, store, at(truth, WAVES[2]))[0].status == "ok"
    s = run_nightly(cfg, store, at(truth, WAVES[2])).services[0]
    assert s.matured == 6
    assert not [b for b in s.breaches if "label_bias" not in b]
    assert all(f["status"] != "breach" for c in ("quality", "acceptance", "quality_estimate", "label_coverage",
                                                  "version_compare") for f in findings(store, c))


def test_nightly_command(tmp_path: Path, worse_threshold) -> None:
    from monitor.cli import app

    root, truth, labels = worse_threshold
    (tmp_path / "generated").symlink_to(root / "generated")
    release_labels(tmp_path, labels, at(truth, WAVES[2]), 0)
    (tmp_path / "tw.yaml").write_text(yaml.safe_dump(quality_raw(tmp_path, "sqlite:///tw.db")))
    runner = CliRunner()
    base = ["--config", str(tmp_path / "tw.yaml")]
    assert runner.invoke(app, [*base, "db", "upgrade"]).exit_code == 0
    now = at(truth, WAVES[2]).isoformat()
    assert runner.invoke(app, [*base, "tick", "--now", now]).exit_code == 0
    result = runner.invoke(app, [*base, "nightly", "--now", now])
    assert result.exit_code == 0, result.output
    assert "nightly quality" in result.output and "churn" in result.output and "breach" in result.output
    assert " vs floor " in result.output and "95% CI" in result.output  # a breach line carries its figures
    bad = runner.invoke(app, [*base, "nightly", "--date", "yesterday"])
    assert bad.exit_code == 2 and "--date" in bad.output
