"""Hostile config files: a YAML "billion laughs", a config of 100 MB, `/dev/zero` as the config path. Each
is refused fast with a one-line error naming the file and why, never a traceback, in a child process under
an address-space cap (`resource.setrlimit`) and a subprocess timeout.

Each test records what it tried as pytest user properties (`rel_inputs`, `rel_rows`, `rel_rows_lost`),
which `make reliability` sums into its summary table.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]
CAP = 1536 << 20  # the child's address space
TIMEOUT = 60  # seconds: a refusal takes well under one; a loader that expands or reads on takes far longer


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def one_refused(record_property) -> None:
    """The reliability table's row of one hostile config refused: one input, no row read or lost."""
    record_property("rel_inputs", 1)
    record_property("rel_rows", 0)
    record_property("rel_rows_lost", 0)


def refused(config: str, tmp: Path) -> tuple[str, float]:
    """Run `tailwatch --config <config> check-logs` capped; returns its error output and its seconds, after
    asserting it failed cleanly: a non-zero exit, no traceback, within TIMEOUT."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "TAILWATCH_CONFIG": "", "COLUMNS": "400"}
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "monitor.cli", "--config", config, "check-logs"],
                              capture_output=True, text=True, timeout=TIMEOUT, preexec_fn=_cap, env=env, cwd=tmp)
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading {config} did not end within {TIMEOUT} s")
    took = time.monotonic() - start
    output = done.stdout + done.stderr
    assert done.returncode not in (0, -9), output[-2000:]
    assert "Traceback" not in output and "MemoryError" not in output, output[-2000:]
    return " ".join(output.split()), took


def billion_laughs() -> str:
    """Nine levels of nine aliases each: 9**9 (387 million) strings once expanded, from under a kilobyte."""
    text = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    prev = "a"
    for name in "bcdefghi":
        text += f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]\n"
        prev = name
    return text + f"services: [*{prev}]\n"


def test_a_billion_laughs_config(tmp_path, record_property):
    path = tmp_path / "laughs.yaml"
    path.write_text(billion_laughs())
    output, _ = refused(str(path), tmp_path)
    assert "laughs.yaml: not valid YAML" in output and "aliases are expanded" in output
    one_refused(record_property)


def test_many_aliases_are_refused(tmp_path, record_property):
    """Aliases that expand to little but are many (a wide fan of one anchor) stop at the alias limit."""
    path = tmp_path / "fan.yaml"
    path.write_text("x: &x 1\nys: [" + ", ".join(["*x"] * 5000) + "]\n")
    output, _ = refused(str(path), tmp_path)
    assert "more than 1,000 aliases" in output
    one_refused(record_property)


def test_a_config_of_100_mb(tmp_path, record_property):
    path = tmp_path / "huge.yaml"
    service = "  - name: s{i}\n    sources: {{predictions: {{kind: files, path: logs}}}}\n"
    with open(path, "w") as fh:
        fh.write("services:\n")
        block = "".join(service.format(i=i) for i in range(10_000))
        while fh.tell() < 100 << 20:
            fh.write(block)
    try:
        output, took = refused(str(path), tmp_path)
    finally:
        path.unlink()
    assert "huge.yaml is larger than 1,048,576 bytes" in output
    assert took < TIMEOUT / 2
    one_refused(record_property)


def test_dev_zero_as_the_config(tmp_path, record_property):
    output, _ = refused("/dev/zero", tmp_path)
    assert "cannot read config file /dev/zero: not a regular file" in output
    one_refused(record_property)


def test_a_config_nested_too_deep(tmp_path, record_property):
    path = tmp_path / "deep.yaml"
    path.write_text("services: " + "[" * 100_000 + "]" * 100_000 + "\n")
    output, _ = refused(str(path), tmp_path)
    assert "deep.yaml: not valid YAML" in output
    one_refused(record_property)
