"""`tailwatch ui`: the web pages for the person on call, served over the store (docs/ui.md)."""

from __future__ import annotations

import socket
import sys
from typing import Annotated

import typer

from monitor.cli.common import Format, fail, load_config, open_store, out, parse_now, render


def ui(
    host: Annotated[str | None, typer.Option(help="Address to listen on (default ui.host, 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (default ui.port, 8765; 0: a free one, the "
                                              "line printed says which).", min=0, max=65535)] = None,
    now: Annotated[str | None, typer.Option(help="A fixed wall clock for the pages (RFC 3339); default: now.")] = None,
    fmt: Format = "table",
) -> None:
    """Serve the incidents, incident, service, quarantine and silences pages until interrupted. Read-only;
    silences can be created and expired only with ui.silence_token configured (`--format` applies to the
line saying where, printed once the port listens, before serving)."""
    import uvicorn

    from monitor.config import ConfigError
    from monitor.ui.app import create_app

    cfg = load_config()
    if host is not None:  # the name it listens on is one a request's Host header may carry
        cfg = cfg.model_copy(update={"ui": cfg.ui.model_copy(update={"host": host})})
    store = open_store(cfg)
    try:
        app = create_app(cfg, store) if now is None else create_app(cfg, store, clock=lambda at=parse_now(now): at)
    except ConfigError as exc:
        fail(str(exc))
    host, port = host or cfg.ui.host, cfg.ui.port if port is None else port
    # Bound and listening before the line is printed: whoever reads it can connect at once (connections
    # wait in the backlog until the server accepts them), and port 0 is resolved to the one given.
    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        store.dispose()
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    port = sock.getsockname()[1]
    record = {"url": f"http://{host}:{port}/", "services": [svc.name for svc in cfg.services],
              "silences_writable": cfg.ui.silence_token is not None}
    render([record], fmt, lambda: out.print(f"tailwatch ui on {record['url']}", highlight=False, soft_wrap=True),
           document=record)
    sys.stdout.flush()  # the line is read before the server, which runs until interrupted, says anything
    try:
        uvicorn.Server(uvicorn.Config(app, log_level="warning", server_header=False)).run(sockets=[sock])
    finally:
        sock.close()
        store.dispose()
