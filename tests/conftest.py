"""Shared fixtures: a Store on SQLite (tmp file) and on the real PostgreSQL, one schema per test.

PostgreSQL comes from env TAILWATCH_TEST_PG_URL. When it is unreachable the postgres variants are
skipped with the reason, except under CI=true, where they fail: CI must never pass by skipping.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
from hypothesis import settings
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from storage.store import Store

pytest_plugins = ["reliability_summary"]

# rich fixes a console's width from COLUMNS when the console is made (monitor.cli's, at import), so a
# COLUMNS inherited from the caller (a terminal, or pytest-xdist's workers: 80) would wrap every in-process
# command's output at that width. Tests that read wide output set COLUMNS per command instead.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

# No property test has timing as its subject: a busy machine must not fail one for a slow example.
settings.register_profile("tailwatch", deadline=None)
settings.load_profile("tailwatch")

PG_URL = os.environ.get("TAILWATCH_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def pg_unreachable() -> str | None:
    """Why PostgreSQL cannot be used (None when it can); checked once per session."""
    safe = make_url(PG_URL).render_as_string(hide_password=True)
    engine = create_engine(PG_URL, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
    except Exception as exc:
        first_line = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return f"PostgreSQL not reachable at {safe}: {first_line}"
    finally:
        engine.dispose()
    return None


@pytest.fixture
def pg_schema(pg_unreachable: str | None) -> Iterator[tuple[str, dict]]:
    """A fresh, empty PostgreSQL schema: (url, connect_args putting it first on search_path)."""
    if pg_unreachable:
        if os.environ.get("CI") == "true":
            pytest.fail(pg_unreachable)
        pytest.skip(pg_unreachable)
    schema = f"tw_{secrets.token_hex(6)}"
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        # Only the test schema on the path: tables and alembic_version both land there.
        yield PG_URL, {"options": f"-csearch_path={schema}"}
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_store(request: pytest.FixtureRequest, tmp_path) -> Iterator[Store]:
    """A Store on an empty database (no migrations applied), on each backend."""
    if request.param == "sqlite":
        store = Store(f"sqlite:///{tmp_path / 'db' / 'tailwatch.db'}")
    else:
        url, connect_args = request.getfixturevalue("pg_schema")
        store = Store(url, connect_args=connect_args)
    try:
        yield store
    finally:
        store.dispose()


@pytest.fixture
def store(empty_store: Store) -> Store:
    """A Store migrated to head, on each backend."""
    empty_store.upgrade()
    return empty_store
