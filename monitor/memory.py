"""Handing freed memory back to the system after a tick or a scan.

The process's glibc malloc settings (one arena, fixed mmap and trim thresholds) come from its environment,
set by the deploy files (deploy/, docs/operations.md): glibc reads them when the process starts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import pyarrow as pa


def release_memory() -> None:
    """Hand the memory a tick or a scan freed back to the system: Arrow's pool and glibc's heap keep
    freed pages otherwise, and a daemon's resident size would creep up tick after tick."""
    pa.default_memory_pool().release_unused()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)  # every free page of the heap, its top included: numpy and CPython use them


@functools.cache  # find_library runs ldconfig: once per process, not once per tick
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018  (glibc only: malloc_trim is its extension)
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    return libc
