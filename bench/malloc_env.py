"""The glibc malloc settings the deploy files give the daemon (deploy/Dockerfile, deploy/tailwatch.service,
deploy/k8s/, deploy/docker-compose.yml; see docs/operations.md), for bench processes: a bench measures
tailwatch as it is deployed. glibc reads them once, when a process starts."""

from __future__ import annotations

import os
import sys

MALLOC_ENV = {
    "MALLOC_ARENA_MAX": "1",  # one arena: malloc_trim hands every free page of it back
    "MALLOC_MMAP_THRESHOLD_": "33554432",  # bytes (32 MiB): smaller blocks are reused, not mapped afresh
    "MALLOC_TRIM_THRESHOLD_": "131072",  # bytes (128 KiB): a larger free heap top goes back at once
}


def environ() -> dict[str, str]:
    """This process's environment with the deploy files' malloc settings; settings already there win."""
    return {**MALLOC_ENV, **os.environ}


def reexec() -> None:
    """Start this script again with the settings when it started without them (set later, glibc ignores them)."""
    if any(name not in os.environ for name in MALLOC_ENV):
        os.execve(sys.executable, [sys.executable, *sys.argv], environ())
