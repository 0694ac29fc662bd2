"""Label ingestion through the tick, on SQLite and PostgreSQL: late, repeated, changed, unknown and unmatched
labels; the scored predictions they join to; group expressions kept safe."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from monitor import config as config_mod
from monitor.config import ConfigError
from monitor.daemon.runner import tick
from storage.models import LabelRow, ScoredPrediction

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


def prediction(i: int, status: str = "ok", rid: str | None = None, at: datetime | None = None) -> dict:
    score = [0.9, 0.2, 0.7, 0.1, 0.8, 0.3][i % 6]
    return {"request_id": rid or f"r{i}", "ts": iso(at or T0 + timedelta(minutes=i)), "model_version": "v1",
            "status": status, "tenure": 3 + 10 * i, "Contract": ["One year", "Two year"][i % 2],
            "notes": "x" * (100 * i), "prediction": "Yes" if score >= 0.5 else "No", "score_Yes": score}


def label(rid: str, value: str, at: datetime) -> dict:
    return {"request_id": rid, "label": value, "label_ts": iso(at)}


def make_config(root: Path, store_url: str, **quality) -> config_mod.Config:
    return config_mod.parse(raw_config(root, store_url, **quality), base_dir=root)


def raw_config(root: Path, store_url: str, **quality) -> dict:
    (root / "predictions").mkdir(parents=True, exist_ok=True)
    (root / "labels").mkdir(parents=True, exist_ok=True)
    return {"storage": {"url": store_url}, "services": [{
        "name": "svc",
        "sources": {"predictions": {"kind": "files", "path": str(root / "predictions")},
                    "labels": {"kind": "files", "path": str(root / "labels")}},
        "schema": {"features": {"tenure": "numeric", "Contract": "categorical", "notes": "text"},
                   "segments": ["Contract"], "classes": ["No", "Yes"], "positive_class": "Yes"},
        "quality": {"windows": ["1h"], "min_n": 1, "label_horizon": "1d", "coverage_threshold": 0.5,
                    "groups": {"new": "tenure < 12 and notes_length >= 0"}, "length_buckets": {"notes": [250]},
                    "bootstrap_samples": 20} | quality,
    }]}


def labels_in(store, service: str = "svc") -> dict[str, tuple[str, int]]:
    with store.transaction() as session:
        return {r.request_id: (r.label, r.changes)
                for r in session.scalars(select(LabelRow).where(LabelRow.service == service))}


def test_late_changed_repeated_unknown_and_unmatched_labels(store, tmp_path: Path) -> None:
    cfg = make_config(tmp_path, "sqlite://")
    write(tmp_path / "predictions" / "p1.jsonl", [prediction(i) for i in range(5)] + [prediction(5, "timeout")])
    t1 = T0 + timedelta(hours=2)
    write(tmp_path / "labels" / "l1.jsonl", [
        label("r0", "Yes", t1 - timedelta(minutes=30)),
        label("r1", "No", t1 - timedelta(minutes=30)),
        label("r9", "Yes", t1 - timedelta(minutes=20)),  # no such prediction (yet)
        label("r3", "Maybe", t1 - timedelta(minutes=10)),  # not a declared class
    ])
    r = tick(cfg, store, t1)[0]
    assert r.status == "ok", r.error
    assert (r.labels_new, r.labels_changed, r.labels_repeated, r.labels_expired) == (3, 0, 0, 0)
    assert r.quarantined == {"unknown_label": 1}
    with store.transaction() as session:
        stored = session.scalars(select(ScoredPrediction).order_by(ScoredPrediction.request_id)).all()
    assert [s.request_id for s in stored] == [f"r{i}" for i in range(6)]
    assert stored[0].scores == {"Yes": 0.9} and stored[0].prediction == "Yes"
    # Only what the groups read: the segment, tenure, and the notes' length (not the notes themselves).
    assert stored[2].attrs == {"Contract": "One year", "tenure": 23, "notes_length": 200}
    assert stored[5].status == "timeout"

    t2 = t1 + timedelta(hours=3)
    write(tmp_path / "labels" / "l1.jsonl", [
        label("r0", "No", t2 - timedelta(minutes=5)),  # changed, newer: the latest wins
        label("r1", "No", t2 - timedelta(minutes=5)),  # repeated
        label("r1", "Yes", t1 - timedelta(hours=1)),  # changed but older than the stored one: counted, kept
        label("r10", "Yes", t2 - timedelta(minutes=5)),  # its prediction arrives in the same tick, late
    ])
    write(tmp_path / "predictions" / "p2.jsonl", [prediction(10, rid="r10", at=T0 + timedelta(minutes=50))])
    r = tick(cfg, store, t2)[0]
    assert r.status == "ok", r.error
    assert (r.labels_new, r.labels_changed, r.labels_repeated) == (1, 2, 1)
    assert labels_in(store) == {"r0": ("No", 1), "r1": ("No", 1), "r9": ("Yes", 0), "r10": ("Yes", 0)}

    # A day after r9's label was first read its prediction has still not come: quarantined, not scored.
    r = tick(cfg, store, t1 + timedelta(days=1, minutes=1))[0]
    assert r.labels_expired == 1 and r.quarantined == {"orphan_label": 1}
    assert set(labels_in(store)) == {"r0", "r1", "r10"}
    with store.transaction() as session:
        assert store.quarantine.counts(session, "svc") == {"unknown_label": 1, "orphan_label": 1}
    assert any("are left out" in n for n in r.notes)  # the failed-as-miss choice, stated in every report


def test_label_changes_rescore_the_window_in_place(store, tmp_path: Path) -> None:
    cfg = make_config(tmp_path, "sqlite://", failed_as_miss=True)
    write(tmp_path / "predictions" / "p1.jsonl", [prediction(i) for i in range(5)] + [prediction(5, "timeout")])
    write(tmp_path / "labels" / "l1.jsonl", [label(f"r{i}", "Yes", T0 + timedelta(hours=1)) for i in range(6)])
    t1 = T0 + timedelta(hours=2)
    assert tick(cfg, store, t1)[0].status == "ok"

    def recall_yes() -> dict:
        with store.transaction() as session:
            rows = store.findings.load(session, "svc", check="quality")
        return next(f for f in rows if f["labels"] == {"metric": "recall", "class": "Yes", "group": "all"})

    first = recall_yes()
    # Six Yes labels; predicted Yes for r0, r2, r4; the timed-out r5 counts as a miss.
    assert first["value"] == pytest.approx(3 / 6) and first["n"] == 6 and first["detail"]["failed_as_miss"]
    write(tmp_path / "labels" / "l1.jsonl", [label("r1", "No", T0 + timedelta(hours=3))])
    assert tick(cfg, store, t1 + timedelta(hours=2))[0].status == "ok"
    second = recall_yes()
    assert second["id"] == first["id"] and second["value"] == pytest.approx(3 / 5) and second["n"] == 5
    group_names = {f["labels"]["group"] for f in _all(store, "quality")}
    assert group_names == {"all", "Contract=One year", "Contract=Two year", "new", "notes_length<250",
                           "notes_length>=250"}


def _all(store, check: str) -> list[dict]:
    with store.transaction() as session:
        return store.findings.load(session, "svc", check=check)


@pytest.mark.parametrize("expression", [
    "__import__('os').system('true')", "tenure.__class__", "Contract.str.len() > 3", "@x > 1", "tenure < x",
    "lambda: 1",
])
def test_group_expressions_only_compare_declared_columns(tmp_path: Path, expression: str) -> None:
    with pytest.raises(ConfigError) as err:
        make_config(tmp_path, "sqlite://", groups={"g": expression})
    assert "quality" in str(err.value)


def test_quality_needs_a_labels_source(tmp_path: Path) -> None:
    raw = raw_config(tmp_path, "sqlite://")
    raw["services"][0]["sources"].pop("labels")
    with pytest.raises(ConfigError, match="quality needs sources.labels"):
        config_mod.parse(raw)


def test_shadow_versions_compared_on_shared_requests(store, tmp_path: Path) -> None:
    """Two versions score the same requests (shadow): both are kept, compared pairwise, and the accepted
    version is the acceptance baseline."""
    # One decision in the hour with the whole false-discovery budget (fdr_period = the window): 24 positives.
    cfg = make_config(tmp_path, "sqlite://", min_n=5, accepted_version="v1", groups={}, length_buckets={},
                      rules=[{"name": "recall vs v1", "metric": "recall", "class": "Yes", "max_drop": 0.01}],
                      fdr_period="1h")
    rows, labels = [], []
    for i in range(40):
        score = (i % 10) / 10 + 0.05
        truth = "Yes" if (i % 10) >= 4 else "No"
        for version, threshold in (("v1", 0.5), ("v2", 0.75)):
            row = prediction(i, at=T0 + timedelta(seconds=30 * i))
            row |= {"model_version": version, "score_Yes": score, "prediction": "Yes" if score >= threshold else "No"}
            rows.append(row)
        labels.append(label(f"r{i}", truth, T0 + timedelta(hours=1)))
    write(tmp_path / "predictions" / "p.jsonl", rows)
    write(tmp_path / "labels" / "l.jsonl", labels)
    r = tick(cfg, store, T0 + timedelta(hours=2))[0]
    assert r.status == "ok", r.error
    compare = _all(store, "version_compare")
    assert {c["model_version"] for c in compare} == {"v2"} and all(c["labels"]["against"] == "v1" for c in compare)
    recall = next(c for c in compare if c["labels"]["metric"] == "recall" and c["labels"]["class"] == "Yes")
    # Yes requests score 0.45..0.95; v1 says Yes from 0.55 up (recall 5/6), v2 from 0.75 (3/6).
    assert recall["value"] == pytest.approx(3 / 6 - 5 / 6) and recall["n"] == 40
    assert recall["detail"]["to_negative"] == 8 and recall["detail"]["to_positive"] == 0
    assert recall["detail"]["became_wrong"] == 8 and recall["detail"]["became_right"] == 0
    rules = {a["model_version"]: a for a in _all(store, "acceptance")}
    assert rules["v2"]["detail"]["baseline_from"] == "version v1" and rules["v2"]["status"] == "breach"
    assert rules["v2"]["detail"]["baseline_n"] == 24 and rules["v2"]["detail"]["method"] == "newcombe"
    assert rules["v1"]["detail"]["baseline_from"] == "reference" and rules["v1"]["status"] == "insufficient"
