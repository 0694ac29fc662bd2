"""`query sql`: one read-only SQL statement over the stored results, as a pandas DataFrame.

Read-only is enforced by the connection (SQLite `mode=ro` with an authorizer; PostgreSQL a reader role
in a READ ONLY transaction), bounded in rows and in time (s).
"""

from __future__ import annotations

import re
import sqlite3
import time
from typing import Any
from urllib.parse import quote

import pandas as pd

from monitor.investigate.query import QueryError
from storage.database import SQL_READER_ROLE, StoreError, table_names
from storage.store import Store

SQL_MAX_ROWS = 10_000
SQL_TIMEOUT_S = 30
SQLITE_PROGRESS_STEPS = 10_000  # SQLite VM instructions between two looks at the clock: well under 1 ms
# First words of the statements `sql` accepts; the read-only connection is what enforces it.
READ_ONLY_VERBS = ("select", "with", "values", "explain", "table", "show")

# The only things a statement may do on SQLite: read tables and call functions (sqlite3 authorizer).
_SQLITE_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                   getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
_LEADING_COMMENTS = re.compile(r"^\s*(?:(?:--[^\n]*\n)|(?:/\*.*?\*/)|\s)*", re.S)


def sql(store: Store, statement: str, *, max_rows: int = SQL_MAX_ROWS, role: str = SQL_READER_ROLE,
        password: str | None = None, timeout: float | None = None) -> pd.DataFrame:
    """Run one read-only SQL statement and return its rows (at most `max_rows`, else QueryError); one
    that runs longer than `timeout` seconds (default SQL_TIMEOUT_S) is stopped (QueryError).

    SQLite: a separate `mode=ro` connection with `PRAGMA query_only`, an authorizer that allows reads
    only, and a progress handler that interrupts the statement at the time limit. PostgreSQL: a new
    connection as `role` (with `password`), refused when that role is a superuser, can run server
    functions or signal other backends, or can write tailwatch's tables; then a `READ ONLY` transaction
    with `statement_timeout`, always rolled back, the statement prepared server-side (which refuses
    several statements in one string). Writes, DDL and multi-statement strings raise QueryError;
    nothing is changed."""
    text = statement.strip()
    body = _LEADING_COMMENTS.sub("", text)
    verb = body.split(None, 1)[0].lower() if body else ""
    if verb not in READ_ONLY_VERBS:
        raise QueryError(f"only read statements run here ({', '.join(READ_ONLY_VERBS).upper()}); "
                         f"got {verb.upper() or 'nothing'}")
    backend = store.url.get_backend_name()
    timeout = SQL_TIMEOUT_S if timeout is None else timeout
    if backend == "sqlite":
        columns, rows = _sqlite_read(store, text, max_rows, timeout)
    elif backend == "postgresql":
        columns, rows = _postgres_read(store, text, max_rows, role, password, timeout)
    else:
        raise QueryError(f"read-only SQL is supported on SQLite and PostgreSQL, not {backend}")
    frame = pd.DataFrame(rows, columns=columns)
    return _sqlite_times(frame) if backend == "sqlite" else frame


# How SQLite holds a stored time: text, UTC without a zone.
_SQLITE_TIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,6})?")


def _sqlite_times(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns whose every value is a stored time (text on SQLite) as UTC times, as PostgreSQL returns them."""
    for i in range(frame.shape[1]):  # by position: a statement may name two columns alike
        values = frame.iloc[:, i].dropna()
        if len(values) and values.map(lambda v: isinstance(v, str) and bool(_SQLITE_TIME.fullmatch(v))).all():
            frame.isetitem(i, pd.to_datetime(frame.iloc[:, i], utc=True, format="ISO8601"))
    return frame


def _stopped(timeout: float) -> QueryError:
    return QueryError(f"stopped at the time limit of {timeout:g} s (storage.query_sql.timeout); "
                      "add a LIMIT, a narrower WHERE or a bound on the recursion")


def _sqlite_read(store: Store, text: str, max_rows: int, timeout: float = SQL_TIMEOUT_S,
                 ) -> tuple[list[str], list[tuple]]:
    database = store.url.database or ""
    if not database or database == ":memory:" or database.startswith("file:"):
        raise QueryError("read-only SQL needs a SQLite database file")
    conn = sqlite3.connect(f"file:{quote(database)}?mode=ro", uri=True, timeout=timeout)
    try:
        conn.execute("PRAGMA query_only = ON")

        def authorize(action: int, *_args: Any) -> int:
            return sqlite3.SQLITE_OK if action in _SQLITE_ALLOWED else sqlite3.SQLITE_DENY

        conn.set_authorizer(authorize)
        deadline = time.monotonic() + timeout
        expired = []

        def progress() -> int:
            # A non-zero return interrupts the running statement (the busy timeout bounds only lock waits).
            if time.monotonic() < deadline:
                return 0
            expired.append(True)
            return 1

        conn.set_progress_handler(progress, SQLITE_PROGRESS_STEPS)
        try:
            cursor = conn.execute(text)
            rows = cursor.fetchmany(max_rows + 1)
        except (sqlite3.Error, sqlite3.Warning) as exc:  # one statement at a time is a Warning before 3.12
            if expired:
                raise _stopped(timeout) from None
            raise QueryError(f"refused or failed: {exc}") from None
        columns = [d[0] for d in cursor.description or ()]
    finally:
        conn.close()
    return columns, _capped(rows, max_rows)


# Roles whose members can read or write server files, run programs or signal other backends (kill the
# daemon's connections); a role that is a member of a superuser or of another login role can signal its
# backends too.
_POWER_ROLES = ["pg_signal_backend", "pg_read_server_files", "pg_write_server_files", "pg_execute_server_program"]
# What the connected role may do beyond reading: a superuser or CREATEROLE; roles it is a member of; the
# functions it may execute whose ACL denies PUBLIC (pg_read_file, pg_ls_dir, lo_import, pg_reload_conf, ...:
# server functions), and the tailwatch tables it may change.
_PRIVILEGES = """
SELECT r.rolsuper, r.rolcreaterole,
  ARRAY(SELECT g.rolname::text FROM pg_roles g WHERE g.oid <> r.oid AND pg_has_role(r.oid, g.oid, 'MEMBER')
        AND (g.rolsuper OR g.rolcanlogin OR g.rolname = ANY(%(roles)s)) ORDER BY g.rolname),
  ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p
        WHERE p.proacl IS NOT NULL AND has_function_privilege(r.oid, p.oid, 'EXECUTE')
          AND NOT EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')
        ORDER BY 1),
  ARRAY(SELECT t FROM unnest(%(tables)s::text[]) t WHERE to_regclass(t) IS NOT NULL
          AND has_table_privilege(r.oid, to_regclass(t), 'INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER'))
FROM pg_roles r WHERE r.rolname = current_user
"""


def _refuse_privileged(raw: Any, role: str) -> None:
    """QueryError naming what `role` may do beyond SELECT on tailwatch's tables; nothing when it may not."""
    with raw.cursor() as cursor:
        cursor.execute(_PRIVILEGES, {"roles": _POWER_ROLES, "tables": table_names()})
        superuser, createrole, member_of, functions, writable = cursor.fetchone()
    why = []
    if superuser:
        why.append("it is a superuser")
    if createrole:
        why.append("it may create roles")
    if member_of:
        why.append(f"it is a member of {', '.join(member_of)}")
    if functions:
        shown = ", ".join(functions[:6]) + (f" and {len(functions) - 6} more" if len(functions) > 6 else "")
        why.append(f"it can execute server functions: {shown}")
    if writable:
        why.append(f"it can change tailwatch's tables: {', '.join(writable[:6])}")
    if why:
        raise QueryError(f"refused to run as role {role}: {'; '.join(why)}. `query sql` needs a role with SELECT "
                         "on tailwatch's tables only (storage.query_sql.role; see docs/operations.md)")


def _postgres_read(store: Store, text: str, max_rows: int, role: str = SQL_READER_ROLE,
                   password: str | None = None, timeout: float = SQL_TIMEOUT_S) -> tuple[list[str], list[tuple]]:
    import psycopg

    error = None
    try:
        with store.reader_connection(role, password) as raw:
            raw.autocommit = True  # the check below opens no transaction; the statement's is explicit
            _refuse_privileged(raw, role)
            try:
                with raw.transaction(force_rollback=True), raw.cursor() as cursor:
                    cursor.execute("SET TRANSACTION READ ONLY")
                    cursor.execute(f"SET LOCAL statement_timeout = {max(int(timeout * 1000), 1)}")
                    # prepare=True: the extended protocol runs exactly one statement ("SELECT 1; COMMIT; ..."
                    # is refused instead of committing out of the read-only transaction).
                    cursor.execute(text, prepare=True)
                    rows = cursor.fetchmany(max_rows + 1) if cursor.description else []
                    columns = [d.name for d in cursor.description or ()]
            except psycopg.errors.QueryCanceled:
                error = _stopped(timeout)
            except psycopg.Error as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                error = QueryError(f"refused or failed: {first}")
    except StoreError as exc:
        raise QueryError(f"{exc}; `query sql` connects as role {role} (storage.query_sql.role), which "
                         "`tailwatch db upgrade` creates (see docs/operations.md)") from None
    if error is not None:
        raise error
    return columns, _capped(rows, max_rows)


def _capped(rows: list[tuple], max_rows: int) -> list[tuple]:
    if len(rows) > max_rows:
        raise QueryError(f"more than {max_rows} rows; add a LIMIT or a narrower WHERE")
    return rows
