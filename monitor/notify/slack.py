"""Slack: one send of an outbox payload through slack_sdk (post, update in place, thread reply).

The payloads are Block Kit messages made by `monitor.alerts.render` when the item is sent.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from http.client import HTTPException
from typing import Any
from urllib.error import URLError

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler, ServerErrorRetryHandler
from slack_sdk.webhook import WebhookClient

log = logging.getLogger(__name__)

EVENT_TYPE = "tailwatch_notification"
# Errors that retrying cannot fix: reported once, the item is marked failed.
PERMANENT = frozenset({
    "channel_not_found", "not_in_channel", "is_archived", "channel_is_archived", "invalid_auth", "not_authed",
    "account_inactive", "token_revoked", "token_expired", "no_permission", "missing_scope", "not_allowed_token_type",
    "msg_too_long", "invalid_blocks", "invalid_blocks_format", "invalid_arguments", "no_text", "restricted_action",
    "message_not_found", "cant_update_message", "edit_window_closed", "too_many_attachments", "invalid_metadata_format",
    "team_access_not_granted", "ekm_access_denied", "method_deprecated", "invalid_token", "no_service",
    "invalid_payload", "action_prohibited", "posting_to_general_channel_denied",
})
# -- sending ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SendResult:
    """The outcome of one Slack call: ok with the message ts and channel id, or an error that is
    permanent (do not retry), rate limited (retry after `retry_after` s) or otherwise retryable;
    `ambiguous` when Slack may have acted before the failure (a lost response)."""

    ok: bool
    ts: str | None = None
    channel: str | None = None
    error: str = ""
    permanent: bool = False
    retry_after: float | None = None
    ambiguous: bool = False


def make_client(token: str, base_url: str = "https://slack.com/api/", timeout: float = 10.0) -> WebClient:
    """A WebClient that retries 429 (honouring Retry-After) and 5xx once in-process; further retries are
    the outbox's, so a long outage never blocks a drain."""
    return WebClient(token=token, base_url=base_url, timeout=int(max(timeout, 1)),
                     retry_handlers=[RateLimitErrorRetryHandler(max_retry_count=1),
                                     ServerErrorRetryHandler(max_retry_count=1)])


class SlackSender:
    """Sends outbox payloads with a bot token (post, update in place, thread reply) or, post-only, an
    incoming webhook. Errors never contain the token or the webhook URL."""

    def __init__(self, client: WebClient | None = None, webhook: WebhookClient | None = None,
                 secrets: tuple[str, ...] = ()) -> None:
        self.client, self.webhook, self._secrets = client, webhook, [s for s in secrets if s]

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return " ".join(text.split())[:500]

    def find(self, channel: str, dedup_key: str, thread_ts: str | None) -> str | None:
        """The ts of an already posted message carrying `dedup_key` in its metadata (a previous attempt
        whose response was lost), or None."""
        if self.client is None or not channel:
            return None
        try:
            if thread_ts:
                resp = self.client.conversations_replies(channel=channel, ts=thread_ts, limit=100,
                                                         include_all_metadata=True)
            else:
                resp = self.client.conversations_history(channel=channel, limit=100, include_all_metadata=True)
        except (SlackApiError, SlackRequestError, URLError, HTTPException, OSError) as exc:
            log.warning("cannot look for an earlier post of %s: %s", dedup_key, self.scrub(str(exc)))
            return None
        for msg in resp.get("messages", []):
            meta = msg.get("metadata") or {}
            if meta.get("event_type") == EVENT_TYPE and (meta.get("event_payload") or {}).get("dedup_key") == dedup_key:
                return msg.get("ts")
        return None

    def send(self, kind: str, channel: str, payload: Mapping[str, Any], dedup_key: str,
             thread_ts: str | None, check_first: bool) -> SendResult:
        """Post (kind post), edit the thread's parent in place (update) or reply in its thread (reply)."""
        if self.client is None:
            return self._send_webhook(payload)
        metadata = {"event_type": EVENT_TYPE, "event_payload": {"dedup_key": dedup_key}}
        try:
            if kind in ("post", "reply") and check_first:
                found = self.find(channel, dedup_key, thread_ts if kind == "reply" else None)
                if found:
                    return SendResult(True, found, channel)
            if kind == "update":
                resp = self.client.chat_update(channel=channel, ts=thread_ts, text=payload.get("text", ""),
                                               blocks=payload.get("blocks"))
            else:
                resp = self.client.chat_postMessage(channel=channel, text=payload.get("text", ""),
                                                    blocks=payload.get("blocks"), metadata=metadata,
                                                    thread_ts=thread_ts if kind == "reply" else None)
            return SendResult(True, resp.get("ts"), resp.get("channel") or channel)
        except SlackApiError as exc:
            return self._api_error(exc)
        except (SlackRequestError, URLError, HTTPException, TimeoutError, OSError) as exc:
            # The request may have reached Slack before the connection dropped: check before reposting.
            return SendResult(False, error=self.scrub(f"{type(exc).__name__}: {exc}"), ambiguous=True)

    def _api_error(self, exc: SlackApiError) -> SendResult:
        resp = exc.response
        code = getattr(resp, "status_code", 0)
        error = str((resp.data or {}).get("error", "")) if isinstance(getattr(resp, "data", None), dict) else ""
        headers = {k.lower(): v for k, v in (getattr(resp, "headers", None) or {}).items()}
        retry = headers.get("retry-after")
        retry_after = float(retry[0] if isinstance(retry, list) else retry) if retry else None
        text = self.scrub(f"HTTP {code} {error or 'error'}")
        if code == 429 or error == "ratelimited":
            return SendResult(False, error=text, retry_after=retry_after or 1.0)
        if error in PERMANENT:
            return SendResult(False, error=text, permanent=True)
        return SendResult(False, error=text, ambiguous=code >= 500)

    def _send_webhook(self, payload: Mapping[str, Any]) -> SendResult:
        assert self.webhook is not None
        try:
            resp = self.webhook.send(text=payload.get("text", ""), blocks=payload.get("blocks"))
        except (URLError, HTTPException, TimeoutError, OSError) as exc:
            return SendResult(False, error=self.scrub(f"{type(exc).__name__}: {exc}"), ambiguous=True)
        if resp.status_code == 200:
            return SendResult(True)
        retry = {k.lower(): v for k, v in (resp.headers or {}).items()}.get("retry-after")
        text = self.scrub(f"HTTP {resp.status_code} {resp.body}")
        if resp.status_code == 429:
            return SendResult(False, error=text, retry_after=float(retry[0] if isinstance(retry, list) else retry or 1))
        return SendResult(False, error=text, permanent=400 <= resp.status_code < 500)
