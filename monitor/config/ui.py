"""The `ui:` section: the read-only web pages for the person on call (`tailwatch ui`, docs/ui.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator

from monitor.config.fields import Secret
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

    @field_validator("external_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"external_url must start with http:// or https://, got {value!r}")
        return value


def page_url(cfg, path: str) -> str | None:
    """The page at `path` (`/incidents/7`) as people reach it, on `<ui.external_url>` of the Config `cfg`;
    None when external_url is not set."""
    base = cfg.ui.external_url
    return None if base is None else f"{base.rstrip('/')}{path}"


def incident_url(cfg, incident: Mapping[str, Any]) -> str | None:
    """The incident page's address as people reach it, `<ui.external_url>/incidents/<id>` of the Config
    `cfg`; None when external_url is not set (what a notification's "View incident" button opens)."""
    return page_url(cfg, f"/incidents/{int(incident['id'])}")
