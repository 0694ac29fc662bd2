"""Fixtures of the alert tests: the fake Slack server and a Store factory on each backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from alerts_support import TOKEN, FakeSlack


@pytest.fixture
def fake_slack(monkeypatch) -> Iterator[FakeSlack]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TW_SLACK_TOKEN", TOKEN)
    fake = FakeSlack()
    fake.thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def open_store(request, tmp_path):
    """A callable returning a new Store on one migrated database (each call: a fresh Store object, as
    after a restart), on each backend; every Store made is disposed at the end."""
    from storage.store import Store

    made = []
    if request.param == "sqlite":
        args = (f"sqlite:///{tmp_path / 'db' / 'tw.db'}",), {}
    else:
        url, connect_args = request.getfixturevalue("pg_schema")
        args = (url,), {"connect_args": connect_args}

    def make():
        store = Store(*args[0], **args[1])
        made.append(store)
        return store

    make().upgrade()
    yield make
    for store in made:
        store.dispose()


@pytest.fixture
def receivers(monkeypatch) -> Iterator[list]:
    """Two HTTP receivers on 127.0.0.1 (an Alertmanager HA pair, or webhooks), reached without a proxy."""
    from tests_support import Receiver

    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    made = [Receiver(), Receiver()]
    yield made
    for r in made:
        r.close()
