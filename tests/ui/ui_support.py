"""The web pages served for tests: uvicorn on a free loopback port in a thread, over a config's store."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from monitor import config as config_mod
from storage.store import Store

# A log line's text that would run script if a page wrote it unescaped.
HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A uvicorn server of the app on 127.0.0.1 in a thread; `url` is its base address."""

    def __init__(self, app) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{self.server.config.port}"

    def __enter__(self) -> Served:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the ui server stopped before it started")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join()


@contextmanager
def serving(cfg, token_file: Path | None = None) -> Iterator[tuple[Served, Store]]:
    """The app over `cfg`'s store, served; with `token_file`, silences are writable with its token."""
    from monitor.ui.app import create_app

    if token_file is not None:
        cfg = cfg.model_copy(update={"ui": cfg.ui.model_copy(
            update={"silence_token": config_mod.Secret(file=token_file)})})
    store = Store(cfg.storage.url)
    try:
        with Served(create_app(cfg, store)) as served:
            yield served, store
    finally:
        store.dispose()


