"""glibc malloc settings: every way of running tailwatch (deploy files, Makefile, benches) gives the
process the same ones, and the release of freed memory after a tick works wherever it runs."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import yaml

from monitor.memory import release_memory

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NAMES = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_ASSIGN = re.compile(r"\b(MALLOC_[A-Z_]+)=(\S+)")


def _malloc(env: dict) -> dict[str, str]:
    return {k: str(v) for k, v in env.items() if k.startswith("MALLOC_")}


def _k8s_env(container: dict) -> dict[str, str]:
    return _malloc({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})


def settings() -> dict[str, dict[str, str]]:
    """Where each setting is written -> the malloc settings it gives."""
    found: dict[str, dict[str, str]] = {}
    runtime = (DEPLOY / "Dockerfile").read_text().split("AS runtime", 1)[1]
    found["Dockerfile"] = dict(_ASSIGN.findall(runtime))
    unit = [line for line in (DEPLOY / "tailwatch.service").read_text().splitlines() if line.startswith("Environment=")]
    found["tailwatch.service"] = dict(_ASSIGN.findall("\n".join(unit)))
    deployment = yaml.safe_load((DEPLOY / "k8s" / "deployment.yaml").read_text())
    (main,) = deployment["spec"]["template"]["spec"]["containers"]
    found["k8s deployment"] = _k8s_env(main)
    cronjob = yaml.safe_load((DEPLOY / "k8s" / "cronjob.yaml").read_text())
    (nightly,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    found["k8s cronjob"] = _k8s_env(nightly)
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    found["docker-compose"] = _malloc(compose["services"]["tailwatch"]["environment"])
    found["Makefile"] = dict(re.findall(r"^export (MALLOC_[A-Z_]+) := (\S+)$", (ROOT / "Makefile").read_text(), re.M))
    spec = importlib.util.spec_from_file_location("malloc_env", ROOT / "bench" / "malloc_env.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    found["bench/malloc_env.py"] = dict(bench.MALLOC_ENV)
    return found


def test_every_way_of_running_carries_the_same_malloc_settings():
    found = settings()
    expected = found["Dockerfile"]
    assert sorted(expected) == sorted(NAMES)
    # One arena; blocks under 32 MiB reused from the heap; a free heap top over 128 KiB handed back.
    assert expected == {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                        "MALLOC_TRIM_THRESHOLD_": str(128 << 10)}
    assert {where: env for where, env in found.items() if env != expected} == {}


def test_a_process_starts_with_the_settings_and_releases_freed_memory():
    env = settings()["Dockerfile"]
    code = ("import os; from monitor.memory import release_memory; release_memory(); "
            f"print(','.join(os.environ[n] for n in {NAMES!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env})
    assert out.stdout.strip() == ",".join(env[n] for n in NAMES)
    release_memory()  # and in this process, however it was started
