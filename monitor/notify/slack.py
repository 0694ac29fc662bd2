"""Slack: Block Kit messages for incidents, routing to channels, and one send through slack_sdk.

Messages hold aggregates only (rates, quantiles, counts, label names), never raw feature values. Slack's
limits are kept: at most 50 blocks, section text at most 3000 characters, header at most 150.

Every string that came from the logs or the config (versions, services, stages, fields, classes, groups,
segments, summaries, commands) is escaped with `esc` before it is placed in a text object, and mrkdwn
objects are sent `verbatim`: only the bold and code markup written here is formatting, and no value can
become a mention (`<!channel>`, `<@U…>`), a link (`<https://…|text>`) or an auto-linked channel name.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from http.client import HTTPException
from typing import Any
from urllib.error import URLError

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler, ServerErrorRetryHandler
from slack_sdk.webhook import WebhookClient

log = logging.getLogger(__name__)

MAX_BLOCKS = 50
MAX_SECTION = 3000
MAX_HEADER = 150
MAX_FIELD = 2000
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
EMOJI = {"page": ":red_circle:", "warn": ":large_orange_circle:", "info": ":large_blue_circle:"}


def route(settings, labels: Mapping[str, str]) -> str:
    """The channel for a group with `labels` (severity included): the first matching route, else the
    default channel ('' without Slack settings)."""
    if settings is None:
        return ""
    for r in settings.routes:
        if all(str(labels.get(k, "")) == v for k, v in r.match.items()):
            return r.channel
    return settings.channel or ""


def esc(value: Any) -> str:
    """`value` as text Slack shows literally: its control characters &, < and > as HTML entities (the
    only escaping Slack decodes, in mrkdwn and plain_text alike)."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else esc(value)


def _labels(labels: Mapping[str, Any]) -> str:
    return " ".join(f"{esc(k)}={esc(v)}" for k, v in sorted(labels.items(), key=lambda kv: str(kv[0])))


def evidence_line(e: Mapping[str, Any]) -> str:
    """One evidence item (escaped mrkdwn): check, labels, value vs baseline, n and 95% interval."""
    line = f"• `{esc(e['check'])}` {_labels(e.get('labels') or {})}: *{_num(e.get('value'))}*"
    if e.get("baseline") is not None:
        line += f" vs {_num(e['baseline'])}"
    line += f" (n={_num(e.get('n'))}"
    if e.get("interval_low") is not None and e.get("interval_high") is not None:
        line += f", 95% CI {_num(e['interval_low'])}–{_num(e['interval_high'])}"
    if e.get("share") is not None:
        line += f", {e['share']:.0%} of the increase"
    return line + ")"


def _when(value: Any) -> str:
    if value is None:
        return "-"
    ts = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return f"{ts:%Y-%m-%d %H:%M} UTC"


def render(incident: Mapping[str, Any], kind: str, action: str, settings) -> dict[str, Any]:
    """The outbox payload of one notification of `incident` (a dict of its columns, summary included):
    {text, blocks} for post / update, {text} for a thread reply. Every value from the incident or the
    config is escaped (`esc`)."""
    summary = incident.get("summary") or {}
    alerts = summary.get("alerts", [])
    firing = [a for a in alerts if a["state"] == "firing" and not a.get("muted")]
    head = firing[0] if firing else (alerts[0] if alerts else None)
    order = {"ModelRegression": 0, "InputDrift": 1}
    if firing:
        head = min(firing, key=lambda a: order.get(a["labels"].get("alertname"), 2))
    notes = head["annotations"] if head else {}
    resolved = incident.get("status") == "resolved"
    service, version = incident.get("service", ""), incident.get("model_version")
    raw_verdict = str(incident.get("verdict") or "")
    verdict = esc(raw_verdict)
    estimated = " (estimated)" if notes.get("estimated") else ""
    explain = (settings.explain_command if settings is not None else "tailwatch explain {incident} --service {service}")
    explain = esc(explain.format(incident=incident.get("id"), service=service, model_version=version or ""))
    who = esc(service) + (f" model {esc(version)}" if version else "")
    since = incident.get("first_window_start") or incident.get("opened_at")
    # Why it resolved: fixed (healthy against the pre-incident baseline), rolled back, or no traffic.
    resolution = esc(summary.get("resolution") or "")
    if kind == "reply":
        if action == "resolve":
            took = incident["resolved_at"] - since if since and incident.get("resolved_at") else None
            text = f":white_check_mark: Resolved at {_when(incident.get('resolved_at'))}" + (
                f", {str(took).split('.')[0]} after its onset" if took else "") + (
                f" — {resolution}" if resolution else "") + f". Investigate: `{explain}`"
        else:
            text = (f":repeat: Still firing since {_when(since)}: "
                    f"{esc(notes['summary']) if 'summary' in notes else verdict}")
        return {"text": _cut(text, MAX_SECTION)}

    mark = ":white_check_mark: RESOLVED" if resolved else EMOJI.get(summary.get("severity", "warn"), "")
    # Upper-cased before escaping: Slack decodes &lt; but not &LT;.
    title = _cut(f"{mark} {esc(raw_verdict.upper())}{estimated} — {who}".strip(), MAX_HEADER)
    blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": title, "emoji": True}}]
    line = esc(notes.get("summary") or "") or verdict
    blocks.append(_section(f"*{line}*"))
    affected = sorted({_labels({k: v for k, v in (e.get("labels") or {}).items() if k in ("segment", "group", "class")})
                       for e in notes.get("evidence", []) if set(e.get("labels") or {}) & {"segment", "group", "class"}})
    fields = [f"*Severity*\n{esc(summary.get('severity', '-'))}",
              f"*Since*\n{_when(since)}",
              f"*Affects*\n{who}" + (f" — {', '.join(affected[:5])}" if affected else " — all traffic"),
              f"*Window*\n{_when(notes.get('window_start'))} → {_when(notes.get('window_end'))[11:]}"]
    if notes.get("rollback_to"):
        fields.append(f"*Rollback to*\n`{esc(notes['rollback_to'])}` (accepted)")
    if resolved:
        fields.append(f"*Resolved*\n{_when(incident.get('resolved_at'))}" + (f" — {resolution}" if resolution else ""))
    blocks.append({"type": "section", "fields": [_mrkdwn(_cut(f, MAX_FIELD)) for f in fields[:10]]})
    evidence = notes.get("evidence") or []
    if evidence:
        blocks.append(_section("*Evidence*\n" + "\n".join(evidence_line(e) for e in evidence[:8])))
    stages = (notes.get("attribution") or {}).get("stages") or {}
    if stages:
        q = esc(notes["attribution"].get("quantile", "p95"))
        blocks.append(_section(f"*Where the {q} latency increase sits*\n" + "\n".join(
            f"• stage `{esc(s)}`: {share:.0%}" for s, share in sorted(stages.items(), key=lambda kv: -kv[1])[:6])))
    signals = (notes.get("attribution") or {}).get("signals") or []
    if signals:
        blocks.append(_section("*Correlated signals*\n" + "\n".join(
            f"• `{esc(s['check'])}` {_labels(s.get('labels') or {})}: {_num(s.get('value'))} vs {_num(s.get('baseline'))}"
            for s in signals[:6])))
    length = (notes.get("attribution") or {}).get("length")
    if length:
        blocks.append(_section({"inputs": "Inputs got longer; latency per input length held: the service is not "
                                           "slower for the same input.",
                                "service": "Latency rose within input-length buckets: the service got slower.",
                                "unknown": "Input lengths shifted too; no per-length latency to separate them."}
                               [length]))
    changed = notes.get("what_changed") or []
    if changed:
        blocks.append(_section("*What changed*\n" + "\n".join(f"• {esc(c['text'])}" for c in changed[:5])))
    steps = notes.get("next_steps") or []
    if steps:
        blocks.append(_section("*Next steps*\n" + "\n".join(f"{i}. {esc(s)}" for i, s in enumerate(steps[:6], 1))))
    others = [a for a in alerts if a is not head]
    if others:
        blocks.append(_section("*Other alerts in this incident*\n" + "\n".join(
            f"• {esc(a['labels'].get('alertname'))} [{esc(a['state'])}{', ' + esc(a['muted']) if a.get('muted') else ''}]: "
            f"{esc(a['annotations'].get('summary', ''))}" for a in others[:10])))
    blocks.append({"type": "context", "elements": [_mrkdwn(_cut(
        f"Investigate: `{explain}` · incident {esc(incident.get('id'))} rev {esc(incident.get('revision'))}",
        MAX_SECTION))]})
    state = ("RESOLVED" + (f" ({resolution})" if resolution else "") + ": ") if resolved else ""
    text = _cut(f"{state}{verdict}{estimated} — {who}: {line}", MAX_SECTION)
    return {"text": text, "blocks": blocks[:MAX_BLOCKS]}


def _mrkdwn(text: str) -> dict[str, Any]:
    # verbatim: Slack leaves plain text as it is (no auto-linked URLs or channel names, no parsed @mentions).
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": _mrkdwn(_cut(text, MAX_SECTION))}


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
