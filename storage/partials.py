"""Bucket partials (the stored summaries every window merges) and reference profiles."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from sqlalchemy import bindparam, delete, func, insert, select, update
from sqlalchemy.orm import Session

from storage.database import Repository, given, utc
from storage.models import BucketPartial, ReferenceProfile
from storage.rows import PartialRow

_PARTIALS = BucketPartial.__table__
# `Partials.upsert`'s statements (see there). Expanding IN parameters: one cached statement for any batch.
_STORED_PARTIALS = select(
    _PARTIALS.c.model_version, _PARTIALS.c.bucket_start, _PARTIALS.c.bucket_seconds, _PARTIALS.c.segment,
    _PARTIALS.c.rows, _PARTIALS.c.payload,
).where(
    _PARTIALS.c.service == bindparam("service"),
    _PARTIALS.c.model_version.in_(bindparam("versions", expanding=True)),
    _PARTIALS.c.bucket_start >= bindparam("lo"),
    _PARTIALS.c.bucket_start <= bindparam("hi"),
    _PARTIALS.c.bucket_seconds.in_(bindparam("seconds", expanding=True)),
    _PARTIALS.c.segment.in_(bindparam("segments", expanding=True)),
)
_UPDATE_PARTIAL = update(_PARTIALS).where(
    _PARTIALS.c.service == bindparam("k_service"),
    _PARTIALS.c.model_version == bindparam("k_model_version"),
    _PARTIALS.c.bucket_start == bindparam("k_bucket_start"),
    _PARTIALS.c.bucket_seconds == bindparam("k_bucket_seconds"),
    _PARTIALS.c.segment == bindparam("k_segment"),
).values(rows=bindparam("rows"), payload=bindparam("payload"), updated_at=bindparam("updated_at"))
_INSERT_PARTIAL = insert(_PARTIALS)


class Partials(Repository):
    """Partial aggregates per bucket, model version and segment."""

    def upsert(
        self,
        session: Session,
        service: str,
        rows: list[PartialRow],
        merge: Callable[[bytes, bytes], bytes],
    ) -> None:
        """Add partials: a stored key gets merge(stored, new) and summed rows; a new key is inserted."""
        batch: dict[tuple[str, datetime, int, str], PartialRow] = {}
        for row in rows:
            key = (row.model_version, utc(row.bucket_start), int(row.bucket_seconds), row.segment)
            prev = batch.get(key)
            batch[key] = row if prev is None else replace(
                prev, rows=prev.rows + row.rows, payload=merge(prev.payload, row.payload)
            )
        if not batch:
            return
        starts = [k[1] for k in batch]
        # One SELECT for every possibly-stored key: the batch's bounding box, matched in Python.
        # A range (not an IN of tuples) keeps the bind-parameter count flat for any batch size.
        stored = session.execute(_STORED_PARTIALS, {
            "service": service, "versions": sorted({k[0] for k in batch}), "lo": min(starts), "hi": max(starts),
            "seconds": sorted({k[2] for k in batch}), "segments": sorted({k[3] for k in batch}),
        }).all()
        old = {(r[0], utc(r[1]), r[2], r[3]): (r[4], r[5]) for r in stored}
        now = self.clock()
        updates, inserts = [], []
        for key, row in batch.items():
            if key in old:
                old_rows, old_payload = old[key]
                updates.append({"k_service": service, "k_model_version": key[0], "k_bucket_start": key[1],
                                "k_bucket_seconds": key[2], "k_segment": key[3], "rows": old_rows + int(row.rows),
                                "payload": merge(old_payload, row.payload), "updated_at": now})
            else:
                inserts.append({"service": service, "model_version": key[0], "bucket_start": key[1],
                                "bucket_seconds": key[2], "segment": key[3], "rows": int(row.rows),
                                "payload": row.payload, "updated_at": now})
        # Core statements on the table, built once: a tick upserts a few rows, and the ORM's bulk
        # machinery (and building the statements anew) cost more than the rows themselves.
        if updates:
            session.execute(_UPDATE_PARTIAL, updates)
        if inserts:
            session.execute(_INSERT_PARTIAL, inserts)

    def load(
        self,
        session: Session,
        service: str,
        since: datetime,
        until: datetime,
        model_version: str | None = None,
        bucket_seconds: int | None = None,
        segment: str | None = None,
        except_segment: str | None = None,
    ) -> list[PartialRow]:
        """Partials of `service` with bucket_start in [since, until) (of `segment`, or of every segment but
        `except_segment`, when given), oldest first; empty if none."""
        # Columns, not ORM objects: a history query reads a month of buckets.
        query = select(
            BucketPartial.model_version, BucketPartial.bucket_start, BucketPartial.bucket_seconds,
            BucketPartial.segment, BucketPartial.rows, BucketPartial.payload,
        ).where(
            BucketPartial.service == service,
            BucketPartial.bucket_start >= since,
            BucketPartial.bucket_start < until,
        )
        query = query.where(*given((BucketPartial.model_version, model_version),
                                   (BucketPartial.bucket_seconds, bucket_seconds),
                                   (BucketPartial.segment, segment)))
        if except_segment is not None:
            query = query.where(BucketPartial.segment != except_segment)
        query = query.order_by(
            BucketPartial.bucket_start, BucketPartial.model_version, BucketPartial.bucket_seconds,
            BucketPartial.segment,
        )
        return [PartialRow(*p) for p in session.execute(query)]

    def served(self, session: Session, service: str, model_version: str, segment: str, since: datetime,
               until: datetime) -> list[tuple[int, int]]:
        """(bucket_seconds, buckets) of `model_version`'s buckets with rows and bucket_start in [since, until),
        counted per bucket size."""
        return [(int(size), int(n)) for size, n in session.execute(
            select(BucketPartial.bucket_seconds, func.count(func.distinct(BucketPartial.bucket_start)))
            .where(BucketPartial.service == service, BucketPartial.model_version == model_version,
                   BucketPartial.segment == segment, BucketPartial.bucket_start >= utc(since),
                   BucketPartial.bucket_start < utc(until), BucketPartial.rows > 0)
            .group_by(BucketPartial.bucket_seconds))]

    def updated_span(self, session: Session, service: str, since: datetime,
                     ) -> tuple[datetime, datetime] | None:
        """The first bucket start and the last bucket start of `service`'s partials written at or after
        `since` (store clock); None when none were."""
        lo, hi = session.execute(
            select(func.min(BucketPartial.bucket_start), func.max(BucketPartial.bucket_start)).where(
                BucketPartial.service == service, BucketPartial.updated_at >= since)
        ).one()
        return None if lo is None else (lo, hi)

    def newest_end(self, session: Session, service: str) -> datetime | None:
        """The end of `service`'s newest stored bucket (how far its data reaches); None without data."""
        row = session.execute(
            select(BucketPartial.bucket_start, BucketPartial.bucket_seconds)
            .where(BucketPartial.service == service)
            .order_by(BucketPartial.bucket_start.desc()).limit(1)
        ).first()
        return None if row is None else row[0] + timedelta(seconds=row[1])

    def keys_before(self, session: Session, service: str, before: datetime, below_seconds: int,
                    ) -> list[tuple[datetime, int]]:
        """(bucket_start, bucket_seconds) of `service`'s partials finer than `below_seconds` starting before
        `before`, oldest first."""
        rows = session.execute(
            select(BucketPartial.bucket_start, BucketPartial.bucket_seconds).distinct()
            .where(BucketPartial.service == service, BucketPartial.bucket_start < before,
                   BucketPartial.bucket_seconds < below_seconds)
            .order_by(BucketPartial.bucket_start)
        ).all()
        return [(r[0], r[1]) for r in rows]

    def delete(self, session: Session, service: str, since: datetime, until: datetime,
               below_seconds: int | None = None) -> int:
        """Delete `service`'s partials with bucket_start in [since, until) (only those finer than
        `below_seconds` when given); returns how many."""
        query = delete(BucketPartial).where(
            BucketPartial.service == service, BucketPartial.bucket_start >= since, BucketPartial.bucket_start < until)
        if below_seconds is not None:
            query = query.where(BucketPartial.bucket_seconds < below_seconds)
        return session.execute(query).rowcount or 0

    def services(self, session: Session) -> list[str]:
        """Every service with stored partials."""
        return list(session.scalars(select(BucketPartial.service).distinct().order_by(BucketPartial.service)))

    def keys_since(self, session: Session, service: str, since: datetime) -> list[tuple[str, str]]:
        """(model_version, segment) of `service`'s partials with bucket_start at or after `since`, sorted."""
        return [(r[0], r[1]) for r in session.execute(
            select(BucketPartial.model_version, BucketPartial.segment).distinct()
            .where(BucketPartial.service == service, BucketPartial.bucket_start >= utc(since))
            .order_by(BucketPartial.model_version, BucketPartial.segment))]

    def versions(self, session: Session, service: str) -> list[str]:
        """Every model version of `service` with stored partials, sorted."""
        return list(session.scalars(select(BucketPartial.model_version).distinct()
                                    .where(BucketPartial.service == service).order_by(BucketPartial.model_version)))


class Profiles(Repository):
    """The reference profile of each service."""

    def save(self, session: Session, service: str, fingerprint: str, source: str, rows: int,
             profile_json: str) -> None:
        """Store (or replace) the reference profile of `service`."""
        row = session.get(ReferenceProfile, service)
        if row is None:
            row = ReferenceProfile(service=service)
            session.add(row)
        row.fingerprint, row.source, row.rows = fingerprint, source, int(rows)
        row.built_at, row.profile = self.clock(), profile_json
        session.flush()

    def load(self, session: Session, service: str) -> ReferenceProfile | None:
        """The stored reference profile of `service`, or None when none was built."""
        return session.get(ReferenceProfile, service)
