"""A SQL table read incrementally in the order of a monotonic cursor column."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pandas as pd

from monitor.config import Limits, SqlSource
from monitor.ingest.sources.batch import LINE, Backlog, Batch, Observer
from storage.offsets import OffsetState


class SqlTableSource:
    """A SQL table read in `cursor_column` order; the last cursor value read is the offset.

    A run of rows sharing one cursor value is never split across chunks, so `>` never skips a row.
    """

    def __init__(self, name: str, config: SqlSource, limits: Limits):
        self.name, self.config, self.limits = name, config, limits
        self._engine = None

    def engine(self):
        if self._engine is None:
            from sqlalchemy import create_engine
            from sqlalchemy.engine import make_url

            url = make_url(self.config.url)
            if self.config.password is not None:
                url = url.set(password=self.config.password.resolve())
            self._engine = create_engine(url, pool_pre_ping=True)
        return self._engine

    def read(self, offsets: dict[str, OffsetState], observe: Observer | None = None) -> Iterator[Batch]:
        """The rows after the stored cursor, a chunk at a time; `observe` is told the rows read after each
        chunk (the rows in all only at the end: a count would cost a query of its own)."""
        backlog = Backlog(observe, []) if observe is not None else None
        for batch in self._chunks(offsets):
            if backlog is not None:
                backlog.read(batch)
            yield batch
        if backlog is not None:
            backlog.finish()

    def _chunks(self, offsets: dict[str, OffsetState]) -> Iterator[Batch]:
        import sqlalchemy as sa

        key = f"sql:{self.config.table}"
        state = offsets.get(key) or OffsetState(file_key=key, path=self.config.table, offset=0, line=0,
                                                cursor=None, fingerprint=None, size=None)
        schema, _, name = self.config.table.rpartition(".")
        table = sa.Table(name, sa.MetaData(), schema=schema or None, autoload_with=self.engine())
        col = table.c[self.config.cursor_column]
        limit = self.limits.chunk_rows
        while True:
            query = sa.select(table).order_by(col).limit(limit + 1)
            if state.cursor is not None:
                query = query.where(col > _decode_cursor(state.cursor))
            with self.engine().connect() as conn:
                frame = pd.read_sql(query, conn)
                more = len(frame) > limit
                if more:
                    cursor = frame[self.config.cursor_column]
                    if cursor.iloc[0] == cursor.iloc[limit]:
                        # One cursor value fills the chunk: read all of its rows at once.
                        frame = pd.read_sql(sa.select(table).where(col == cursor.iloc[0]), conn)
                    else:
                        frame = frame[cursor != cursor.iloc[limit]]
            if frame.empty:
                return
            frame[LINE] = np.arange(state.line + 1, state.line + 1 + len(frame), dtype=np.int64)
            state = replace(state, cursor=_encode_cursor(frame[self.config.cursor_column].iloc[-1]),
                            line=state.line + len(frame))
            yield Batch(self.name, self.config.table, frame, [], state, [])
            if not more:
                return


def _encode_cursor(value) -> str:
    if isinstance(value, pd.Timestamp):
        return json.dumps({"t": value.isoformat()})
    if isinstance(value, np.integer | int):
        return json.dumps({"i": int(value)})
    if isinstance(value, np.floating | float):
        return json.dumps({"f": float(value)})
    return json.dumps({"s": str(value)})


def _decode_cursor(text: str):
    (tag, value), = json.loads(text).items()
    return {"t": pd.Timestamp, "i": int, "f": float, "s": str}[tag](value)
