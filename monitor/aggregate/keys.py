"""The names of a partial's counts, histograms and sums: one builder per kind, so each key is spelled once.

Keys are strings in stored payloads (`kind:name`); these builders are the only place that writes them.
"""

from __future__ import annotations

STAGE_PREFIX = "stage."  # a stage's duration in ms: its sketch key and its column in the joined frame
ROWS = "rows"  # rows folded
JOINED, UNMATCHED = "joined", "unmatched"  # rows with and without stage timings (a timing source configured)
STAGE_ROWS = "stage_rows"  # stage timing rows joined
PREDICTION = "prediction"  # histogram of the predicted class or value
LATENCY = "latency_ms"  # sketch of the total latency, ms
TTFT = "ttft_ms"  # sketch of the time to first token (generative services), ms
TOKENS_PER_S = "output_tokens_per_s"  # sketch of output_tokens / latency per request
ARRIVAL, COMPLETION = "time:arrival", "time:completion"  # sketches of arrival and ts + latency, epoch s
STALE = "stale:cache_version"  # unseen-style top of the cache_version values of stale hits
SIGNAL_PREFIX = "signal:"
TOKENS = "tokens:"  # sketches `tokens:input`, `tokens:output` (their sums are the token totals)
BY_LENGTH = "latency_by:"  # `latency_by:len:<text field>@<bucket>`, `latency_by:input_tokens@<bucket>`
ROUTE = "route:"  # counts and latency sketches `route:<field>=<value>`
# Counts `cache_us:<hit|miss>:rows` and `cache_us:<hit|miss>:<latency key>`: timed requests per cache outcome
# and their summed time in integer microseconds (integers, so a split merges back exactly). What a miss costs
# over a hit, stage by stage: explain splits a slowdown into "more misses" and "slower requests".
CACHE_TIME = "cache_us:"


def signal(name: str) -> str:
    """Sketch of numeric service signal `name` (`queue_depth`, `batch_size`, ...)."""
    return f"{SIGNAL_PREFIX}{name}"


def token_counts(kind: str) -> str:
    """Sketch of each request's `kind` (`input`, `output`) token count."""
    return f"{TOKENS}{kind}"


def latency_by(source: str, label: str) -> str:
    """Latency sketch of the rows whose `source` (`len:<text field>`, `input_tokens`) is in bucket `label`."""
    return f"{BY_LENGTH}{source}@{label}"


def route(field: str, value: str) -> str:
    """Rows (count) and their latency (sketch) of routing `field` value `value`."""
    return f"{ROUTE}{field}={value}"


def cache_time(outcome: str, name: str) -> str:
    """Timed requests of cache `outcome` (`hit`, `miss`): their count (`name` ROWS) or summed `name` time, us."""
    return f"{CACHE_TIME}{outcome}:{name}"


def status(value: str) -> str:
    """Rows of request status `value` (`ok`, `timeout`, `rejected`, `error`)."""
    return f"status:{value}"


OK, TIMEOUT, REJECTED, ERROR = status("ok"), status("timeout"), status("rejected"), status("error")
# Timed-out rows that logged no latency_ms with no deadline configured: left out of the total latency sketch.
UNTIMED_TIMEOUTS = "untimed:timeout"


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
