"""Canonical JSON text: the form of every stored JSON document and label key (importable without SQLAlchemy)."""

from __future__ import annotations

import json
from datetime import date, datetime
from typing import Any


def _json_default(obj: Any) -> Any:
    """Encode what json cannot: numpy scalars/arrays, datetimes, sets."""
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        return obj.item()
    if hasattr(obj, "tolist") and callable(obj.tolist):
        return obj.tolist()
    if isinstance(obj, datetime | date):
        return obj.isoformat()
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def dumps(value: Any) -> str:
    """Canonical JSON text: sorted keys, compact separators, UTF-8 kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_default)


def labels_key(labels: dict[str, Any] | None) -> str:
    """The identity of a label set: canonical sorted JSON ('{}' for no labels)."""
    return dumps(labels or {})
