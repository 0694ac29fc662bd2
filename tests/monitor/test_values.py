"""A declared categorical value reads the same from the reference and from every log source: a boolean, an
integer code and a category name land in the reference's own bin however each side wrote them."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pandas as pd
import pyarrow as pa
import pytest
import sqlalchemy as sa
from tests_support import valid_row

from monitor import config as config_mod
from monitor.aggregate.profile import build_profile, read_reference
from monitor.config import Limits
from monitor.contract import RecordKind
from monitor.ingest.accept import check_batch
from monitor.ingest.sources import open_source
from monitor.ingest.validate import validate
from monitor.schema import Schema

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
FEATURES = {"member": "categorical", "code": "categorical", "plan": "categorical"}


@pytest.mark.parametrize(("written", "fold", "name"), [
    (True, False, "true"), ("true", False, "true"), ("True", False, "true"), (" TRUE ", False, "true"),
    (False, False, "false"), ("false", False, "false"),
    (1, False, "1"), ("1", False, "1"), (1.0, False, "1"), (" 1 ", False, "1"), ("1.0", False, "1"),
    (2.5, False, "2.5"),
    ("Gold", False, "Gold"), (" Gold ", False, "Gold"), ("gold", False, "gold"),
    ("Gold", True, "gold"), ("GOLD", True, "gold"), (" gold", True, "gold"),
    (None, False, None), ("", False, None),
])
def test_one_spelling_per_value_in_pandas_arrow_and_the_reference(written, fold, name):
    from monitor.values import category_values

    schema = Schema(features={"f": "categorical"}, fold_case=["f"] if fold else [])
    assert category_values(pd.Series([written], dtype=object), fold).tolist() == [name]
    row = {"request_id": "r", "ts": "2026-11-02T10:00:00Z", "model_version": "v1", "status": "ok", "f": written,
           "_line": 1}
    accepted, rejects = validate(RecordKind.predictions, pd.DataFrame([row]), "f.jsonl", schema, Limits(), NOW)
    assert rejects == [] and accepted["f"].tolist() == [name]
    if written is not None:  # Arrow: the column typed as it was written (a bool, a number or text)
        table = pa.table({k: [v] for k, v in row.items()})
        accepted, rejects = validate(RecordKind.predictions, table, "f.parquet", schema, Limits(), NOW)
        assert rejects == [] and [None if pd.isna(v) else v for v in accepted["f"]] == [name]
    profile = build_profile(pd.DataFrame({"f": [written, written]}), schema)
    assert profile.fields["f"].categories == (() if name is None else (name,))


def _reference(tmp_path) -> str:
    """A Parquet reference with a bool, an integer and a text column."""
    path = tmp_path / "reference.parquet"
    pd.DataFrame({"member": [True, False, True, False], "code": [1, 2, 3, 1],
                  "plan": ["Gold", "Silver", "Gold", "Bronze"]}).to_parquet(path, index=False)
    return str(path)


# (member, code, plan) as each source writes them, and the reference category each must read as.
WRITTEN = [(True, 1, "Gold"), ("true", "1", "gold"), ("TRUE", 1.0, " GOLD "), (False, "2", "Silver"),
           ("false", 3.0, "bronze")]
READ = [("true", "1", "gold"), ("true", "1", "gold"), ("true", "1", "gold"), ("false", "2", "silver"),
        ("false", "3", "bronze")]


def _rows() -> list[dict]:
    return [valid_row(i) | dict(zip(FEATURES, w, strict=True)) for i, w in enumerate(WRITTEN)]


def _jsonl(tmp_path) -> dict:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    return {"kind": "files", "path": str(tmp_path / "logs")}


def _csv(tmp_path) -> dict:
    (tmp_path / "logs").mkdir()
    pd.DataFrame(_rows()).to_csv(tmp_path / "logs" / "a.csv", index=False)
    return {"kind": "files", "path": str(tmp_path / "logs")}


def _parquet(tmp_path) -> dict:
    (tmp_path / "logs").mkdir()
    frame = pd.DataFrame(_rows())
    # Parquet holds one type per column: a bool, an integer and a text column, as a writer would.
    frame["member"] = [str(m).lower() == "true" for m in frame["member"]]
    frame["code"] = [int(float(c)) for c in frame["code"]]
    frame.to_parquet(tmp_path / "logs" / "a.parquet", index=False)
    return {"kind": "files", "path": str(tmp_path / "logs")}


def _sql(tmp_path) -> dict:
    url = f"sqlite:///{tmp_path / 'logs.db'}"
    frame = pd.DataFrame(_rows())
    # SQLite has no boolean type: a table keeps the flag as text, and a code as a REAL column.
    frame["member"] = [str(m) for m in frame["member"]]
    frame["code"] = [float(c) for c in frame["code"]]
    frame["seq"] = range(len(frame))
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        frame.to_sql("predictions", conn, index=False)
    engine.dispose()
    return {"kind": "sql", "url": url, "table": "predictions", "cursor_column": "seq"}


@pytest.mark.parametrize("make_source", [_jsonl, _csv, _parquet, _sql], ids=["jsonl", "csv", "parquet", "sql"])
def test_log_values_land_in_the_reference_bins_from_every_source(tmp_path, make_source):
    cfg = config_mod.parse({"services": [{
        "name": "svc", "sources": {"predictions": make_source(tmp_path)},
        "schema": {"features": FEATURES, "fold_case": ["plan"]}, "reference": {"path": _reference(tmp_path)}}]},
        base_dir=tmp_path)
    service = cfg.services[0]
    profile = build_profile(read_reference(service.reference.path), service.schema_)
    assert profile.fields["member"].categories == ("false", "true")
    source = service.sources.predictions
    batches = list(open_source("svc/predictions", source, cfg.limits).read({}))
    accepted = pd.concat([check_batch(b, RecordKind.predictions, service.schema_, cfg.limits, NOW, source)[0]
                          for b in batches], ignore_index=True)
    assert len(accepted) == len(WRITTEN)
    for k, name in enumerate(FEATURES):
        field = profile.fields[name]
        read = [field.categories[i] if 0 <= i < len(field.categories) else "<other>"
                for i in field.category_index(accepted[name])]
        assert read == [r[k] for r in READ], name


def test_values_differing_only_in_spelling_are_paired():
    from monitor.values import respelled

    assert respelled(["Gold", "Silver", "Fiber optic"], ["gold", "Silver", "GOLD", "gold", "Fiber  optic", "Iron"]) \
        == [("Gold", "gold"), ("Gold", "GOLD"), ("Fiber optic", "Fiber  optic")]


def test_a_boolean_feature_profiled_from_parquet_is_not_drift_in_json_logs(tmp_path):
    from monitor.daemon.runner import tick
    from storage.store import Store

    reference = tmp_path / "reference.parquet"
    pd.DataFrame({"member": [i % 3 == 0 for i in range(3000)], "tenure": [i % 72 for i in range(3000)]}) \
        .to_parquet(reference, index=False)
    (tmp_path / "logs").mkdir()
    rows = [valid_row(i) | {"member": i % 3 == 0} for i in range(2400)]  # the reference's own mix
    (tmp_path / "logs" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config_mod.parse({
        "storage": {"url": f"sqlite:///{tmp_path / 'tw.db'}"},
        "services": [{"name": "svc", "sources": {"predictions": {"kind": "files", "path": str(tmp_path / "logs")}},
                      "schema": {"features": {"member": "categorical", "tenure": "numeric"}},
                      "reference": {"path": str(reference)}}]}, base_dir=tmp_path)
    store = Store(cfg.storage.url)
    store.upgrade()
    try:
        [report] = tick(cfg, store, NOW)
        assert report.status == "ok", report.error
        with store.transaction() as session:
            found = [f for f in store.findings.load(session, "svc")
                     if f["labels"].get("field") == "member" and f["check"] in ("drift", "unseen_categories")]
    finally:
        store.dispose()
    assert {f["check"] for f in found} == {"drift", "unseen_categories"}
    assert [f for f in found if f["status"] == "breach"] == []
