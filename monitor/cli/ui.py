"""`tailwatch ui`: the web pages for the person on call, served over the store (docs/ui.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from monitor.cli.common import err, fail, load_config, open_store


def ui(
    host: Annotated[str | None, typer.Option(help="Address to listen on (default ui.host, 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (default ui.port, 8765).", min=0, max=65535)] = None,
) -> None:
    """Serve the incidents, incident, service, quarantine and silences pages until interrupted. Read-only;
    silences can be created and expired only with ui.silence_token configured."""
    import uvicorn

    from monitor.config import ConfigError
    from monitor.ui.app import create_app

    cfg = load_config()
    store = open_store(cfg)
    try:
        app = create_app(cfg, store)
    except ConfigError as exc:
        fail(str(exc))
    host, port = host or cfg.ui.host, cfg.ui.port if port is None else port
    err.print(f"tailwatch ui on http://{host}:{port}/", highlight=False)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False)
    finally:
        store.dispose()
