"""glibc malloc settings for a long-lived process that handles large frames tick after tick.

Two ways glibc keeps or wastes memory here:
- Per-thread arenas. Read-ahead and fold threads allocate numpy and pandas columns of several MiB, which by
  default come from per-thread arenas, and malloc_trim never releases a thread arena's free top. On
  bench/load.py their resident memory crept from 58 to 132 MiB in 8 ticks with 54 MiB in use in all.
  One arena (the main heap) has no such top: malloc_trim releases all of its free pages.
- Fresh mappings. A block over the mmap threshold gets its own mapping, unmapped when freed, so every such
  column is page-faulted in again: with a 1 MiB threshold a 1M-row Parquet tick took 200k page faults and
  0.5 s of system time, with 32 MiB 50k and 0.2 s. Under the threshold, freed columns are reused.
Fixing the thresholds also stops glibc from raising them as it goes. A free heap top over 128 KiB goes back
to the system at once (a higher trim threshold saved no page faults and kept up to itself resident).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 32 << 20  # bytes: blocks this large get their own mapping, unmapped when freed
TRIM_THRESHOLD = 128 << 10  # bytes: glibc's default; a free heap top larger than this goes back to the system
ARENAS = 1
ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")  # set by an operator: theirs wins

_tuned = False


def tune_malloc() -> bool:
    """One malloc arena and fixed mmap and trim thresholds (which also stops glibc raising them), once per
    process. False when the C library is not glibc or an operator set any of them in the environment."""
    global _tuned
    if _tuned:
        return True
    if any(name in os.environ for name in ENV) or "malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    libc = _glibc()
    if libc is None:
        return False
    # 1 on success each. Arenas made before this call stay in use: importing `monitor` calls it.
    _tuned = all([libc.mallopt(M_ARENA_MAX, ARENAS), libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                  libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)])
    return _tuned


def release_memory() -> None:
    """Hand the memory a tick or a scan freed back to the system: Arrow's pool and glibc's heap keep
    freed pages otherwise, and a daemon's resident size would creep up tick after tick."""
    import pyarrow as pa  # here, not at the top: importing `monitor` (which tunes malloc) stays light

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
        libc.gnu_get_libc_version  # noqa: B018  (musl has mallopt as a stub that does nothing)
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    return libc
