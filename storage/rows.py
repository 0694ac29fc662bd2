"""Plain records the store reads and writes, importable without SQLAlchemy (the aggregate layer builds
them; `import checks` must stay light)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class PartialRow:
    """One bucket's partial aggregate for one model version and segment ('' = all rows)."""

    model_version: str
    bucket_start: datetime
    bucket_seconds: int
    segment: str
    rows: int
    payload: bytes
