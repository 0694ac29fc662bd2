"""glibc malloc settings for a long-lived process that handles large frames tick after tick.

glibc raises its mmap threshold each time a large mmapped block is freed (up to 32 MiB) and its trim
threshold with it (twice that). After a few ticks, numpy and pandas columns of several MiB come from the
per-thread arenas instead of their own mappings, and a thread arena keeps its free top resident:
malloc_trim releases free chunks in the bins and the main heap's top, never a thread arena's top. On
bench/load.py the thread arenas' resident memory crept from 58 to 132 MiB in 8 ticks with 54 MiB of malloc
memory in use in all; with fixed thresholds it stays under 10 MiB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

import pyarrow as pa

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 20  # bytes: blocks this large get their own mapping, unmapped when freed
TRIM_THRESHOLD = 128 << 10  # bytes: glibc's default; a free top larger than this goes back to the system
ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")  # set by an operator: theirs wins

_tuned = False


def tune_malloc() -> bool:
    """Fix glibc's mmap and trim thresholds (which also stops glibc raising them), once per process.
    False when the C library is not glibc or an operator set the thresholds in the environment."""
    global _tuned
    if _tuned:
        return True
    if any(name in os.environ for name in ENV) or "malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    libc = _glibc()
    if libc is None:
        return False
    mmap_set = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)  # 1 on success
    trim_set = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    _tuned = bool(mmap_set and trim_set)
    return _tuned


def release_memory() -> None:
    """Hand the memory a tick or a scan freed back to the system: Arrow's pool and glibc's heap keep
    freed pages otherwise, and a daemon's resident size would creep up tick after tick."""
    tune_malloc()  # once per process; before the next tick, if the entry point did not call it at start
    pa.default_memory_pool().release_unused()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)  # free chunks in glibc's bins and the main heap's top: numpy and CPython use them


@functools.cache  # find_library runs ldconfig: once per process, not once per tick
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018  (musl has mallopt as a stub that does nothing)
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    return libc
