"""The page cache: one build per key while fresh, concurrent callers wait for it, stale or evicted keys
are built again, errors are not kept, 0 seconds keeps nothing, and the bytes kept stay within a budget."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from monitor.ui.cache import PageCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_one_build_while_fresh_then_again():
    clock, builds = Clock(), []
    cache = PageCache(30, size=2, clock=clock)
    build = lambda: builds.append(1) or len(builds)  # noqa: E731
    assert cache.get("a", build) == 1 and cache.get("a", build) == 1
    clock.now = 29.9
    assert cache.get("a", build) == 1
    clock.now = 30
    assert cache.get("a", build) == 2  # stale
    cache.get("b", build), cache.get("c", build)  # "a" is the least recently used of three: evicted
    assert cache.get("a", build) == 5
    assert PageCache(0).get("x", build) == 6 and PageCache(0).get("x", build) == 7


def test_concurrent_callers_wait_for_the_first_build():
    release, calls = threading.Event(), []

    def build():
        calls.append(1)
        release.wait()
        return "page"

    cache = PageCache(30)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(cache.get, "k", build) for _ in range(8)]
        release.set()
        assert [f.result() for f in futures] == ["page"] * 8
    assert len(calls) == 1


def test_errors_are_not_kept():
    cache = PageCache(30)

    def fail():
        raise LookupError("no incident 7")

    with pytest.raises(LookupError):
        cache.get("k", fail)
    assert cache.get("k", lambda: "built") == "built"


def test_the_bytes_kept_stay_within_the_budget():
    import pickle

    page = {"figure": "x" * 1000}
    one = len(pickle.dumps(page, protocol=pickle.HIGHEST_PROTOCOL))
    cache = PageCache(30, size=64, clock=Clock(), max_bytes=3 * one)
    for k in range(10):
        cache.get(k, lambda: dict(page))
    assert list(cache.entries) == [7, 8, 9] and cache.bytes == 3 * one  # the least recently used went first
    assert cache.get("big", lambda: {"figure": "x" * 10_000})["figure"]  # answered, but larger than the budget:
    assert "big" not in cache.entries and cache.bytes == 3 * one  # not kept, and nothing evicted for it
    with pytest.raises(RuntimeError):
        cache.get("bad", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert not cache.building  # a failed build leaves no lock behind
