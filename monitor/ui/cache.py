"""Page contents computed once while the data under them stays the same: when a Slack message sends the
whole team to one incident page, the first load computes it and the others wait for that answer."""

from __future__ import annotations

import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class PageCache:
    """Up to `size` page contexts by key and `max_bytes` of them (their pickled size; the least recently used
    go first, and one larger than the whole budget is not kept), each reused for `seconds` (0: never kept).
    Callers put in the key what says the data changed (the service's last tick); `seconds` bounds what a
    key cannot see (the alert stage after a tick, the nightly quality job)."""

    def __init__(self, seconds: float, size: int = 64, clock: Callable[[], float] = time.monotonic,
                 max_bytes: int = 64 << 20) -> None:
        self.seconds, self.size, self.clock, self.max_bytes = seconds, size, clock, max_bytes
        self.entries: OrderedDict[Hashable, tuple[float, Any, int]] = OrderedDict()
        self.bytes = 0
        self.building: dict[Hashable, threading.Lock] = {}
        self.lock = threading.Lock()

    def _fresh(self, key: Hashable) -> tuple[bool, Any]:
        entry = self.entries.get(key)
        if entry is not None and self.clock() - entry[0] < self.seconds:
            self.entries.move_to_end(key)
            return True, entry[1]
        return False, None

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The value kept for `key`, or `build()`'s (one build at a time per key; errors are not kept)."""
        if self.seconds <= 0:
            return build()
        with self.lock:
            found, value = self._fresh(key)
            if found:
                return value
            building = self.building.setdefault(key, threading.Lock())
        with building:
            with self.lock:
                found, value = self._fresh(key)
            if found:
                return value
            try:
                started = self.clock()
                value = build()
                size = _size(value)
                with self.lock:
                    old = self.entries.pop(key, None)
                    self.bytes -= old[2] if old is not None else 0
                    if size <= self.max_bytes:
                        self.entries[key] = (started, value, size)
                        self.bytes += size
                    while len(self.entries) > self.size or self.bytes > self.max_bytes:
                        self.bytes -= self.entries.popitem(last=False)[1][2]
            finally:
                with self.lock:
                    self.building.pop(key, None)
        return value


def _size(value: Any) -> int:
    """A page context's size in bytes (pickled); one that cannot be pickled counts as too large to keep."""
    try:
        return len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except (pickle.PicklingError, TypeError, AttributeError):
        return 1 << 62
