"""Database URLs: parsed the one way the store and the config both read them."""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url


def parse_url(value: str) -> URL:
    """`value` as a database URL (SQLAlchemy's form: dialect+driver://user:password@host/database);
    raises when it is not one, with a message that may quote `value`."""
    return make_url(value)
