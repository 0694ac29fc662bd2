"""Alembic environment for tailwatch.

Store.upgrade() passes its open connection in config.attributes["connection"], so no URL (and no
password) ever goes through alembic's configuration. Without one, `sqlalchemy.url` is used.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from storage.models import Base

config = context.config
target_metadata = Base.metadata


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


def _run(connection) -> None:
    # Batch mode lets later migrations ALTER tables on SQLite (copy-and-move) with the same script.
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
