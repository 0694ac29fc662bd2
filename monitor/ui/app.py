"""The web pages as a Starlette app: server-rendered (Jinja2, every value escaped), read-only but for the
silences, which need the configured token. Charts are plotly figures drawn by the bundled plotly.js."""

from __future__ import annotations

import functools
import hmac
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import parse_qs

import pandas as pd
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from monitor.alerts.silence import parse_matcher
from monitor.config import Config, parse_duration
from monitor.config.ui import hosts
from monitor.investigate.query import QueryError
from monitor.memory import release_memory
from monitor.ui import pages, views
from monitor.ui.cache import PageCache
from monitor.ui.guard import Gate, Guesses, Hosts
from storage.store import Store

T = TypeVar("T")

# Scripts and styles from this server only (plotly.js sets inline styles on the elements it draws).
HEADERS = {"Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                      "img-src 'self' data:; frame-ancestors 'none'",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
SILENCE_MAX = timedelta(days=30)  # the longest silence the page creates
FORM_MAX = 16 * 1024  # bytes of a posted form
CACHE_SECONDS = 30.0  # how long a computed incident or service page is reused while no tick ran


def create_app(cfg: Config, store: Store, clock: Callable[[], datetime] = lambda: datetime.now(UTC),
               cache_seconds: float = CACHE_SECONDS, monotonic: Callable[[], float] = time.monotonic) -> Starlette:
    """The pages over `store`; `clock` is the wall clock (pages read each service's last tick as its now);
    the incident and service pages are kept `cache_seconds` while their service ticks no further;
    `monotonic` (seconds) times the window of wrong silence tokens."""
    ui = cfg.ui
    cache = PageCache(cache_seconds, max_bytes=ui.cache_bytes)
    token = ui.silence_token.resolve() if ui.silence_token is not None else None
    heavy = Gate(ui.heavy_requests, "slowest-requests pages")
    # Below the store's connection pool: past it, a page would wait for a connection and fail (HTTP 500).
    reads = Gate(ui.store_requests, "pages reading the store")
    guesses = Guesses(ui.token_guesses, ui.token_window.total_seconds(), monotonic)

    def gated(handler: Callable[[Request], Response]) -> Callable[[Request], Response]:
        @functools.wraps(handler)
        def inner(request: Request) -> Response:
            with reads.wait():
                return handler(request)
        return inner

    def page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = pages.render(name, {"services": [s.name for s in cfg.services], "writable": token is not None,
                                   **context})
        return HTMLResponse(html, status_code=status, headers=HEADERS)

    def run(build: Callable[[], T]) -> T:
        try:
            return build()
        except views.NotFound as exc:
            raise HTTPException(404, str(exc)) from None
        except (QueryError, ValueError) as exc:
            raise HTTPException(400, str(exc)) from None

    @gated
    def incidents(request: Request) -> Response:
        q = request.query_params
        filters = run(lambda: views.Filters(**{k: q.get(k) or None for k in ("service", "version", "verdict",
                                                                              "severity", "status")}))
        rows = run(lambda: views.incident_list(cfg, store, filters, clock()))
        return page("incidents.html", rows=rows, filters=filters, choices=views.CHOICES)

    @gated
    def incident(request: Request) -> Response:
        incident_id = request.path_params["incident_id"]
        context = run(lambda: cache.get(("incident", incident_id, views.data_version(store, cfg, incident_id)),
                                        lambda: views.incident(cfg, store, incident_id, clock())))
        return page("incident.html", **context)

    def slowest(request: Request) -> Response:
        incident_id, stage = request.path_params["incident_id"], request.query_params.get("stage") or None
        with heavy.busy():
            try:
                context = run(lambda: views.requests(cfg, store, incident_id, clock(), stage=stage,
                                                     max_rows=ui.max_rows))
            finally:
                release_memory()  # the chunks read are freed: hand them back, not kept by the allocator
        return page("requests.html", **context)

    @gated
    def overview(request: Request) -> Response:
        q = request.query_params
        since, until = (_time(q.get(k)) for k in ("since", "until"))
        if (since is None) != (until is None):
            raise HTTPException(400, "give both since and until, or neither (the last span)")
        if since is not None and not timedelta(0) < until - since <= ui.max_range:
            raise HTTPException(400, f"a range runs forward and spans at most {_days(ui.max_range)} (ui.max_range); "
                                     f"asked {since:%Y-%m-%d %H:%M} – {until:%Y-%m-%d %H:%M} UTC")
        service, span = request.path_params["service"], q.get("span", "24h")
        context = run(lambda: cache.get(("service", service, span, since, until,
                                         views.data_version(store, cfg, service=service)),
                                        lambda: views.overview(cfg, store, service, clock(), span, since, until)))
        return page("service.html", **context)

    @gated
    def quarantine(request: Request) -> Response:
        return page("quarantine.html",
                    **run(lambda: views.quarantine(cfg, store, request.path_params["service"], clock())))

    @gated
    def silences(request: Request) -> Response:
        return page("silences.html", rows=views.silences(store, clock()), now=clock())

    async def silence_write(request: Request) -> Response:
        body = await request.body()
        if len(body) > FORM_MAX:
            raise HTTPException(413, f"a silence form is at most {FORM_MAX} bytes")
        # The forms are urlencoded: parsed here, so no multipart parser is needed.
        form = {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        given = str(form.get("token", ""))
        client = request.client.host if request.client is not None else ""
        guesses.check(client)
        if token is None or not hmac.compare_digest(given.encode(), token.encode()):
            guesses.failed(client)
            raise HTTPException(403, "silences are read-only here: no token configured, or a wrong one")
        now = clock()
        with store.transaction() as session:
            if "silence_id" in request.path_params:
                store.silences.expire(session, request.path_params["silence_id"], now)
            else:
                texts = [m.strip() for m in str(form.get("matchers", "")).split(",") if m.strip()]
                matchers, length = run(lambda: {"m": [parse_matcher(m) for m in texts],
                                                "d": parse_duration(str(form.get("duration", "1h")))}).values()
                if not matchers or not timedelta(0) < length <= SILENCE_MAX:
                    raise HTTPException(400, f"give matchers (name=value, comma-separated) and a duration up to {SILENCE_MAX.days} d")
                store.silences.add(session, matchers, str(form.get("created_by") or "web"),
                                   str(form.get("comment", "")), now, now + length)
        return RedirectResponse("/silences", status_code=303)

    def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in pages.STATIC:
            raise HTTPException(404, "no such file")
        path, media = pages.STATIC[name]
        return FileResponse(path, media_type=media, headers={"Cache-Control": "max-age=3600"})

    async def error(request: Request, exc: HTTPException) -> Response:
        response = page("error.html", status=exc.status_code, status_code=exc.status_code, detail=exc.detail)
        response.headers.update(exc.headers or {})
        return response

    names = hosts(ui)

    def misdirected(header: str) -> Response:
        # 421: this server does not answer that name. Plain text, nothing of the pages (not even the service
        # names of their menu): a page of another site, rebound to this address, may read this answer.
        return PlainTextResponse(f"421 Misdirected Request: this server answers {', '.join(sorted(names))}, "
                                 f"not {header!r} (ui.allowed_hosts)\n", status_code=421, headers=HEADERS)

    routes = [Route("/", incidents), Route("/incidents/{incident_id:int}", incident),
              Route("/incidents/{incident_id:int}/requests", slowest),
              Route("/services/{service}", overview), Route("/services/{service}/quarantine", quarantine),
              Route("/silences", silences), Route("/silences", silence_write, methods=["POST"]),
              Route("/silences/{silence_id:int}/expire", silence_write, methods=["POST"]),
              Route("/static/{name}", static)]
    app = Starlette(routes=routes, exception_handlers={HTTPException: error})
    app.add_middleware(Hosts, names=names, refuse=misdirected)
    app.state.cache = cache  # what it keeps, for whoever serves it to read
    return app


def _days(span: timedelta) -> str:
    return f"{span.days} days" if span == timedelta(days=span.days) else str(span)


def _time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return pd.Timestamp(value).tz_convert("UTC").to_pydatetime() if pd.Timestamp(value).tzinfo else \
            pd.Timestamp(value).tz_localize("UTC").to_pydatetime()
    except ValueError:
        raise HTTPException(400, f"not a time: {value!r} (use 2026-01-31T12:00Z)") from None
