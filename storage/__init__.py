"""Persistence: SQLAlchemy models, the store, alembic migrations."""
