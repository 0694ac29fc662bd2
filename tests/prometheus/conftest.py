"""Fixtures of the Prometheus tests: a store filled by a simulated scenario (promscenario.py)."""

from __future__ import annotations

import pytest
from promscenario import fill


@pytest.fixture(scope="module")
def filled_run(tmp_path_factory) -> dict:
    """The scenario's config, the clock its metrics are read at, and its root folder."""
    root = tmp_path_factory.mktemp("prometheus-scenario")
    cfg, now = fill(root)
    return {"root": root, "config": cfg, "now": now}
