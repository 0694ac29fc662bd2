"""The leader's store: every transaction of the process holding the leader lock (`storage.lock`) first
proves the lock is still held."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from storage.database import Session
from storage.lock import Lock
from storage.store import Store


class Fenced:
    """The Store as the leader uses it: every transaction first proves the lock is still held (a fence), so
    a leader that lost its lock mid-tick cannot commit after a new leader started."""

    def __init__(self, store: Store, lock: Lock) -> None:
        self._store, self._lock = store, lock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @contextmanager
    def transaction(self, durable: bool = True) -> Iterator[Session]:
        with self._store.transaction(durable) as session:
            self._lock.fence(session)
            yield session
