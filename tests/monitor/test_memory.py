"""glibc malloc thresholds: set once per process, left to the operator when the environment sets them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from monitor import memory

PROBE = "from monitor.memory import tune_malloc; print(tune_malloc(), tune_malloc())"


def _run(env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                          env={"PATH": "/usr/bin:/bin", **env}).stdout.strip()


@pytest.mark.skipif(memory._glibc() is None, reason="the C library here is not glibc")
def test_thresholds_are_set_once_unless_the_operator_set_them():
    assert _run({}) == "True True"  # a fresh process: set, then already set
    assert _run({"MALLOC_TRIM_THRESHOLD_": "131072"}) == "False False"
    assert _run({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}) == "False False"
