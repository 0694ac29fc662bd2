"""`query sql`: reads run; INSERT, UPDATE, DELETE, DROP and multi-statement strings are refused by the
database connection itself (not only by the first-word check), and the store is unchanged."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from monitor import query as q
from storage.models import Base


def fingerprint(store) -> dict:
    """Row count and id sum of every table: what any write would change."""
    out = {}
    with store.transaction() as session:
        for table in Base.metadata.sorted_tables:
            cols = [func.count()]
            if "id" in table.c:
                cols.append(func.coalesce(func.sum(table.c.id), 0))
            out[table.name] = tuple(session.execute(select(*cols).select_from(table)).one())
    return out


WRITES = [
    "INSERT INTO ticks (service, started_at, now, status) VALUES ('x', '2026-01-01', '2026-01-01', 'ok')",
    "UPDATE findings SET value = 0",
    "DELETE FROM findings",
    "DROP TABLE findings",
    "SELECT 1; DELETE FROM findings",
    "SELECT 1; COMMIT; DELETE FROM findings",
    "CREATE TABLE x (a int)",
]


def test_select_runs(filled):
    frame = q.sql(filled, 'SELECT "check", count(*) AS n FROM findings GROUP BY "check" ORDER BY "check"')
    assert list(frame.columns) == ["check", "n"] and "latency" in set(frame["check"])
    assert int(frame["n"].sum()) == len(q.findings(filled, "churn"))
    assert q.sql(filled, "-- a comment\nSELECT count(*) AS n FROM ticks;")["n"].iloc[0] == 9
    with pytest.raises(q.QueryError, match="more than 5 rows"):
        q.sql(filled, "SELECT id FROM findings", max_rows=5)


def test_writes_are_refused_and_nothing_changes(filled):
    before = fingerprint(filled)
    for statement in WRITES:
        with pytest.raises(q.QueryError):
            q.sql(filled, statement)
        assert fingerprint(filled) == before, statement


def test_the_connection_itself_refuses_writes(filled):
    """Past the first-word check: the read-only connection / transaction is what stops each write."""
    sqlite = filled.url.get_backend_name() == "sqlite"
    reader = q._sqlite_read if sqlite else q._postgres_read
    # SQLite has no DELETE inside a CTE; its WITH ... DELETE is the same attempt.
    cte = ("WITH g AS (SELECT 1) DELETE FROM findings" if sqlite
           else "WITH gone AS (DELETE FROM findings RETURNING id) SELECT count(*) FROM gone")
    before = fingerprint(filled)
    for statement in WRITES + [cte]:
        with pytest.raises(q.QueryError, match="refused or failed"):
            reader(filled, statement, 10)
        assert fingerprint(filled) == before, statement
    # The same connection path still reads.
    assert reader(filled, "SELECT count(*) FROM ticks", 10)[1] == [(9,)]
