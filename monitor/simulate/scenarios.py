"""The incidents: what each scenario switches on at its onset, and the ground truth it implies."""

from __future__ import annotations

from dataclasses import dataclass, field

SCENARIOS: tuple[str, ...] = (
    "healthy",
    "slower-batching",
    "slower-cache",
    "worse-preprocessing",
    "worse-threshold",
    "both-long-inputs",
    "drift-new-category",
    "missing-fields",
)
# Runs of days rather than hours: generated on their own (at a low rate), not in the per-scenario suites.
LONG_SCENARIOS: tuple[str, ...] = ("healthy-week",)
ALL_SCENARIOS: tuple[str, ...] = SCENARIOS + LONG_SCENARIOS

TRUNCATE_CHARS = 512  # the model reads at most this many characters of `notes`
UNSEEN_CONTRACT = "Three year"
TENURE_BUG_BELOW = 12  # worse-preprocessing: segment whose tenure the buggy preprocessing replaces
TENURE_BUG_FACTOR = 3.0  # ... multiplied by this (a unit bug: months read as quarters)
THRESHOLD_SHIFT = 0.25
MISSING_FIELD = "InternetService"
MISSING_SHARE = 0.2


@dataclass(frozen=True)
class Regime:
    """Serving configuration and input distribution in force during one part of a run."""

    model_version: str = "v1"
    preprocess_version: str = "pp1"
    max_batch: int = 16
    max_wait_ms: float = 4.0
    threshold_shift: float = 0.0
    cache_key_has_version: bool = True
    tenure_bug: bool = False
    long_notes: bool = False
    unseen_contract_share: float = 0.0
    charges_over_range_share: float = 0.0
    missing_share: float = 0.0


@dataclass(frozen=True)
class Event:
    """Something that happens during a run and should not page, `at_hours` after its start.

    kind: "deploy" (the regime switches to `after`: an equivalent version), "cache_restart" (every cached
    entry is lost), "traffic_spike" (arrivals multiplied by `factor` for `hours`)."""

    kind: str
    at_hours: float
    text: str
    hours: float = 0.0
    factor: float = 1.0


@dataclass(frozen=True)
class Incident:
    before: Regime
    after: Regime
    verdict: str
    what_changed: str
    affected: dict = field(default_factory=dict)
    expected_findings: tuple[str, ...] = ()
    labels_after_onset: bool = True
    events: tuple[Event, ...] = ()
    weekly: bool = False  # traffic also follows the week (weekends lower), not only the day


def incident(name: str) -> Incident:
    """The before/after regimes and ground truth of scenario `name`."""
    base = Regime()
    if name == "healthy":
        return Incident(base, base, "healthy", "nothing: no incident in this run", {}, ())
    if name == "slower-batching":
        before = Regime(max_batch=4, max_wait_ms=4.0)
        after = Regime(max_batch=16, max_wait_ms=40.0)
        return Incident(
            before, after, "slower",
            "micro-batcher config changed: max wait 4 ms -> 40 ms, max batch 4 -> 16 (config_hash changes); "
            "batches fill more (fan-out groups now share one batch), so model time per request (its share "
            "of the batch run) is a little lower while batch_wait rises several-fold; quality identical",
            {"stage": "batch_wait", "config": {"max_wait_ms": [4.0, 40.0], "max_batch": [4, 16]}},
            ("latency",))
    if name == "slower-cache":
        return Incident(
            base, Regime(model_version="v2", cache_key_has_version=False), "slower",
            "model v2 deployed (same coefficients as v1) with a new cache key that drops the model version "
            "and hashes the raw request body: most repeated requests now miss (hit rate falls, latency "
            "rises), and byte-identical repeats of requests served by v1 get v1's cached result (stale hits, "
            "cache_version v1) until the entries age out",
            {"stage": "model", "field": "cache_hit", "versions": ["v2"]},
            ("cache_hit_rate", "stale_cache", "latency"))
    if name == "worse-preprocessing":
        return Incident(
            base, Regime(preprocess_version="pp2", tenure_bug=True), "worse",
            f"preprocessing pp2 converts tenure < {TENURE_BUG_BELOW} months as if it were in quarters "
            f"(x{TENURE_BUG_FACTOR:g}) before scoring: short-tenure customers' scores fall and their recall "
            "drops; overall F1 barely moves; latency unchanged (the logged tenure is the raw value)",
            {"segment": {"field": "tenure", "op": "<", "value": TENURE_BUG_BELOW}},
            ("quality", "prediction_drift"))
    if name == "worse-threshold":
        return Incident(
            base, Regime(model_version="v2", threshold_shift=THRESHOLD_SHIFT), "worse",
            f"model v2 ships with its decision threshold shifted up by {THRESHOLD_SHIFT}: fewer 'Yes' "
            "predictions, churn recall drops",
            {"field": "threshold", "versions": ["v2"]},
            ("prediction_drift", "quality"))
    if name == "both-long-inputs":
        return Incident(
            base, Regime(long_notes=True), "both",
            f"long `notes` become frequent: parse, preprocess and model time grow with length (latency "
            "percentiles and timeouts rise; batch_wait only rises when the replicas are loaded); "
            f"notes over {TRUNCATE_CHARS} chars are truncated and the model's score for them is pulled "
            "toward the base rate, which hurts recall for long inputs",
            {"field": "notes", "segment": {"field": "notes_length", "op": ">", "value": TRUNCATE_CHARS}},
            ("length_distribution", "latency", "quality", "prediction_drift"))
    if name == "drift-new-category":
        return Incident(
            base, Regime(unseen_contract_share=0.15, charges_over_range_share=0.1), "drift",
            f"a contract type never seen in training ('{UNSEEN_CONTRACT}') appears in ~15% of requests and "
            "MonthlyCharges exceed the training maximum in ~10%; no labels have arrived since the onset",
            {"field": "Contract", "fields": ["Contract", "MonthlyCharges"], "category": UNSEEN_CONTRACT},
            ("unseen_categories", "out_of_range", "drift", "prediction_drift"), labels_after_onset=False)
    if name == "missing-fields":
        return Incident(
            base, Regime(missing_share=MISSING_SHARE), "drift",
            f"upstream stops sending {MISSING_FIELD} for ~{MISSING_SHARE:.0%} of requests (null in the "
            "logs); the service imputes it from MonthlyCharges, so quality is barely affected",
            {"field": MISSING_FIELD},
            ("missing_rate",))
    if name == "healthy-week":
        return Incident(
            base, Regime(model_version="v2"), "healthy",
            "nothing that should page: seven days of daily and weekly traffic (weekends lower), a deploy of "
            "model v2 with v1's coefficients and threshold, a cache restart (the hit rate dips, then "
            "recovers as the cache refills) and a half-hour traffic spike",
            {}, (), events=HEALTHY_WEEK_EVENTS, weekly=True)
    raise ValueError(f"unknown scenario {name!r}; one of {ALL_SCENARIOS}")


# The start is a Monday 00:00 UTC by default, so these fall on Tuesday 10:00, Wednesday 14:00 and
# Thursday 11:00 -- busy hours, where a false alarm would be most likely.
HEALTHY_WEEK_EVENTS = (
    Event("deploy", 34.0, "model v2 deployed: same coefficients and threshold as v1 (an equivalent version)"),
    Event("cache_restart", 62.0, "the prediction cache restarts empty: hits fall, then recover within its TTL"),
    Event("traffic_spike", 83.0, "traffic x3 for 30 minutes (a client's batch job)", hours=0.5, factor=3.0),
)
