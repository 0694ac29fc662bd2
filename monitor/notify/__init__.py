"""Notifications: the durable outbox and its senders, Slack and Alertmanager. `drain` is what the daemon calls."""

from __future__ import annotations

from monitor.notify.outbox import DrainReport, drain, undeliverable

__all__ = ["DrainReport", "drain", "undeliverable"]
