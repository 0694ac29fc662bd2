"""The channel-neutral message an outbox item holds: the incident as it was when the notification was
decided, and the action (post, update, repeat, resolve). Each notifier renders it when it sends."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

# The incident's columns that are times (stored as RFC 3339 text in the outbox).
TIMES = ("opened_at", "resolved_at", "first_window_start", "last_window_end", "last_notified_at", "updated_at")


def incident_of(payload: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The incident snapshot of an outbox payload, its times as datetimes; None for a payload already
    rendered for Slack (`text` / `blocks`, written by an older tailwatch)."""
    if not payload or "incident" not in payload:
        return None
    incident = dict(payload["incident"])
    for key in TIMES:
        if isinstance(incident.get(key), str):
            incident[key] = datetime.fromisoformat(incident[key])
    return incident


def action_of(payload: Mapping[str, Any]) -> str:
    """What the message says: post, update, repeat or resolve."""
    return str(payload.get("action") or "post")
