"""Silences and inhibition: label matchers, and why an alert's notifications are muted at a time."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from monitor.alerts.alert import Alert
from monitor.config import Alerts

_MATCHER = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$")


def parse_matcher(text: str) -> dict[str, str]:
    """`name=value`, `name!=value`, `name=~regex`, `name!~regex` -> {name, op, value}."""
    m = _MATCHER.match(text)
    if not m:
        raise ValueError(f"not a matcher: {text!r} (write name=value, name!=value, name=~regex or name!~regex)")
    name, op, value = m.groups()
    if op in ("=~", "!~"):
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"matcher {text!r}: bad regex: {exc}") from None
    return {"name": name, "op": op, "value": value.strip("\"'")}


def matches(labels: Mapping[str, str], matchers: Sequence[Mapping[str, str]]) -> bool:
    """True when every matcher holds for `labels` (an absent label is the empty string)."""
    for m in matchers:
        value = str(labels.get(m["name"], ""))
        op = m.get("op", "=")
        ok = {"=": value == m["value"], "!=": value != m["value"],
              "=~": op == "=~" and re.fullmatch(m["value"], value) is not None,
              "!~": op == "!~" and re.fullmatch(m["value"], value) is None}[op]
        if not ok:
            return False
    return True


def muted_by(alert: Alert, firing: Sequence[Alert], silences: Sequence[Mapping[str, Any]], settings: Alerts,
             now: datetime) -> str | None:
    """Why `alert`'s notifications are muted at `now` ('silence 3', 'inhibited by no_data'), or None."""
    for s in silences:
        if s["starts_at"] <= now < s["ends_at"] and matches(alert.labels, s["matchers"]):
            return f"silence {s['id']}"
    for rule in settings.inhibit:
        if not matches(alert.labels, _exact(rule.target)):
            continue
        for source in firing:
            if source.fingerprint == alert.fingerprint or not matches(source.labels, _exact(rule.source)):
                continue
            if all(source.labels.get(k) == alert.labels.get(k) for k in rule.equal):
                return f"inhibited by {source.labels.get('alertname', source.fingerprint)}"
    return None


def _exact(pairs: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "op": "=", "value": v} for k, v in pairs.items()]
