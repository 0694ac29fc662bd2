"""Source offsets, the quarantine, and the join buffer: what ingest reads and sets aside."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from storage.database import Repository, as_dict, between, given
from storage.models import EXCERPT_MAX_CHARS, JoinPending, QuarantineRow, SourceOffset, UTCDateTime

_OFFSET_COLUMNS = ("source", "file_key", "path", "offset", "line", "cursor", "fingerprint", "size", "tail")


def _execute_many(session: Session, statement, names: tuple[str, ...], rows: list[tuple], stamp_column,
                  stamp: datetime) -> None:
    """Run `statement` once per row through the driver's executemany: `rows` hold the values of `names`, and
    `stamp_column` takes `stamp` in every row. Those values are text, integers or None, which no type
    converts: the stamp is converted once, not SQLAlchemy's per-row parameter processing (~50 us a row,
    seconds for many files)."""
    conn = session.connection()
    compiled = statement.compile(dialect=conn.dialect)
    convert = stamp_column.type.bind_processor(conn.dialect)
    value = convert(stamp) if convert else stamp
    columns = (*names, stamp_column.key)
    if compiled.positiontup is None:
        params = [dict(zip(columns, (*row, value), strict=True)) for row in rows]
    elif tuple(compiled.positiontup) == columns:
        params = [(*row, value) for row in rows]
    else:
        take = itemgetter(*(columns.index(k) for k in compiled.positiontup))
        params = [take((*row, value)) for row in rows]
    conn.exec_driver_sql(compiled.string, params)


@dataclass(frozen=True, slots=True)
class OffsetState:
    """How far one file (or SQL source) has been read: bytes, lines/rows, and the SQL cursor; for a file, a
    fingerprint of its first bytes and `tail`, `<start>-<end>:<sha1>` of the last bytes read before `end`."""

    file_key: str
    path: str
    offset: int = 0
    line: int = 0
    cursor: str | None = None
    fingerprint: str | None = None
    size: int | None = None
    tail: str | None = None


class Offsets(Repository):
    """How far each source has been read: per file, bytes, lines and the SQL cursor."""

    def load(self, session: Session, source: str) -> dict[str, OffsetState]:
        """Every stored offset of `source`, by file key (empty for a new source)."""
        # Plain rows, not ORM objects: a directory of many small files holds one row per file.
        c = SourceOffset.__table__.c
        rows = session.execute(select(c.file_key, c.path, c.offset, c.line, c.cursor, c.fingerprint, c.size,
                                      c.tail)
                               .where(c.source == source)).all()
        return {r[0]: OffsetState(*r) for r in rows}

    def save(self, session: Session, source: str, states: Iterable[OffsetState]) -> None:
        """Insert or overwrite the offsets of `source` for the given files."""
        by_key = {s.file_key: s for s in states}
        if not by_key:
            return
        table = SourceOffset.__table__
        dialect = sqlite if session.get_bind().dialect.name == "sqlite" else postgresql
        # One upsert per file, new or known: no lookup of which keys are stored first.
        statement = dialect.insert(table)
        statement = statement.on_conflict_do_update(
            index_elements=[table.c.source, table.c.file_key],
            set_={k: statement.excluded[k] for k in ("path", "offset", "line", "cursor", "fingerprint", "size",
                                                    "tail", "updated_at")})
        _execute_many(session, statement, _OFFSET_COLUMNS, [
            (source, s.file_key, s.path, int(s.offset), int(s.line), s.cursor, s.fingerprint,
             None if s.size is None else int(s.size), s.tail)
            for s in by_key.values()
        ], table.c.updated_at, self.clock())

    def delete(self, session: Session, source: str, file_keys: Iterable[str]) -> None:
        """Forget the stored offsets of `source` for `file_keys`."""
        keys = list(file_keys)
        if keys:
            session.execute(delete(SourceOffset).where(SourceOffset.source == source,
                                                       SourceOffset.file_key.in_(keys)))


class Quarantine(Repository):
    """Rows that broke the contract, with their reason codes."""

    def add(self, session: Session, rows: list[dict[str, Any]]) -> None:
        """Bulk-insert quarantined rows (keys: service, kind, source, position, reason; optional
        tick_id, excerpt (cut to 512 chars), created_at, field, raw (bytes))."""
        if not rows:
            return
        now = self.clock()
        values = [
            {
                "tick_id": None if r.get("tick_id") is None else int(r["tick_id"]),
                "service": r["service"],
                "kind": str(r["kind"]),
                "source": r["source"],
                "position": str(r["position"]),
                "reason": str(r["reason"]),
                "excerpt": (r.get("excerpt") or "")[:EXCERPT_MAX_CHARS],
                "created_at": r.get("created_at") or now,
                "field": r.get("field"),
                "raw": r.get("raw"),
            }
            for r in rows
        ]
        session.execute(insert(QuarantineRow.__table__), values)

    def counts(self, session: Session, service: str, tick_id: int | None = None) -> dict[str, int]:
        """Quarantined rows by reason code, for one tick or (tick_id None) all time."""
        query = select(QuarantineRow.reason, func.count()).where(QuarantineRow.service == service)
        query = query.where(*given((QuarantineRow.tick_id, tick_id)))
        return {reason: int(n) for reason, n in session.execute(query.group_by(QuarantineRow.reason))}

    def search(self, session: Session, service: str, since: datetime | None = None, until: datetime | None = None,
               reason: str | None = None, kind: str | None = None, limit: int | None = None,
               ) -> list[dict[str, Any]]:
        """Rows of `service` quarantined in [since, until) (with `reason` and `kind` when given), oldest
        first (the first `limit`), as dicts of every column."""
        query = select(QuarantineRow).where(*self._filters(service, since, until, reason, kind))
        query = query.order_by(QuarantineRow.id)
        if limit is not None:
            query = query.limit(limit)
        return [as_dict(q) for q in session.scalars(query)]

    def grouped(self, session: Session, service: str, group_by: list[str], since: datetime | None = None,
                until: datetime | None = None, reason: str | None = None, kind: str | None = None,
                ) -> list[tuple]:
        """Per group of the `group_by` columns, its values, rows, first and last created_at; largest first."""
        cols = [getattr(QuarantineRow, g) for g in group_by]
        query = (select(*cols, func.count().label("rows"), func.min(QuarantineRow.created_at),
                        func.max(QuarantineRow.created_at))
                 .where(*self._filters(service, since, until, reason, kind)).group_by(*cols)
                 .order_by(func.count().desc()))
        # min/max come back untyped: read them as the column type reads its values.
        read = UTCDateTime().process_result_value
        return [(*r[:-2], read(r[-2], None), read(r[-1], None)) for r in session.execute(query).all()]

    @staticmethod
    def _filters(service: str, since: datetime | None, until: datetime | None, reason: str | None,
                 kind: str | None) -> list[Any]:
        filters = [QuarantineRow.service == service, *between(QuarantineRow.created_at, since, until)]
        if reason is not None:
            filters.append(QuarantineRow.reason == reason)
        if kind is not None:
            filters.append(QuarantineRow.kind == kind)
        return filters


class JoinBuffer(Repository):
    """Rows waiting for their timings, as Parquet blobs per service and kind: one blob replaced at each step,
    or (`add`) blobs kept side by side, each removed by its id."""

    def load(self, session: Session, service: str, kind: str) -> list[bytes]:
        """The Parquet blobs waiting to be joined for `service` and `kind`, oldest first."""
        query = (
            select(JoinPending.payload)
            .where(JoinPending.service == service, JoinPending.kind == kind)
            .order_by(JoinPending.id)
        )
        return list(session.scalars(query))

    def replace(
        self, session: Session, service: str, kind: str, payload: bytes | None, rows: int
    ) -> None:
        """Replace the waiting rows of `service`/`kind` by one blob (or by nothing when None)."""
        session.execute(delete(JoinPending).where(JoinPending.service == service, JoinPending.kind == kind))
        if payload is not None:
            session.add(
                JoinPending(service=service, kind=kind, created_at=self.clock(), rows=int(rows), payload=payload)
            )
            session.flush()

    def load_each(self, session: Session, service: str, kind: str) -> list[tuple[int, bytes]]:
        """(id, Parquet blob) of each blob kept for `service` and `kind`, oldest first."""
        query = (
            select(JoinPending.id, JoinPending.payload)
            .where(JoinPending.service == service, JoinPending.kind == kind)
            .order_by(JoinPending.id)
        )
        return [(int(i), p) for i, p in session.execute(query)]

    def add(self, session: Session, service: str, kind: str, payload: bytes, rows: int) -> int:
        """Keep one more blob for `service`/`kind` beside the others; its id."""
        row = JoinPending(service=service, kind=kind, created_at=self.clock(), rows=int(rows), payload=payload)
        session.add(row)
        session.flush()
        return int(row.id)

    def remove(self, session: Session, ids: Iterable[int]) -> None:
        """Remove the blobs of these ids."""
        ids = list(ids)
        if ids:
            session.execute(delete(JoinPending).where(JoinPending.id.in_(ids)))
