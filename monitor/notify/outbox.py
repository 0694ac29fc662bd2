"""The outbox sender: send due notifications through their notifier (Slack, Alertmanager), one incident's
Slack messages strictly one after another, retrying with backoff (Slack's Retry-After when it gives one); an
outage of hours delays messages, never loses or duplicates them.

Each item's outcome is committed on its own, right after its call, so a crash repeats at most the one call
in flight; a Slack post or reply whose response was lost is looked up by its dedup key before it is sent
again (Alertmanager deduplicates alerts by their labels itself).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from monitor.alerts.group import ALERT
from monitor.alerts.render import render
from monitor.config import Config, ConfigError, incident_url
from monitor.notify.alertmanager import AlertmanagerSender, enqueue_resends, payload_alerts
from monitor.notify.alertmanager import undeliverable as alertmanager_undeliverable
from monitor.notify.message import action_of, incident_of
from monitor.notify.slack import SendResult, SlackSender, make_client
from storage.database import utc
from storage.store import Store

log = logging.getLogger(__name__)

BACKOFF_FIRST = timedelta(seconds=30)
BACKOFF_MAX = timedelta(minutes=30)
AMBIGUOUS = "ambiguous: "  # last_error prefix: the previous attempt may have reached Slack
UNDELIVERABLE = "undeliverable: "  # last_error prefix of a waiting item: why its notifier could not send it
SLACK_KINDS = ("post", "update", "reply", None)  # None: an item written before kinds were stored


@dataclass
class DrainReport:
    """What one drain did: items sent, deferred for a retry, failed for good, or left waiting."""

    now: str
    sent: int = 0
    retried: int = 0
    failed: int = 0
    waiting: int = 0  # behind an unsent earlier message of the same incident
    errors: list[str] = field(default_factory=list)
    note: str = ""
    undeliverable: str = ""  # why a notifier cannot send (a secret missing or unreadable); '' when it can


def backoff(attempts: int) -> timedelta:
    """Delay before attempt `attempts` + 1: 30 s doubling per attempt, at most 30 min."""
    return min(BACKOFF_FIRST * (2 ** max(attempts - 1, 0)), BACKOFF_MAX)


def undeliverable(config: Config) -> str:
    """Why the configured notifications cannot be delivered now: a Slack or Alertmanager secret is missing,
    unreadable or empty (named by variable or file, never by value). '' when they can, or when no notifier
    is configured."""
    return "; ".join(why for why in (_slack_undeliverable(config), alertmanager_undeliverable(
        config.alerts.alertmanager)) if why)


def _slack_undeliverable(config: Config) -> str:
    slack = config.alerts.slack
    if slack is None:
        return ""
    key, secret = ("token", slack.token) if slack.token is not None else ("webhook_url", slack.webhook_url)
    if secret is None:
        return "alerts.slack has neither a token nor a webhook_url"
    try:
        value = secret.resolve()
    except ConfigError as exc:
        return f"alerts.slack.{key}: {exc}"
    if not value.strip():
        where = f"environment variable {secret.env}" if secret.env is not None else f"secret file {secret.file}"
        return f"alerts.slack.{key}: {where} is empty"
    return ""


def sender_for(config: Config, client=None) -> SlackSender | None:
    """The sender the config asks for (bot token first, webhook second), with `client` replacing the
    WebClient in tests; None when Slack is not configured."""
    slack = config.alerts.slack
    if slack is None:
        return None
    if client is not None:
        return SlackSender(client=client, secrets=tuple(_secrets(slack)))
    if slack.token is not None:
        token = slack.token.resolve()
        return SlackSender(client=make_client(token, slack.base_url, slack.timeout.total_seconds()),
                           secrets=(token,))
    if slack.webhook_url is not None:
        from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler, ServerErrorRetryHandler
        from slack_sdk.webhook import WebhookClient

        url = slack.webhook_url.resolve()
        hook = WebhookClient(url, timeout=int(slack.timeout.total_seconds()),
                             retry_handlers=[RateLimitErrorRetryHandler(1), ServerErrorRetryHandler(1)])
        return SlackSender(webhook=hook, secrets=(url,))
    return None


def _secrets(slack) -> list[str]:
    out = []
    for secret in (slack.token, slack.webhook_url):
        if secret is not None:
            try:
                out.append(secret.resolve())
            except ConfigError:
                pass
    return out


def drain(config: Config, store: Store, now: datetime, client=None, limit: int = 200) -> DrainReport:
    """Queue the Alertmanager re-sends due, then send the outbox items due at `now` (oldest first), at most
    `limit`, each through its notifier: Slack (post, update, reply) or Alertmanager (alert)."""
    now = utc(now)
    report = DrainReport(now=now.isoformat())
    slack = _slack_sender(config, store, client, report, now)
    pusher = _alertmanager_sender(config, store, report, now)
    if slack is None and pusher is None:
        return report
    if pusher is not None:
        enqueue_resends(config, store, now)
    with store.transaction() as session:
        due = store.outbox.due(session, now, limit)
    # Alertmanager messages each carry the incident's whole state: only the newest due one is sent, and
    # it supersedes the older ones (an older one sent after it would say a stale state).
    newest = {incident_id: item_id for item_id, incident_id, kind in due if kind == ALERT}
    blocked: set[int] = set()
    for item_id, incident_id, kind in due:
        if kind == ALERT:
            if pusher is not None and (incident_id is None or newest[incident_id] == item_id):
                _push_one(store, pusher, item_id, now, config, report)
            continue
        if slack is None:
            continue
        if incident_id is not None and (incident_id in blocked or _earlier_unsent(store, incident_id, item_id)):
            # An earlier message of this incident is not sent yet: this one waits, to keep the order.
            report.waiting += 1
            blocked.add(incident_id)
            continue
        ok = _send_one(store, slack, item_id, now, config, report)
        if not ok and incident_id is not None:
            blocked.add(incident_id)
    return report


def _slack_sender(config: Config, store: Store, client, report: DrainReport, now: datetime) -> SlackSender | None:
    if config.alerts.slack is None:
        if config.alerts.alertmanager is None:
            report.note = "no notifier (alerts.slack, alerts.alertmanager) is configured: nothing sent"
        return None
    why = _slack_undeliverable(config) if client is None else ""
    if why:
        _loud(store, why, report, now, slack=True)
        return None
    try:
        return sender_for(config, client)
    except ConfigError as exc:
        report.note = str(exc)  # names the variable or file, never the value
        return None


def _alertmanager_sender(config: Config, store: Store, report: DrainReport,
                         now: datetime) -> AlertmanagerSender | None:
    if config.alerts.alertmanager is None:
        return None
    why = alertmanager_undeliverable(config.alerts.alertmanager)
    if why:
        _loud(store, why, report, now, slack=False)
        return None
    return AlertmanagerSender(config.alerts.alertmanager)


def _loud(store: Store, why: str, report: DrainReport, now: datetime, slack: bool) -> None:
    # Loud on every drain: the messages wait in the outbox, and nothing else would say why.
    with store.transaction() as session:
        pending = store.outbox.depth(session)
        # Stored on each waiting message of this notifier (no attempt spent): `tailwatch alerts`, run where
        # the secret is not, reports what this process found, not what its own environment holds.
        for item_id, _, kind in store.outbox.due(session, now, UNDELIVERABLE_NOTED):
            item = store.outbox.get(session, item_id)
            if (kind != ALERT) == slack and not (item.last_error or "").startswith(AMBIGUOUS):
                item.last_error = UNDELIVERABLE + why
    log.error("notifications undeliverable: %s; %d waiting in the outbox", why, pending,
              extra={"reason": why, "pending": pending})
    report.undeliverable = "; ".join(w for w in (report.undeliverable, why) if w)
    report.note = report.undeliverable


UNDELIVERABLE_NOTED = 1000  # waiting messages a drain that cannot send marks with why, oldest first


def _earlier_unsent(store: Store, incident_id: int, item_id: int) -> bool:
    with store.transaction() as session:
        return store.outbox.earlier_unsent(session, incident_id, item_id, SLACK_KINDS)



def _send_one(store: Store, sender: SlackSender, item_id: int, now: datetime, config: Config,
              report: DrainReport) -> bool:
    with store.transaction() as session:
        item = store.outbox.get(session, item_id)
        if item is None or item.status != "pending":
            return True  # another drain got it
        incident = store.incidents.get(session, item.incident_id) if item.incident_id is not None else None
        kind, payload, key = item.kind or "post", item.payload or {}, item.dedup_key
        snapshot = incident_of(payload)
        if snapshot is not None:
            # Rendered now, from what the incident was when the notification was decided.
            payload = render(snapshot, kind, action_of(payload), config.alerts.slack, incident_url(config, snapshot))
        channel = (incident.channel if incident is not None and incident.channel else None) or item.channel
        thread_ts = incident.slack_ts if incident is not None else None
        check_first = (item.last_error or "").startswith(AMBIGUOUS)
        if kind in ("post", "reply") and not check_first:
            # Committed before the call: a process killed after Slack posted and before the outcome is
            # stored looks the message up on restart instead of posting it twice.
            item.last_error = AMBIGUOUS + "in flight"
    if kind in ("update", "reply") and thread_ts is None and sender.client is not None:
        result = SendResult(False, error="the incident's first message has no Slack ts", permanent=True)
    else:
        result = sender.send(kind, channel, payload, key, thread_ts, check_first)
    with store.transaction() as session:
        item = store.outbox.get(session, item_id)
        if result.ok and kind == "post" and item.incident_id is not None:
            incident = store.incidents.get(session, item.incident_id)
            incident.slack_ts = result.ts
            incident.channel = result.channel or incident.channel
        return _record(item, result, now, config.alerts.slack.max_attempts, report, "slack",
                       check_first=check_first)


def _push_one(store: Store, pusher: AlertmanagerSender, item_id: int, now: datetime, config: Config,
              report: DrainReport) -> bool:
    settings = config.alerts.alertmanager
    with store.transaction() as session:
        item = store.outbox.get(session, item_id)
        if item is None or item.status != "pending":
            return True  # another drain got it
        alerts = payload_alerts(item.payload or {}, config, now)
    result = pusher.send(alerts) if alerts else SendResult(True)
    with store.transaction() as session:
        item = store.outbox.get(session, item_id)
        if result.ok and item.incident_id is not None:
            store.outbox.supersede(session, item.incident_id, item_id, ALERT, now)
        return _record(item, result, now, settings.max_attempts, report, "alertmanager")


def _record(item, result: SendResult, now: datetime, max_attempts: int, report: DrainReport, notifier: str,
            check_first: bool = False) -> bool:
    """Store the outcome of one send of `item`: sent, failed for good, or retried after a backoff."""
    key, kind = item.dedup_key, item.kind or "post"
    item.attempts += 1
    if result.ok:
        item.status, item.sent_at, item.external_id, item.last_error = "sent", now, result.ts, None
        report.sent += 1
        log.info("sent %s %s", kind, key)
        return True
    if result.permanent or item.attempts >= max_attempts:
        item.status, item.last_error = "failed", result.error
        report.failed += 1
        why = "not retried" if result.permanent else f"gave up after {item.attempts} attempts"
        report.errors.append(f"{key}: {result.error} ({why})")
        log.error("%s %s %s failed: %s (%s)", notifier, kind, key, result.error, why)
        return False
    delay = timedelta(seconds=result.retry_after) if result.retry_after else backoff(item.attempts)
    item.next_attempt_at = now + delay
    item.last_error = (AMBIGUOUS if result.ambiguous or check_first else "") + result.error
    report.retried += 1
    report.errors.append(f"{key}: {result.error} (retry in {delay})")
    log.warning("%s %s %s: %s; retry in %s", notifier, kind, key, result.error, delay)
    return False
