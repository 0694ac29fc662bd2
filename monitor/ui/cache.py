"""Page contents computed once while the data under them stays the same: when a Slack message sends the
whole team to one incident page, the first load computes it and the others wait for that answer."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class PageCache:
    """Up to `size` page contexts by key, each reused for `seconds` (0: never kept). Callers put in the key
    what says the data changed (the service's last tick); `seconds` bounds what a key cannot see (the alert
    stage after a tick, the nightly quality job)."""

    def __init__(self, seconds: float, size: int = 64, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self.size, self.clock = seconds, size, clock
        self.entries: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
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
            started = self.clock()
            value = build()
            with self.lock:
                self.entries[key] = (started, value)
                self.entries.move_to_end(key)
                while len(self.entries) > self.size:
                    self.entries.popitem(last=False)
                self.building.pop(key, None)
        return value
