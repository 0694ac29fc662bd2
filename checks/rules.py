"""SLO rules: "p95 total latency <= 100 ms", "timeout rate <= 0.5%", "cache hit rate >= 80%", checked on
merged bucket partials, optionally as a multi-window burn rate.

An objective says which requests are bad: for a latency quantile pXX <= T, a request slower than T (the
budget is 1 - XX%); for a rate <= r, a request counted by the rate (budget r); for a rate >= r, one not
counted (budget 1 - r). Burn rate = bad share / budget: 1 spends the budget exactly over the SLO period.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from ddsketch.mapping import LogarithmicMapping

from checks.contract import Contract, Count, declare
from checks.latency import RATES
from monitor.aggregate import keys
from monitor.aggregate.keys import LATENCY, STAGE_PREFIX
from monitor.aggregate.partial import ALL, Partial, merge_all
from monitor.aggregate.sketch import RELATIVE_ACCURACY, Sketch
from monitor.durations import duration_text

OPS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, "<": operator.lt, ">=": operator.ge,
                                                  ">": operator.gt}
# The rates an objective may name -> (numerator count keys, denominator: 'rows' or 'cache'): the latency
# check's rates, their other spellings, their sum and the cache's.
RULE_RATES = {
    **{name: ((key,), "rows") for name, key in RATES.items()},
    "rejected": ((RATES["reject"],), "rows"),
    "error": ((RATES["failure"],), "rows"),
    "non-ok": (tuple(RATES.values()), "rows"),
    "cache hit": ((keys.cache_hit(),), "cache"),
    "cache miss": ((keys.cache_miss(),), "cache"),
}
_LATENCY = re.compile(r"^\s*(p\d+(?:\.\d+)?|mean)\s+(?:([A-Za-z0-9_.-]+)\s+)?latency\s*(<=|<|>=|>)\s*"
                      r"(\d+(?:\.\d+)?)\s*(ms|s)\s*$", re.I)
_RATE = re.compile(r"^\s*(" + "|".join(sorted(RULE_RATES, key=len, reverse=True)) + r")\s+rate\s*(<=|<|>=|>)\s*"
                   r"(\d+(?:\.\d+)?)\s*(%?)\s*$", re.I)
_MAPPING = LogarithmicMapping(RELATIVE_ACCURACY)
TAIL_SAMPLES = 10  # a quantile q needs TAIL_SAMPLES / (1 - q) values to be measured
MEAN_MIN_N = 30  # values a mean latency needs to be measured


@dataclass(frozen=True)
class RuleThreshold:
    """An SLO rule's sample floor: a rule with fewer requests neither fires nor resolves. Unset, a rate
    needs `min_n` requests, a pXX latency 10 / (1 - XX%) values (200 for p95) and a mean 30."""

    min_n: Count = 100


declare(Contract("slo", "slo", "rule", "ms (latency objectives); share of requests (rates); burn rate (x budget)",
                 "requests", RuleThreshold.min_n, RuleThreshold, "services[].rules[]", doc=
                 "An objective such as 'p95 total latency <= 100 ms' or 'timeout rate <= 0.5%' on the merged "
                 "partials of its window, or its multi-window burn rate; active when it does not hold. Its "
                 "evidence is stored as `slo:<rule name>`."))


@dataclass(frozen=True)
class Objective:
    """A parsed SLO: latency (`quantile` 0..1 or None for the mean, of `stage`, in ms) or a rate (0..1)."""

    text: str
    kind: str  # latency | rate
    op: str
    threshold: float  # ms for latency, share 0..1 for rates
    stage: str = "total"
    quantile: float | None = None
    rate: str = ""

    @property
    def budget(self) -> float | None:
        """The share of requests allowed to be bad; None when the objective has no budget (a mean)."""
        if self.kind == "latency":
            return None if self.quantile is None else 1 - self.quantile
        return self.threshold if self.op in ("<=", "<") else 1 - self.threshold


@dataclass(frozen=True)
class Measure:
    """An objective measured on one stretch of partials: value (ms or share), requests n, bad share."""

    value: float | None
    n: int
    bad_share: float | None
    enough: bool


def parse_objective(text: str) -> Objective:
    """Parse "p95 total latency <= 100 ms", "p99 model latency < 0.2 s", "timeout rate <= 0.5%",
    "cache hit rate >= 80%"; ValueError names what it could not read."""
    m = _LATENCY.match(text)
    if m:
        stat, stage, op, number, unit = m.groups()
        quantile = None
        if stat.lower() != "mean":
            quantile = round(float(stat[1:]) / 100, 9)
            if not 0 < quantile < 1:
                raise ValueError(f"SLO {text!r}: quantile {stat} must be between p0 and p100")
        ms = float(number) * (1000 if unit.lower() == "s" else 1)
        return Objective(text, "latency", op, ms, (stage or "total").lower(), quantile)
    m = _RATE.match(text)
    if m:
        rate, op, number, percent = m.groups()
        share = float(number) / (100 if percent else 1)
        if not 0 <= share <= 1:
            raise ValueError(f"SLO {text!r}: a rate must be between 0 and 1 (or 0% and 100%)")
        return Objective(text, "rate", op, share, rate=rate.lower())
    raise ValueError(f"cannot read SLO {text!r}; write e.g. 'p95 total latency <= 100 ms', "
                     f"'timeout rate <= 0.5%' (rates: {', '.join(RULE_RATES)})")


def measure(objective: Objective, part: Partial, min_n: int | None = None) -> Measure:
    """The objective's value on `part` and the share of bad requests; `enough` when n >= min_n (default:
    see RuleThreshold)."""
    if objective.kind == "latency":
        key = LATENCY if objective.stage == "total" else f"{STAGE_PREFIX}{objective.stage}"
        sketch = part.sketches.get(key, Sketch())
        q = objective.quantile
        value = sketch.mean if q is None else sketch.quantile(q)
        need = min_n or (int(round(TAIL_SAMPLES / (1 - q))) if q is not None else MEAN_MIN_N)
        bad = above(sketch, objective.threshold) / sketch.count if sketch.count else None
        return Measure(value, sketch.count, bad, sketch.count >= need and value is not None)
    numerators, denominator = RULE_RATES[objective.rate]
    n = part.rows if denominator == "rows" else part.counts[keys.cache_hit()] + part.counts[keys.cache_miss()]
    value = sum(part.counts[k] for k in numerators) / n if n else None
    bad = None if value is None else (value if objective.op in ("<=", "<") else 1 - value)
    return Measure(value, n, bad, n >= (min_n or RuleThreshold.min_n) and value is not None)


def above(sketch: Sketch, threshold: float) -> int:
    """Values in `sketch` above `threshold` (> 0), within the sketch's 1% relative accuracy."""
    return sum(c for key, c in sketch.pos.items() if _MAPPING.value(key) > threshold)


def holds(objective: Objective, value: float) -> bool:
    return OPS[objective.op](value, objective.threshold)


@dataclass(frozen=True)
class RuleResult:
    """One rule's evaluation: active (breaching) True / False, or None when there were too few requests."""

    active: bool | None
    value: float | None
    n: int
    window_start: datetime
    window_end: datetime
    burn: dict[str, float]  # "1h" / "5m" -> burn rate, when the rule has burn-rate conditions
    text: str


def evaluate(rule, load: Callable[[datetime, datetime], Partial], end: datetime, window: timedelta) -> RuleResult:
    """Evaluate config rule `rule` (monitor.config.SloRule) on partials `load(start, end)` returns for the
    stretch ending at `end`: the objective on [end - window, end), or its burn-rate conditions."""
    objective = parse_objective(rule.slo)
    window = rule.window or window
    part = load(end - window, end)
    m = measure(objective, part, rule.min_n)
    burn: dict[str, float] = {}
    if rule.burn_rate and objective.budget:
        fired, enough = False, False
        for cond in rule.burn_rate:
            rates = []
            for span in (cond.long, cond.short):
                mm = m if span == window else measure(objective, load(end - span, end), rule.min_n)
                rate = None if mm.bad_share is None else mm.bad_share / objective.budget
                if rate is not None:
                    burn[duration_text(span)] = round(rate, 3)
                rates.append((rate, mm.enough))
            enough = enough or all(e for _, e in rates)
            fired = fired or all(r is not None and e and r >= cond.factor for r, e in rates)
        active = True if fired else (False if enough else None)
        text = f"{rule.slo}: burn rate " + ", ".join(f"{k} {v:g}x" for k, v in burn.items())
    else:
        active = None if not m.enough else not holds(objective, m.value)
        unit = " ms" if objective.kind == "latency" else ""
        shown = "-" if m.value is None else (f"{m.value:.4g}{unit}" if objective.kind == "latency"
                                             else f"{m.value:.2%}")
        text = f"{rule.slo}: {shown} over {duration_text(window)} (n={m.n})"
    return RuleResult(active, m.value, m.n, end - window, end, burn, text)


def partial_loader(store, service: str) -> Callable[[datetime, datetime], Partial]:
    """load(start, end): the merge of every model version's all-rows partials with bucket_start in
    [start, end)."""

    def load(start: datetime, end: datetime) -> Partial:
        with store.transaction() as session:
            rows = store.partials.load(session, service, start, end, segment=ALL)
        return merge_all(Partial.from_bytes(r.payload) for r in rows)

    return load
