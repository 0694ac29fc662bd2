"""What keeps one client's GETs from taking the pages down: the Host header checked against the configured
names, gates on the pages reading the store or the raw logs, and a limit on wrong silence tokens."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

CLIENTS_MAX = 10_000  # clients whose wrong tokens are remembered at once (the oldest forgotten first)


def host_of(header: str) -> str:
    """The name of a Host header, lower case, without its port or an IPv6 address's brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    name = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    return name.rstrip(".")


class Hosts:
    """ASGI middleware: a request whose Host header is not one of `names` is answered by `refuse()` (421),
    before any page reads anything."""

    def __init__(self, app: ASGIApp, names: set[str], refuse: Callable[[str], ASGIApp]) -> None:
        self.app, self.names, self.refuse = app, names, refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = dict(scope.get("headers") or ()).get(b"host", b"").decode("latin-1")
            if host_of(header) not in self.names:
                await self.refuse(header)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Gate:
    """At most `slots` requests inside at once. `busy`: past that, the request is answered 429 with
    Retry-After at once; `wait`: it waits its turn, behind at most `queue` others (past that, 429)."""

    def __init__(self, slots: int, what: str, retry_after: int = 5, queue: int = 64) -> None:
        self.slots, self.what, self.retry_after, self.queue = slots, what, retry_after, queue
        self.semaphore = threading.BoundedSemaphore(slots)
        self.waiting = 0
        self.lock = threading.Lock()

    def _refuse(self) -> HTTPException:
        return HTTPException(429, f"{self.slots} {self.what} are being served at once, the most this server "
                                  f"serves; try again in {self.retry_after} s",
                             headers={"Retry-After": str(self.retry_after)})

    @contextmanager
    def busy(self) -> Iterator[None]:
        if not self.semaphore.acquire(blocking=False):
            raise self._refuse()
        try:
            yield
        finally:
            self.semaphore.release()

    @contextmanager
    def wait(self) -> Iterator[None]:
        with self.lock:
            if self.waiting >= self.queue:
                raise self._refuse()
            self.waiting += 1
        try:
            # No deadline: the pages ahead each read a bounded range, and a client gives up on its own.
            self.semaphore.acquire()
        finally:
            with self.lock:
                self.waiting -= 1
        try:
            yield
        finally:
            self.semaphore.release()


class Guesses:
    """Wrong tokens per client: `allowed` of them in any `window` seconds of `clock` (monotonic seconds);
    past that, the client is refused until its oldest wrong token leaves the window."""

    def __init__(self, allowed: int, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.allowed, self.window, self.clock = allowed, window, clock
        self.wrong: dict[str, deque[float]] = {}
        self.lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self.wrong.get(client, deque())
        while times and now - times[0] >= self.window:
            times.popleft()
        return times

    def check(self, client: str) -> None:
        """HTTPException 429 (Retry-After: the seconds until one more guess is allowed) when `client` gave
        `allowed` wrong tokens within the window."""
        now = self.clock()
        with self.lock:
            times = self._recent(client, now)
            if len(times) >= self.allowed:
                wait = max(int(self.window - (now - times[0])) + 1, 1)
                raise HTTPException(429, f"{self.allowed} wrong tokens within {int(self.window)} s; try again "
                                         f"in {wait} s", headers={"Retry-After": str(wait)})

    def failed(self, client: str) -> None:
        """One more wrong token from `client`."""
        now = self.clock()
        with self.lock:
            times = self._recent(client, now)
            times.append(now)
            self.wrong.pop(client, None)
            self.wrong[client] = times  # the most recent client last: the oldest are forgotten first
            while len(self.wrong) > CLIENTS_MAX:
                self.wrong.pop(next(iter(self.wrong)))
