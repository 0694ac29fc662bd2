"""Retention: compact old bucket partials into coarser buckets, tier by tier, and expire what only
matters for a while (quarantine excerpts, sent notifications, tick rows, job events).

Compaction merges the partials of each coarse bucket (`monitor.aggregate.partial.merge_all`) and replaces them in
one transaction, so a window made of whole coarse buckets scores the same before and after.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from monitor.aggregate.partial import Partial, merge_all, merge_bytes
from monitor.config import Config
from monitor.verdicts.windows import EPOCH, floor_to
from storage.rows import PartialRow
from storage.store import Store

log = logging.getLogger(__name__)

CHUNK = timedelta(days=1)  # history compacted per transaction: bounded memory on a first run over months


def apply(config: Config, store: Store, now: datetime) -> dict:
    """Compact every tier and expire old rows at clock `now`; returns what was done, in rows."""
    policy = config.daemon.retention
    done: dict = {"compacted": {}, "expired": {}}
    for tier in policy.tiers:
        fine, coarse = compact(store, now - tier.after, tier.bucket)
        done["compacted"][f"{int(tier.bucket.total_seconds())}s"] = {"from": fine, "to": coarse}
    with store.transaction() as session:
        if policy.partials is not None:
            done["expired"]["partials"] = sum(
                store.partials.delete(session, service, EPOCH, now - policy.partials)
                for service in store.partials.services(session))
        for what in ("quarantine", "outbox_sent", "ticks", "job_events"):
            done["expired"][what] = store.retention.expire(session, what, now - getattr(policy, what))
    log.info("retention done", extra=done)
    return done


def compact(store: Store, before: datetime, bucket: timedelta) -> tuple[int, int]:
    """Merge every partial finer than `bucket` in the whole buckets of that size ending by `before` into one
    partial per bucket, model version and segment; returns (partials removed, coarse partials written)."""
    seconds = int(bucket.total_seconds())
    cutoff = floor_to(before, bucket)
    removed = written = 0
    with store.transaction() as session:
        services = store.partials.services(session)
    for service in services:
        with store.transaction() as session:
            keys = store.partials.keys_before(session, service, cutoff, seconds)
        if not keys:
            continue
        start = floor_to(keys[0][0], max(bucket, CHUNK))
        while start < cutoff:
            end = min(start + max(bucket, CHUNK), cutoff)
            with store.transaction() as session:
                rows = [r for r in store.partials.load(session, service, start, end) if r.bucket_seconds < seconds]
                if rows:
                    merged = _merge(rows, bucket)
                    removed += store.partials.delete(session, service, start, end, below_seconds=seconds)
                    store.partials.upsert(session, service, merged, merge_bytes)
                    written += len(merged)
            start = end
    return removed, written


def _merge(rows: list[PartialRow], bucket: timedelta) -> list[PartialRow]:
    groups: dict[tuple[str, datetime, str], list[PartialRow]] = defaultdict(list)
    for row in rows:
        groups[(row.model_version, floor_to(row.bucket_start, bucket), row.segment)].append(row)
    seconds = int(bucket.total_seconds())
    return [
        PartialRow(version, start, seconds, segment, sum(r.rows for r in parts),
                   merge_all(Partial.from_bytes(r.payload) for r in parts).to_bytes())
        for (version, start, segment), parts in sorted(groups.items())
    ]
