"""Stores filled by the real pipeline for the web pages (ui_support.scenario_run: simulator scenarios of
three hours, the fault from half-way, ticked every 15 minutes by the daemon's tick job), and the app served
by uvicorn on a free loopback port in a thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ui_support import Served, fair_run, scenario_run, serving

from storage.store import Store


@pytest.fixture(scope="session")
def ui_run(tmp_path_factory) -> dict:
    """`slower-cache` (v2's new cache key: fewer hits, slower requests), with a hostile quarantined line."""
    return scenario_run(tmp_path_factory.mktemp("ui-slower-cache"), "slower-cache", hostile=True)


@pytest.fixture(scope="session")
def drift_run(tmp_path_factory) -> dict:
    """`drift-new-category`: inputs drift from the reference under the same version."""
    return scenario_run(tmp_path_factory.mktemp("ui-drift"), "drift-new-category")


@pytest.fixture(scope="session")
def quality_run(tmp_path_factory) -> dict:
    """`worse-threshold` with labels: v2's shifted threshold drops churn recall; its rules breach."""
    return scenario_run(tmp_path_factory.mktemp("ui-worse-threshold"), "worse-threshold", labels=True)


@pytest.fixture(scope="session")
def fair(tmp_path_factory) -> dict:
    """statsmodels' Fair survey for 3 days, managerial rows broken by a new version for 1.5 of them."""
    return fair_run(tmp_path_factory.mktemp("ui-fair"))


@pytest.fixture(scope="session")
def incident(ui_run) -> dict:
    """The incident `slower-cache` opened for v2, as `query.incidents` gives it."""
    from monitor.investigate import query

    store = Store(ui_run["config"].storage.url)
    try:
        found = query.incidents(store, "churn", model_version="v2")
    finally:
        store.dispose()
    assert len(found), "the scenario opened no incident for v2"
    return found.iloc[0].to_dict()


@pytest.fixture(scope="session")
def incident_id(incident) -> int:
    return int(incident["id"])


@pytest.fixture(scope="module")
def served(ui_run) -> Iterator[Served]:
    """The app over the scenario's store, read-only (no silence token)."""
    with serving(ui_run["config"]) as (server, _):
        yield server
