"""A SQL table as a source, read incrementally on a monotonic column with ties, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pandas as pd
import pytest
import sqlalchemy as sa
from tests_support import valid_row

from monitor import config as config_mod
from monitor.daemon.runner import tick

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def logs_db(request, tmp_path):
    """(url, table name) of an empty place for a predictions table."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'logs.db'}", "predictions"
    else:
        url, connect_args = request.getfixturevalue("pg_schema")
        schema = connect_args["options"].split("=", 1)[1]
        yield url, f"{schema}.predictions"


def insert(url: str, table: str, rows: list[dict]) -> None:
    schema, _, name = table.rpartition(".")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        pd.DataFrame(rows).to_sql(name, conn, schema=schema or None, if_exists="append", index=False)
    engine.dispose()


def test_sql_source_reads_each_row_once_across_ties_and_ticks(store, logs_db, tmp_path):
    url, table = logs_db
    # cursor ties: three rows share each `seq` value, and chunks (100 rows) do not divide them evenly.
    rows = [valid_row(i) | {"seq": i // 3} for i in range(1000)]
    insert(url, table, rows[:702])  # a tie group never straddles two inserts: the cursor only grows
    cfg = config_mod.parse({
        "limits": {"chunk_rows": 100},
        "services": [{"name": "churn",
                      "sources": {"predictions": {"kind": "sql", "url": url, "table": table, "cursor_column": "seq"}},
                      "schema": {"features": {"tenure": "numeric", "Contract": "categorical"}}}],
    }, base_dir=tmp_path)
    [first] = tick(cfg, store, NOW)
    assert first.status == "ok", first.error
    assert first.accepted["predictions"] == 702 and first.duplicates == 0
    insert(url, table, rows[702:])
    [second] = tick(cfg, store, NOW)
    assert second.accepted["predictions"] == 298 and second.duplicates == 0
    [third] = tick(cfg, store, NOW)
    assert sum(third.read.values()) == 0


def test_sql_source_password_comes_from_env(tmp_path, monkeypatch):
    monkeypatch.delenv("TW_LOGS_PW", raising=False)
    cfg = config_mod.parse({"services": [{"name": "s", "sources": {"predictions": {
        "kind": "sql", "url": "postgresql+psycopg://reader@127.0.0.1:1/logs", "password": {"env": "TW_LOGS_PW"},
        "table": "predictions", "cursor_column": "id"}}}]}, base_dir=tmp_path)
    with pytest.raises(config_mod.ConfigError, match="TW_LOGS_PW is not set"):
        cfg.services[0].sources.predictions.password.resolve()
    assert os.environ.get("TW_LOGS_PW") is None
