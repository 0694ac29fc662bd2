"""Alertmanager: an outbox message rendered as Alertmanager alerts and pushed to every configured
Alertmanager (`POST /api/v2/alerts`), and the re-sends that keep a firing alert alive there.

An incident's alerts are its member alerts: their labels (alertname, service, model_version, severity,
rule labels) plus the verdict and the stage, field, class and group its evidence points at. A firing
alert ends `ENDS_AFTER` resend intervals ahead, so an Alertmanager that stops hearing of it (tailwatch
down) resolves it itself; a resolved one ends at its resolution.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import urllib.request
from collections.abc import Mapping
from datetime import datetime
from http.client import HTTPException
from typing import Any
from urllib.error import HTTPError, URLError

from monitor.alerts.group import ALERT
from monitor.alerts.render import plain
from monitor.config import Alertmanager, Config, ConfigError, incident_url
from monitor.notify.message import incident_of
from monitor.notify.slack import SendResult
from monitor.verdicts.evidence import gathered, text
from storage.store import Store

log = logging.getLogger(__name__)

ENDS_AFTER = 4  # resend intervals a firing alert stays firing in Alertmanager without news (as Prometheus)
EVIDENCE_LABELS = ("field", "class", "group")
MAX_ANNOTATION = 4000  # characters of any annotation
MAX_LABEL = 200  # characters of a label value (`label_value`)


def label_name(name: str) -> str:
    """`name` as an Alertmanager label name ([a-zA-Z_][a-zA-Z0-9_]*): other characters become `_`."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", name) or "_"
    return "_" + name if name[0].isdigit() else name


def labels_of(alert: Mapping[str, Any], incident: Mapping[str, Any]) -> dict[str, str]:
    """The Alertmanager labels of one of the incident's alerts: its own labels, the verdict, and the top
    stage and the field, class and group of its evidence; values as strings, empty ones left out."""
    labels: dict[str, Any] = {"service": incident.get("service"), "model_version": incident.get("model_version")}
    labels.update(alert.get("labels") or {})
    notes = alert.get("annotations") or {}
    labels.setdefault("verdict", notes.get("verdict") or incident.get("verdict"))
    top_stage = (notes.get("attribution") or {}).get("top_stage")
    if top_stage:
        labels.setdefault("stage", top_stage)
    for e in notes.get("evidence") or []:
        for key in EVIDENCE_LABELS:
            if (e.get("labels") or {}).get(key) is not None:
                labels.setdefault(key, (e.get("labels") or {})[key])
    return {label_name(str(k)): label_value(v) for k, v in labels.items() if v is not None and str(v) != ""}


def label_value(value: Any) -> str:
    """`value` as an Alertmanager label value: as `plain` text, at most MAX_LABEL characters (a longer one
    ends in `…` and 8 hex digits of its hash, so two long values that share a beginning stay two alerts)."""
    text = plain(value)
    if len(text) <= MAX_LABEL:
        return text
    return text[: MAX_LABEL - 9] + "…" + hashlib.sha256(text.encode()).hexdigest()[:8]


def render(incident: Mapping[str, Any], settings: Alertmanager, now: datetime,
           url: str | None = None) -> list[dict[str, Any]]:
    """The Alertmanager alerts of `incident` (a snapshot with its times as datetimes) sent at `now`: its
    firing unmuted alerts end ENDS_AFTER resend intervals after `now`; the others, or all once the
    incident is resolved, end when the snapshot was taken (its resolution); `url`: the incident's page,
    each alert's generatorURL. Labels and annotations are plain text (`plain`: no control characters or
    bidi overrides; evidence a line per item), each annotation at most MAX_ANNOTATION characters; they are
    not escaped for any one receiver: Alertmanager's templates do that (deploy/alertmanager for Slack)."""
    summary = incident.get("summary") or {}
    resolved = incident.get("status") == "resolved"
    ended = incident.get("resolved_at") or incident.get("updated_at") or now
    onset = incident.get("first_window_start") or incident.get("opened_at") or now
    out = []
    for alert in summary.get("alerts", []):
        notes = alert.get("annotations") or {}
        if alert.get("state") != "firing" and not alert.get("fired_at"):
            continue  # pending and never fired: Alertmanager has not heard of it
        labels = labels_of(alert, incident)
        firing = not resolved and alert.get("state") == "firing" and not alert.get("muted")
        starts = datetime.fromisoformat(notes["onset"]) if notes.get("onset") else onset
        annotations = {"summary": plain(notes.get("summary") or incident.get("verdict") or labels.get("alertname", ""))}
        evidence = "\n".join(plain(text(e)) for e in gathered(notes)[:20])
        if evidence:
            annotations["evidence"] = evidence
        if resolved and summary.get("resolution"):
            annotations["resolution"] = plain(summary["resolution"])
        fill = {"alertname": labels.get("alertname", ""), "service": incident.get("service") or "",
                "model_version": incident.get("model_version") or "", "incident": incident.get("id")}
        if settings.runbook_url:
            annotations["runbook_url"] = plain(settings.runbook_url.format(**fill))
        annotations = {k: v if len(v) <= MAX_ANNOTATION else v[: MAX_ANNOTATION - 1] + "…"
                       for k, v in annotations.items()}
        item = {"labels": labels, "annotations": annotations, "startsAt": _rfc3339(min(starts, now)),
                "endsAt": _rfc3339(now + ENDS_AFTER * settings.resend_interval if firing else max(ended, starts))}
        if url:
            item["generatorURL"] = url
        out.append(item)
    return out


def _rfc3339(ts: datetime) -> str:
    return ts.isoformat().replace("+00:00", "Z")


class AlertmanagerSender:
    """Pushes alerts to every URL of the settings; errors never contain the credentials."""

    def __init__(self, settings: Alertmanager) -> None:
        self.settings = settings
        self.headers = {"Content-Type": "application/json", "User-Agent": "tailwatch"}
        self._secrets: list[str] = []
        if settings.basic_auth is not None:
            password = settings.basic_auth.password.resolve()
            token = base64.b64encode(f"{settings.basic_auth.username}:{password}".encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"
            self._secrets += [password, token]
        elif settings.bearer_token is not None:
            token = settings.bearer_token.resolve()
            self.headers["Authorization"] = f"Bearer {token}"
            self._secrets.append(token)

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            if secret:
                text = text.replace(secret, "***")
        return " ".join(text.split())[:500]

    def send(self, alerts: list[dict[str, Any]]) -> SendResult:
        """Push `alerts` to every URL: ok when each accepted them; otherwise the failures, permanent when
        each failure is (a 4xx other than 408 / 429: retrying sends the same request). Every URL gets each
        attempt: Alertmanager deduplicates alerts by their labels."""
        body = json.dumps(alerts).encode()
        errors, permanent, retry_after = [], True, None
        for base in self.settings.urls:
            url = base.rstrip("/") + "/api/v2/alerts"
            request = urllib.request.Request(url, data=body, headers=self.headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.settings.timeout.total_seconds()) as resp:
                    resp.read()
                continue
            except HTTPError as exc:
                detail = exc.read(300).decode(errors="replace")
                errors.append(f"{base}: HTTP {exc.code} {detail}")
                if exc.code in (408, 429) or exc.code >= 500:
                    permanent = False
                if exc.code == 429:
                    retry_after = float(exc.headers.get("Retry-After") or 1)
            except (URLError, HTTPException, TimeoutError, OSError) as exc:
                errors.append(f"{base}: {type(exc).__name__}: {getattr(exc, 'reason', exc)}")
                permanent = False
        if not errors:
            return SendResult(True)
        return SendResult(False, error=self.scrub("; ".join(errors)), permanent=permanent, retry_after=retry_after)


def undeliverable(settings: Alertmanager | None) -> str:
    """Why alerts cannot be pushed now: a configured credential is missing or unreadable (named by
    variable or file, never by value); '' when they can or Alertmanager is not configured."""
    if settings is None:
        return ""
    for key, secret in (("basic_auth.password", settings.basic_auth.password if settings.basic_auth else None),
                        ("bearer_token", settings.bearer_token)):
        if secret is not None:
            try:
                secret.resolve()
            except ConfigError as exc:
                return f"alerts.alertmanager.{key}: {exc}"
    return ""


def payload_alerts(payload: Mapping[str, Any], config: Config, now: datetime) -> list[dict[str, Any]]:
    """The alerts an outbox message of kind `alert` sends at `now`, linked to the incident's page."""
    incident = incident_of(payload)
    return [] if incident is None else render(incident, config.alerts.alertmanager, now,
                                              incident_url(config, incident))


def enqueue_resends(config: Config, store: Store, now: datetime) -> int:
    """Write a re-send of each open incident whose newest Alertmanager message was written a resend
    interval ago or more and is sent (one still pending carries the news already), or that has none yet
    (opened before Alertmanager was configured); returns how many."""
    settings = config.alerts.alertmanager
    if settings is None:
        return 0
    written = 0
    with store.transaction() as session:
        incidents = {i["id"]: i for i in store.incidents.load(session, status="open")}
        last = store.outbox.last_written(session, ALERT, list(incidents))
        for incident_id in sorted(incidents):
            at, pending = last.get(incident_id, (None, False))
            if pending or (at is not None and now - at < settings.resend_interval):
                continue
            incident = incidents[incident_id]
            # The snapshot of the last notification decision: a re-send says the same, with a new end.
            store.outbox.add(session, dedup_key=f"incident:{incident_id}:rev:{incident['revision']}:{ALERT}:"
                             f"{now.isoformat()}", created_at=now, channel="", status="pending", attempts=0,
                             payload={"incident": incident, "action": "repeat"}, next_attempt_at=now,
                             incident_id=incident_id, kind=ALERT)
            written += 1
    if written:
        log.info("alertmanager: %d re-send(s) of firing incidents queued", written)
    return written
