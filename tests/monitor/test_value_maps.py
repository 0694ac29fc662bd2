"""`values:` maps: logs that write their own statuses, classes and categories are read as the contract and
the schema name them, in every format, before the contract checks them; `cancelled` and `truncated` are
statuses whose rates are measured; the reference takes `columns:` and `values:` too.

The data is public and was not written for tailwatch: the Wisconsin breast-cancer set bundled with
scikit-learn (its target 0/1, its original `M`/`B` diagnosis and its column names with spaces) and the
Grunfeld investment panel bundled with statsmodels (firms by full name; the logs write their tickers).
Statuses are written as services write them: a generation server's finish reasons (`stop`, `length`,
`abort`), HTTP status codes as integers (CSV, Parquet), and upper-case words in a SQL table.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
import statsmodels.api as sm
import yaml
from sklearn.datasets import load_breast_cancer
from typer.testing import CliRunner

from checks.latency import LatencyThreshold, latency
from monitor import config as config_mod
from monitor.aggregate.fold import fold
from monitor.aggregate.partial import Partial, merge_all
from monitor.aggregate.profile import profile_for, read_reference
from monitor.cli import app
from monitor.contract import STATUSES, RecordKind
from monitor.ingest.accept import check_batch
from monitor.ingest.labels import label_batch
from monitor.ingest.sources import open_source

NOW = datetime(2026, 12, 4, 13, 0, tzinfo=UTC)
START = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
CANCER = load_breast_cancer(as_frame=True).frame.head(240)
FIRMS = sm.datasets.grunfeld.load_pandas().data
TICKERS = {"General Motors": "GM", "US Steel": "X", "General Electric": "GE", "Chrysler": "C",
           "Atlantic Refining": "ARC", "IBM": "IBM", "Union Oil": "UCL", "Westinghouse": "WX",
           "Goodyear": "GT", "Diamond Match": "DM", "American Steel": "AS"}

# (format, the statuses as written, cycled over the rows, and the map to the contract's).
WRITTEN = {
    "jsonl": (["stop", "stop", "length", "abort", "stop"],
              {"stop": "ok", "length": "truncated", "abort": "cancelled"}),
    "csv": ([200, 200, 499, 504, 200], {200: "ok", 499: "cancelled", 504: "timeout"}),
    "parquet": ([200, 200, 413, 499, 200], {200: "ok", 413: "rejected", 499: "cancelled"}),
    "sql": (["FINISHED", "FINISHED", "TRUNCATED", "ABORTED", "FINISHED"],
            {"FINISHED": "ok", "TRUNCATED": "truncated", "ABORTED": "cancelled"}),
}


def prediction_rows(written: list) -> pd.DataFrame:
    """One row per breast-cancer case: the logs' own names (snake case), the model's 0/1 answer, a status
    as the service writes it, and the firm (a Grunfeld row) the request came for, by ticker."""
    n = len(CANCER)
    return pd.DataFrame({
        "request_id": [f"req-{i}" for i in range(n)],
        "ts": [(START + timedelta(seconds=20 * i)).isoformat().replace("+00:00", "Z") for i in range(n)],
        "model_version": "wdbc-v3",
        "status": [written[i % len(written)] for i in range(n)],
        "mean_radius": CANCER["mean radius"].to_numpy(),
        "mean_texture": CANCER["mean texture"].to_numpy(),
        "prediction": CANCER["target"].to_numpy(),
        "firm": [TICKERS[f] for f in FIRMS["firm"].to_numpy()[np.arange(n) % len(FIRMS)]],
        "latency_ms": 20.0 + (np.arange(n) % 7),
    })


def write_source(fmt: str, rows: pd.DataFrame, root: Path) -> dict:
    """The rows written in `fmt`; the source's config (without its `values:`)."""
    if fmt == "sql":
        url = f"sqlite:///{root / 'serving.db'}"
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            rows.assign(seq=np.arange(len(rows))).to_sql("predictions", conn, index=False)
        engine.dispose()
        return {"kind": "sql", "url": url, "table": "predictions", "cursor_column": "seq"}
    (root / "preds").mkdir()
    path = root / "preds" / f"serving.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows.to_dict("records")))
    elif fmt == "csv":
        rows.to_csv(path, index=False)
    else:
        pq.write_table(pa.Table.from_pandas(rows, preserve_index=False), path)
    return {"kind": "files", "path": str(root / "preds")}


def service_config(source: dict, values: dict | None, root: Path, **extra) -> dict:
    source = dict(source) | ({"values": values} if values is not None else {})
    return {"storage": {"url": f"sqlite:///{root / 'tw.db'}"},
            "services": [{"name": "wdbc", "sources": {"predictions": source},
                          "schema": {"features": {"mean_radius": "numeric", "mean_texture": "numeric",
                                                  "firm": "categorical"},
                                     "classes": ["malignant", "benign"]}, **extra}]}


def accepted_rows(cfg) -> tuple[pd.DataFrame, list]:
    svc = cfg.services[0]
    source = svc.sources.predictions
    frames, rejects = [], []
    for batch in open_source("wdbc/predictions", source, cfg.limits).read({}):
        ok, bad = check_batch(batch, RecordKind.predictions, svc.schema_, cfg.limits, NOW, source)
        frames.append(ok)
        rejects += bad
    return pd.concat(frames, ignore_index=True), rejects


@pytest.mark.parametrize("fmt", list(WRITTEN))
def test_statuses_classes_and_categories_map_in_every_format(fmt, tmp_path):
    written, statuses = WRITTEN[fmt]
    rows = prediction_rows(written)
    source = write_source(fmt, rows, tmp_path)
    values = {"status": statuses, "prediction": {0: "malignant", 1: "benign"},
              "firm": {ticker: name for name, ticker in TICKERS.items()}}
    accepted, rejects = accepted_rows(config_mod.parse(service_config(source, values, tmp_path)))
    assert rejects == []
    assert len(accepted) == len(rows)
    meant = [statuses[s] for s in rows["status"]]
    assert accepted["status"].astype(str).tolist() == meant
    assert set(meant) <= set(STATUSES)
    assert accepted["prediction"].astype(str).tolist() == ["malignant" if t == 0 else "benign" for t in CANCER["target"]]
    assert set(accepted["firm"].astype(str)) <= set(FIRMS["firm"])

    # Without the map every row whose status is not the contract's is quarantined, naming the field.
    _, unmapped = accepted_rows(config_mod.parse(service_config(source, None, tmp_path)))
    foreign = sum(1 for s in rows["status"] if s not in STATUSES)
    assert len(unmapped) == foreign > 0
    assert {(r.reason.value, r.field) for r in unmapped} == {("unknown_status", "status")}


def test_a_status_the_map_leaves_out_stays_quarantined_and_check_logs_names_it(tmp_path, monkeypatch):
    rows = prediction_rows(["stop", "stop", "length", "content_filter", "stop"])
    source = write_source("jsonl", rows, tmp_path)
    raw = service_config(source, {"status": {"stop": "ok", "length": "truncated"}}, tmp_path)
    cfg = config_mod.parse(raw)
    accepted, rejects = accepted_rows(cfg)
    filtered = int((rows["status"] == "content_filter").sum())
    assert len(rejects) == filtered and {r.reason.value for r in rejects} == {"unknown_status"}
    assert all('"content_filter"' in r.excerpt for r in rejects)
    assert len(accepted) == len(rows) - filtered

    (tmp_path / "tailwatch.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["check-logs"], env={"COLUMNS": "200"})
    text = " ".join(result.output.split())
    assert f"status 'content_filter' ({filtered:,} rows): not a status" in text, result.output
    assert "values: {status: {content_filter: <status>}}" in text


def test_cancelled_and_truncated_rates_are_measured_and_compared_with_the_baseline(tmp_path):
    written, statuses = WRITTEN["jsonl"]
    rows = prediction_rows(written)
    # The rows as the contract reads them (the map itself is tested above): typed, statuses mapped.
    accepted = rows.assign(ts=pd.to_datetime(rows["ts"], utc=True), status=rows["status"].map(statuses))
    half = len(accepted) // 2
    # The window: the second half, with every `stop` after row 200 turned into a cancellation.
    later = accepted.iloc[half:].copy()
    later.loc[later.index >= 200, "status"] = "cancelled"

    def merged(frame):
        return merge_all([Partial.from_bytes(p.payload) for p in fold(frame, timedelta(days=1), [], False)])

    window, baseline = merged(later), merged(accepted.iloc[:half])
    findings = {f.labels.get("rate"): f for f in latency(window, None, baseline, LatencyThreshold(min_n=20))
                if "rate" in f.labels}
    assert {"cancelled", "truncated"} <= set(findings)
    truncated = findings["truncated"]
    assert truncated.value == pytest.approx((later["status"] == "truncated").mean())
    assert truncated.n == len(later)
    cancelled = findings["cancelled"]
    assert cancelled.value == pytest.approx((later["status"] == "cancelled").mean())
    assert cancelled.baseline == pytest.approx((accepted.iloc[:half]["status"] == "cancelled").mean())
    assert cancelled.status == "breach"
    # A service that never logs them has no such findings (nothing to measure), as before.
    plain = accepted.assign(status="ok")
    quiet = latency(merged(plain), None, merged(plain), LatencyThreshold(min_n=20))
    assert not [f for f in quiet if f.labels.get("rate") in ("cancelled", "truncated")]


def test_labels_in_their_own_spelling_and_a_reference_in_its_own_shape(tmp_path):
    """The labels source writes the original diagnosis (`M`/`B`); the reference is the bundled table as
    scikit-learn gives it (`target` 0/1, column names with spaces) and Grunfeld firms by full name."""
    rows = prediction_rows(["stop"])
    source = write_source("jsonl", rows, tmp_path)
    (tmp_path / "labels").mkdir()
    diagnosis = np.where(CANCER["target"] == 0, "M", "B")
    (tmp_path / "labels" / "labels.jsonl").write_text("".join(
        json.dumps({"request_id": f"req-{i}", "label": d}) + "\n" for i, d in enumerate(diagnosis)))
    reference = CANCER.assign(firm=FIRMS["firm"].to_numpy()[np.arange(len(CANCER)) % len(FIRMS)])
    reference.to_csv(tmp_path / "wdbc.csv", index=False)
    raw = service_config(source, {"status": {"stop": "ok"}, "prediction": {0: "malignant", 1: "benign"},
                                  "firm": {t: n for n, t in TICKERS.items()}}, tmp_path,
                         reference={"path": str(tmp_path / "wdbc.csv"),
                                    "columns": {"label": "target", "mean_radius": "mean radius",
                                                "mean_texture": "mean texture"},
                                    "values": {"label": {0: "malignant", 1: "benign"}}},
                         quality={})
    raw["services"][0]["sources"]["labels"] = {"kind": "files", "path": str(tmp_path / "labels"),
                                               "values": {"label": {"M": "malignant", "B": "benign"}}}
    cfg = config_mod.parse(raw)
    svc = cfg.services[0]

    [batch] = open_source("wdbc/labels", svc.sources.labels, cfg.limits).read({})
    ok, bad = check_batch(batch, RecordKind.labels, svc.schema_, cfg.limits, NOW, svc.sources.labels)
    ok["_source"] = "labels.jsonl"
    labels = label_batch(ok, svc)
    assert bad == [] and labels.rejects == []
    assert [r["label"] for r in labels.rows] == ["malignant" if d == "M" else "benign" for d in diagnosis]

    frame = read_reference(svc.reference)
    assert {"label", "mean_radius", "mean_texture"} <= set(frame.columns) and "target" not in frame
    assert frame["label"].value_counts().to_dict() == {"benign": int(CANCER["target"].sum()),
                                                       "malignant": int((CANCER["target"] == 0).sum())}
    profile = profile_for(svc.reference, svc.schema_)
    assert profile.fields["mean_radius"].missing == 0
    assert profile.fields["mean_radius"].max == pytest.approx(CANCER["mean radius"].max())
    # The logs' tickers, mapped, are the reference's firms: none unseen.
    accepted, _ = accepted_rows(cfg)
    assert set(accepted["firm"].astype(str)) <= set(profile.fields["firm"].categories)


def test_stage_names_of_otlp_spans_map(tmp_path):
    """Spans named by their HTTP route (as OpenTelemetry's instrumentations name them) are stages."""
    (tmp_path / "spans").mkdir()
    spans = [{"traceId": f"{i:032x}", "spanId": f"{i:016x}", "name": name,
              "startTimeUnixNano": str(1_796_300_000_000_000_000 + i * 10**9),
              "endTimeUnixNano": str(1_796_300_000_000_000_000 + i * 10**9 + ms * 10**6),
              "attributes": [{"key": "request_id", "value": {"stringValue": f"req-{i}"}}]}
             for i, (name, ms) in enumerate([("POST /v1/predict", 12), ("tokenize", 2), ("POST /v1/predict", 9)])]
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}
    (tmp_path / "spans" / "traces.json").write_text(json.dumps(doc) + "\n")
    rows = prediction_rows(["stop"])
    raw = service_config(write_source("jsonl", rows, tmp_path), {"status": {"stop": "ok"}}, tmp_path)
    raw["services"][0]["sources"]["timings"] = {"kind": "files", "path": str(tmp_path / "spans"), "format": "otlp",
                                                "values": {"stage": {"POST /v1/predict": "model",
                                                                     "tokenize": "preprocess"}}}
    cfg = config_mod.parse(raw)
    svc = cfg.services[0]
    [batch] = open_source("wdbc/timings", svc.sources.timings, cfg.limits).read({})
    ok, bad = check_batch(batch, RecordKind.timings, svc.schema_, cfg.limits, NOW, svc.sources.timings)
    assert bad == [] and ok["stage"].astype(str).tolist() == ["model", "preprocess", "model"]


@pytest.mark.parametrize("values, message", [
    ({"status": {"aborted": "canceled"}}, "'aborted' -> 'canceled': not a status; did you mean 'cancelled'?"),
    ({"status": {"finished": "OK"}}, "not a status; did you mean 'ok'?"),
    ({"latency_ms": {"-": None}}, "'latency_ms' is not a field whose values map"),
    ({"stauts": {"finished": "ok"}}, "did you mean 'status'?"),
    ({"prediction": {0: "maligant"}}, "not one of schema.classes ['malignant', 'benign']; did you mean 'malignant'?"),
    ({"status": {1: "ok", "1.0": "error"}}, "name the same value '1'"),
    ({"status": ["finished"]}, "a map of written value -> value meant"),
])
def test_a_values_map_that_could_not_be_read_is_a_config_error(values, message, tmp_path):
    source = write_source("jsonl", prediction_rows(["ok"]), tmp_path)
    with pytest.raises(config_mod.ConfigError) as err:
        config_mod.parse(service_config(source, values, tmp_path))
    assert message in str(err.value)
    assert str(err.value).startswith("services[0]")
