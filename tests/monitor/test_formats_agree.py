"""The same rows stored the same whichever file format they came in: Parquet text is read as
dictionaries (categories) and JSON Lines text as Arrow strings, and the partials must not tell."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np
import pandas as pd
from tests_support import valid_row

from monitor import config as config_mod
from monitor.daemon.runner import tick
from storage.store import Store

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
ROWS = 3000


def rows() -> list[dict]:
    rng = np.random.default_rng(7)
    out = []
    for i in range(ROWS):
        row = valid_row(i)
        row["Contract"] = ["Month-to-month", "One year", "Two year", "Three year", None][i % 5]  # unseen, missing
        row["notes"] = [None, "", "call back soon", "zorblax frobnicate"][i % 4]  # missing, empty, out of vocabulary
        row["replica"] = f"pod-{i % 3}"
        row["cache_hit"] = bool(i % 2)
        row["prediction"] = ["No", "Yes"][i % 2]
        row["score_Yes"] = float(rng.random())
        row["model_version"] = ["v1", "v2"][i % 7 == 0]
        out.append(row)
    return out


def config(tmp_path, fmt: str, reference) -> config_mod.Config:
    return config_mod.parse({
        "storage": {"url": f"sqlite:///{tmp_path / fmt}.db"},
        "services": [{
            "name": "churn",
            "sources": {"predictions": {"kind": "files", "path": str(tmp_path / fmt)}},
            "schema": {"features": {"tenure": "numeric", "Contract": "categorical", "notes": "text"},
                       "segments": ["Contract"], "classes": ["No", "Yes"], "positive_class": "Yes"},
            "reference": {"path": str(reference)},
        }],
    })


def stored(cfg: config_mod.Config) -> list[tuple]:
    store = Store(cfg.storage.url)
    store.upgrade()
    try:
        [report] = tick(cfg, store, NOW)
        assert report.status == "ok", report.error
        assert report.folded == ROWS
        with store.transaction() as s:
            found = store.partials.load(s, "churn", datetime(1970, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC))
            return sorted((r.model_version, r.bucket_start, r.segment, r.rows, r.payload) for r in found)
    finally:
        store.dispose()


def test_parquet_and_jsonl_rows_fold_into_the_same_partials(tmp_path):
    data = rows()
    reference = tmp_path / "reference.csv"
    pd.DataFrame([{"tenure": r["tenure"], "Contract": ["Month-to-month", "One year", "Two year"][i % 3],
                   "notes": "call back please", "prediction": r["prediction"], "score_Yes": r["score_Yes"]}
                  for i, r in enumerate(data)]).to_csv(reference, index=False)
    (tmp_path / "jsonl").mkdir()
    (tmp_path / "jsonl" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    (tmp_path / "parquet").mkdir()
    frame = pd.DataFrame(data)
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True, format="ISO8601")
    frame.to_parquet(tmp_path / "parquet" / "a.parquet", index=False)

    from_jsonl = stored(config(tmp_path, "jsonl", reference))
    from_parquet = stored(config(tmp_path, "parquet", reference))
    assert len(from_jsonl) > 20  # buckets x versions x segments
    assert {p[2] for p in from_jsonl} >= {"Contract=Three year", "Contract=<missing>"}
    assert from_parquet == from_jsonl


def test_parquet_text_read_as_dictionary_is_still_checked_for_size_and_type(tmp_path):
    from collections import Counter

    (tmp_path / "parquet").mkdir()
    data = [valid_row(i) for i in range(50)]
    data[3]["notes"] = "x" * 70_000  # over limits.max_field_chars
    data[7]["status"] = "sideways"  # a status no dictionary makes known
    frame = pd.DataFrame(data)
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True, format="ISO8601").astype(str)  # times as text
    frame.to_parquet(tmp_path / "parquet" / "a.parquet", index=False)
    cfg = config_mod.parse({
        "storage": {"url": f"sqlite:///{tmp_path / 'q'}.db"},
        "services": [{"name": "churn", "sources": {"predictions": {"kind": "files", "path": str(tmp_path / "parquet")}},
                      "schema": {"features": {"tenure": "numeric", "Contract": "categorical", "notes": "text"},
                                 "segments": ["Contract"]}}],
    })
    store = Store(cfg.storage.url)
    store.upgrade()
    try:
        [report] = tick(cfg, store, NOW)
    finally:
        store.dispose()
    assert report.status == "ok", report.error
    assert report.quarantined == Counter({"oversize_field": 1, "unknown_status": 1})
    assert report.folded == 48


def test_csv_with_a_quoted_header_folds_as_jsonl_does(tmp_path):
    """CSV as pyarrow and pandas write it with quoting on: every name and value in double quotes (the
    header included), which a reader splitting the header at commas would take for names no row holds."""
    import csv

    import pyarrow as pa
    import pyarrow.csv as pacsv

    data = [{**r, "notes": r["notes"] or None} for r in rows()]  # CSV cannot tell "" from missing
    reference = tmp_path / "reference.csv"
    pd.DataFrame([{"tenure": r["tenure"], "Contract": "One year", "notes": "call back", "prediction": r["prediction"],
                   "score_Yes": r["score_Yes"]} for r in data]).to_csv(reference, index=False)
    (tmp_path / "jsonl").mkdir()
    (tmp_path / "jsonl" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    frame = pd.DataFrame(data)
    frame["cache_hit"] = frame["cache_hit"].map({True: "true", False: "false"})
    (tmp_path / "arrow").mkdir()
    pacsv.write_csv(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / "arrow" / "a.csv")
    assert (tmp_path / "arrow" / "a.csv").read_text().startswith('"')  # pyarrow quotes the header's names
    (tmp_path / "pandas").mkdir()
    frame.to_csv(tmp_path / "pandas" / "a.csv", index=False, quoting=csv.QUOTE_ALL)

    from_jsonl = stored(config(tmp_path, "jsonl", reference))
    assert stored(config(tmp_path, "arrow", reference)) == from_jsonl
    assert stored(config(tmp_path, "pandas", reference)) == from_jsonl
