"""The `ui:` section: the read-only web pages for the person on call (`tailwatch ui`, docs/ui.md)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from monitor.config.fields import Duration, Secret, http_url
from monitor.schema import StrictModel


class Ui(StrictModel):
    """Where the pages listen (loopback by default), the address people reach them at, and the token that
    allows the one write (creating and expiring silences); no token: silences are read-only."""

    enabled: bool = False  # served by `tailwatch ui`; the flag says the deployment runs it
    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    # The pages' address as people reach them (behind a proxy): incident links in notifications, and the
    # links of a saved report, are built on it.
    external_url: str | None = None
    silence_token: Secret | None = None
    # Names a request's Host header may carry besides the defaults (`hosts`): a page answers no other name,
    # so a page of another site that a DNS name pointed at this address reads nothing (DNS rebinding).
    allowed_hosts: list[str] = []
    max_range: Duration = Field(timedelta(days=31), gt=timedelta(0))  # the longest range an overview shows
    max_rows: int = Field(50_000, gt=0)  # rows the slowest-requests page holds at most (its slowest)
    # Pages that read the raw logs (slowest requests) served at once; more are answered 429 (Retry-After).
    heavy_requests: int = Field(2, gt=0)
    # Pages reading the store at once (below its connection pool); more wait their turn.
    store_requests: int = Field(4, gt=0)
    cache_bytes: int = Field(64 << 20, gt=0)  # what the page cache keeps at most, in bytes of the pages' data
    token_guesses: int = Field(5, gt=0)  # wrong silence tokens a client may give per `token_window`
    token_window: Duration = Field(timedelta(minutes=10), gt=timedelta(0))

    @field_validator("external_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        # Its links go into Slack messages and saved reports: a user or token in it would go with them.
        return None if value is None else http_url(value)


def hosts(ui: Ui) -> set[str]:
    """The names a request's Host header may carry (lower case, no port): `allowed_hosts`, the configured
    host, localhost, 127.0.0.1, ::1 and external_url's host."""
    names = {ui.host, "localhost", "127.0.0.1", "::1", *ui.allowed_hosts}
    if ui.external_url is not None:
        names.add(urlsplit(ui.external_url).hostname or "")
    return {n.lower().strip("[]") for n in names if n}


def page_url(cfg, path: str) -> str | None:
    """The page at `path` (`/incidents/7`) as people reach it, on `<ui.external_url>` of the Config `cfg`;
    None when external_url is not set."""
    base = cfg.ui.external_url
    return None if base is None else f"{base.rstrip('/')}{path}"


def incident_url(cfg, incident: Mapping[str, Any]) -> str | None:
    """The incident page's address as people reach it, `<ui.external_url>/incidents/<id>` of the Config
    `cfg`; None when external_url is not set (what a notification's "View incident" button opens)."""
    return page_url(cfg, f"/incidents/{int(incident['id'])}")
