"""The names of a partial's counts, histograms and sums: one builder per kind, so each key is spelled once.

Keys are strings in stored payloads (`kind:name`); these builders are the only place that writes them.
"""

from __future__ import annotations

STAGE_PREFIX = "stage."  # a stage's duration in ms: its sketch key and its column in the joined frame


def status(value: str) -> str:
    """Rows of request status `value` (`ok`, `timeout`, `rejected`, `error`)."""
    return f"status:{value}"


OK, TIMEOUT, REJECTED, ERROR = status("ok"), status("timeout"), status("rejected"), status("error")


def cache_hit(state: str | None = None) -> str:
    """Cache lookups that hit, all of them or those in one warmth `state`."""
    return "cache:hit" if state is None else f"cache:hit:{state}"


def cache_miss(state: str | None = None) -> str:
    """Cache lookups that missed, all of them or those in one warmth `state`."""
    return "cache:miss" if state is None else f"cache:miss:{state}"


VERSIONED_HIT = "cache:versioned_hit"  # hits whose row carries a cache_version
STALE_HITS = "cache:stale"  # hits served from another model or preprocessing version


def missing(field: str) -> str:
    """Rows where `field` is missing."""
    return f"missing:{field}"


def below(field: str) -> str:
    """Rows where numeric `field` is under the reference's minimum."""
    return f"below:{field}"


def above(field: str) -> str:
    """Rows where numeric `field` is over the reference's maximum."""
    return f"above:{field}"


def unseen(field: str) -> str:
    """Rows where categorical `field` holds a category the reference never had."""
    return f"unseen:{field}"


def length(field: str) -> str:
    """Histogram (and latency by bucket) of text `field`'s length."""
    return f"len:{field}"


def score(cls: str) -> str:
    """Histogram of class `cls`'s score."""
    return f"score:{cls}"


def tokens(field: str) -> str:
    """Sum of text `field`'s tokens."""
    return f"tokens:{field}"


def oov(field: str) -> str:
    """Sum of text `field`'s tokens outside the reference vocabulary."""
    return f"oov:{field}"


def oov_texts(field: str) -> str:
    """Texts of `field` with at least one token outside the reference vocabulary."""
    return f"oov_texts:{field}"


def field_of(key: str, kind) -> str | None:
    """The field a key of builder `kind` (e.g. `missing`) names, or None when `key` is of another kind."""
    prefix = kind("")
    return key[len(prefix):] if key.startswith(prefix) else None
