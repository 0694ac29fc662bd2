"""`query sql`: reads run; INSERT, UPDATE, DELETE, DROP and multi-statement strings are refused by the
database connection itself (not only by the first-word check), and the store is unchanged."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import func, select

from monitor.investigate import query as q
from monitor.investigate import sql
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
    frame = sql.sql(filled, 'SELECT "check", count(*) AS n FROM findings GROUP BY "check" ORDER BY "check"')
    assert list(frame.columns) == ["check", "n"] and "latency" in set(frame["check"])
    assert int(frame["n"].sum()) == len(q.findings(filled, "churn"))
    assert sql.sql(filled, "-- a comment\nSELECT count(*) AS n FROM ticks;")["n"].iloc[0] == 9
    with pytest.raises(q.QueryError, match="more than 5 rows"):
        sql.sql(filled, "SELECT id FROM findings", max_rows=5)


def test_writes_are_refused_and_nothing_changes(filled):
    before = fingerprint(filled)
    for statement in WRITES:
        with pytest.raises(q.QueryError):
            sql.sql(filled, statement)
        assert fingerprint(filled) == before, statement


def test_the_connection_itself_refuses_writes(filled):
    """Past the first-word check: the read-only connection / transaction is what stops each write."""
    sqlite = filled.url.get_backend_name() == "sqlite"
    reader = sql._sqlite_read if sqlite else sql._postgres_read
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


# What the daemon's superuser connection let `query sql` do: kill other connections (the leader lock's
# among them), read and list server files, load a server file into a large object, reload the server's
# configuration. `{victim}` is the pid of a connection of the test's own superuser.
SERVER_CALLS = [
    "SELECT pg_terminate_backend({victim})",
    "SELECT pg_read_file('/etc/passwd')",
    "SELECT pg_ls_dir('.')",
    "SELECT lo_import('/etc/passwd')",
    "SELECT pg_reload_conf()",
]
RUNAWAY = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"


@pytest.fixture
def victim(filled):
    """A connection of the store's own (superuser) role, like the daemon's: (its pid, whether it is alive)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(filled.url)
    conn = engine.connect()
    pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()

    def alive() -> bool:
        try:
            return conn.execute(text("SELECT 1")).scalar() == 1
        except Exception:
            return False

    yield pid, alive
    try:
        conn.close()
    except Exception:  # terminated: what the test is there to catch, reported by the test itself
        pass
    engine.dispose()


@pytest.mark.postgres
@pytest.mark.reliability
@pytest.mark.parametrize("filled", ["postgres"], indirect=True)
def test_server_functions_are_refused_and_selects_run(filled, victim, record_property):
    """As the reader role `db upgrade` made: pg_terminate_backend, pg_read_file, pg_ls_dir, lo_import and
    pg_reload_conf are refused by the server, the other connection lives, and a SELECT runs."""
    pid, alive = victim
    refused = []
    for call in SERVER_CALLS:
        # PostgreSQL 15 words the refusal to signal a superuser's backend "must be a superuser"; later ones
        # "permission denied".
        with pytest.raises(q.QueryError, match="permission denied|must be a superuser") as caught:
            sql.sql(filled, call.format(victim=pid))
        refused.append(f"{call}: {caught.value}")
        assert alive(), call
    print("\n".join(refused))  # what the caller is told, for the record
    frame = sql.sql(filled, 'SELECT "check", count(*) AS n FROM findings GROUP BY "check" ORDER BY "check"')
    assert "latency" in set(frame["check"]) and sql.sql(filled, "SELECT current_user AS u")["u"].iloc[0] == \
        "tailwatch_reader"
    record_property("rel_inputs", len(SERVER_CALLS) + 2)
    record_property("rel_faults", len(refused))


@pytest.fixture
def extra_role(filled):
    """A login role made for one test (SELECT on the tables, like the reader); dropped after it."""
    import secrets as secrets_mod

    from sqlalchemy import create_engine, text

    role = f"tw_test_{secrets_mod.token_hex(4)}"
    engine = create_engine(filled.url)
    with filled.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
        schema = conn.execute(text("SELECT current_schema()")).scalar()
        conn.exec_driver_sql(f'GRANT USAGE ON SCHEMA "{schema}" TO {role}')
        conn.exec_driver_sql(f"GRANT SELECT ON ALL TABLES IN SCHEMA \"{schema}\" TO {role}")
    yield role
    with filled.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP OWNED BY {role}")
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP OWNED BY {role}")
        conn.exec_driver_sql(f"DROP ROLE {role}")
    engine.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("filled", ["postgres"], indirect=True)
@pytest.mark.parametrize("grant,why", [
    (None, "it is a superuser"),
    ("GRANT EXECUTE ON FUNCTION pg_read_file(text) TO {role}", "it can execute server functions: pg_read_file(text)"),
    ("GRANT pg_signal_backend TO {role}", "it is a member of pg_signal_backend"),
    ("GRANT pg_read_server_files TO {role}", "it is a member of pg_read_server_files"),
    ("GRANT INSERT ON findings TO {role}", "it can change tailwatch's tables: findings"),
])
def test_a_role_that_can_do_more_than_read_is_refused(filled, extra_role, victim, grant, why):
    """A superuser (the daemon's own role), or a role that may run server functions, signal backends, read
    server files or write a table: refused before the statement runs, saying why."""
    pid, alive = victim
    role = filled.url.username if grant is None else extra_role
    if grant is not None:
        with filled.engine.begin() as conn:
            conn.exec_driver_sql(grant.format(role=role))
    for call in SERVER_CALLS + ["SELECT count(*) FROM findings"]:
        with pytest.raises(q.QueryError, match=f"refused to run as role {role}: .*{re.escape(why)}"):
            sql.sql(filled, call.format(victim=pid), role=role)
        assert alive(), call


@pytest.mark.postgres
@pytest.mark.parametrize("filled", ["postgres"], indirect=True)
def test_a_missing_reader_role_is_a_clear_error(filled):
    with pytest.raises(q.QueryError, match="as tw_nobody_here: .*`tailwatch db upgrade` creates"):
        sql.sql(filled, "SELECT 1", role="tw_nobody_here")


@pytest.mark.reliability
def test_a_runaway_query_stops_at_the_time_limit(filled, monkeypatch, record_property):
    """A recursive CTE without an end: stopped with a clear error at the limit on SQLite (a progress
    handler; the busy timeout bounds only lock waits) and on PostgreSQL (statement_timeout)."""
    import threading

    monkeypatch.setattr(sql, "SQL_TIMEOUT_S", 0.5)
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            sql.sql(filled, RUNAWAY)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(300)  # a guard against hanging the suite, 600 times the limit: not a timing assertion
    assert not worker.is_alive(), "the runaway query was not stopped"
    [error] = outcome
    assert isinstance(error, q.QueryError) and "time limit of 0.5 s" in str(error), error
    assert sql.sql(filled, "SELECT count(*) AS n FROM ticks")["n"].iloc[0] == 9  # the next query runs
    record_property("rel_inputs", 1)
    record_property("rel_faults", 1)
