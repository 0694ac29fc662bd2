"""The verdict of one model version on one window: slower / worse / both / drift / healthy /
insufficient_data / no_data, from its stored findings, with attribution, what changed and next steps.

`decide` is pure: findings (rows as Store.findings.load returns them), version sightings and the clock
in, a frozen Verdict out. It weighs; the checks measured.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from checks.catalog import names
from monitor.verdicts import words
from monitor.verdicts.evidence import effect, length_labelled, named_labels, rule_of
from monitor.verdicts.families import (  # noqa: F401 (the families are read from here too)
    CONFIRMED_QUALITY,
    CONTRACT_INPUT_CHECKS,
    ESTIMATED_QUALITY,
    INPUT_CHECKS,
    LABEL_CHECKS,
    LENGTH_CHECKS,
    SERVICE_CHECKS,
    SERVING_CHECKS,
    SIGNAL_CHECKS,
)

VERDICTS = ("slower", "worse", "both", "drift", "healthy", "insufficient_data", "no_data")
HARMFUL = ("slower", "worse", "both")

QUANTILE_ORDER = ("p95", "p99", "p50")
EVIDENCE_MAX = 8
# How near its baseline another segment's measure must stay for one segment to carry a slowdown of all
# traffic: a fifth of a quantile's baseline, one point of a rate.
HELD_NEAR = (0.2, 0.01)
CHANGE_LOOKBACK = timedelta(hours=6)  # a version first seen this long before the window may be the trigger


@dataclass(frozen=True)
class Evidence:
    """One finding as evidence: its measure with the baseline, sample size and interval."""

    check: str
    labels: dict[str, Any]
    value: float | None
    baseline: float | None
    n: int
    interval_low: float | None = None
    interval_high: float | None = None
    status: str = "breach"
    share: float | None = None  # the stage's share of the latency increase, 0..1
    needed_n: int | None = None  # an insufficient finding's samples needed to decide, when it says
    rule: dict[str, Any] | None = None  # an acceptance rule's floor and baseline source (evidence.rule_of)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("share", "needed_n", "rule"):
            if out[key] is None:
                del out[key]
        return out


@dataclass(frozen=True)
class Verdict:
    """The verdict of one (service, model version, window) and why; `estimated` when `worse` rests only
    on pre-label estimates or prediction drift."""

    service: str
    model_version: str
    window_start: datetime
    window_end: datetime
    verdict: str
    estimated: bool = False
    rows: int = 0
    evidence: tuple[Evidence, ...] = ()
    attribution: dict[str, Any] = field(default_factory=dict)
    what_changed: tuple[dict[str, Any], ...] = ()
    next_steps: tuple[str, ...] = ()
    rollback_to: str | None = None
    summary: str = ""
    errors: tuple[str, ...] = ()  # checks that failed on this window (they raise an `error` alert)

    def to_row(self) -> dict[str, Any]:
        """The verdict as a row for Store.verdicts.upsert."""
        return {"service": self.service, "model_version": self.model_version, "window_start": self.window_start,
                "window_end": self.window_end, "verdict": self.verdict, "estimated": self.estimated,
                "rows": self.rows, "evidence": [e.as_dict() for e in self.evidence],
                "attribution": self.attribution, "what_changed": list(self.what_changed),
                "next_steps": list(self.next_steps), "rollback_to": self.rollback_to, "summary": self.summary}


def decide(findings: Sequence[Mapping[str, Any]], *, service: str, model_version: str, window_start: datetime,
           window_end: datetime, now: datetime, versions: Sequence[Mapping[str, Any]] = (),
           accepted_versions: Sequence[str] = (), rule_breaches: Sequence[Evidence] = (),
           held: Collection[tuple] = ()) -> Verdict:
    """The verdict of `model_version` on [window_start, window_end) from that window's findings.

    `versions`: first sightings ({kind, value, first_seen}) of the service's versions, for what changed;
    `accepted_versions`: versions known good, for the rollback target; `rule_breaches`: SLO rules that
    breach on this window (they count as a service regression). `now` bounds what changed to the past.
    `held`: the signal_key of each estimated-quality signal an open episode of the version rests on: one
    still shifted from its baseline (still_shifted) counts as a breach, under the floor that opens one.
    """
    own = [f for f in findings if f.get("model_version", model_version) == model_version
           and _at(f, "window_start", window_start) and _at(f, "window_end", window_end)]
    errors = tuple(sorted({f"{f['check']}: {f['detail']['error']}" for f in own
                           if isinstance(f.get("detail"), dict) and f["detail"].get("error")}))
    base = dict(service=service, model_version=model_version, window_start=window_start, window_end=window_end,
                errors=errors)
    rows = _rows(own)
    if not own or rows == 0:
        return Verdict(**base, verdict="no_data", summary="no predictions were logged in this window",
                       next_steps=("check that the service is logging predictions and that the log shipper "
                                   "and tailwatch's sources point at the same place",))
    whole = [f for f in own if "segment" not in (f.get("labels") or {})]
    breach = [f for f in whole if f["status"] == "breach"]
    seg_breach = [f for f in own if f["status"] == "breach" and "segment" in (f.get("labels") or {})]

    service_hits = [f for f in breach if _service_hit(f)]
    # A segment's own regression is the service's: one language's decode twice as slow moves the all-traffic
    # quantiles too little to breach, and its requests are served that slowly all the same.
    segment = _slow_segment([f for f in seg_breach if _service_hit(f)], own, alone=not service_hits)
    slower = bool(service_hits) or segment is not None or bool(rule_breaches)
    confirmed = [f for f in breach + seg_breach if f["check"] in CONFIRMED_QUALITY and not _estimated(f)]
    contract_inputs = [f for f in breach if f["check"] in CONTRACT_INPUT_CHECKS]
    estimates = [f for f in breach if f["check"] == "quality_estimate" or _estimated(f)
                 and f["check"] in CONFIRMED_QUALITY]
    compared = [f for f in whole if _compared_estimate(f)]
    estimate_ok = bool(compared) and all(_estimate_held(f) for f in compared)
    # A segment's predictions moving against its own held history count too: a preprocessing bug that hits
    # one segment (short tenures) moves the mix too little to breach on all traffic.
    pred_drift = [f for f in breach + seg_breach if f["check"] == "prediction_drift"]
    # An open episode holds until its signals are back: a shift still beyond noise against the same
    # baseline is the same fault, though at low traffic its size wanders under the floor that opened it.
    holding = [f for f in own if f["status"] == "ok" and signal_key(f) in held and still_shifted(f)]
    # Prediction drift is estimated harm unless the inputs changed at the contract level (the new inputs
    # explain it) or a pre-label estimate says quality held.
    if pred_drift + holding and not contract_inputs and not estimate_ok:
        estimates += pred_drift + holding
    worse = bool(confirmed) or bool(estimates)
    inputs = [f for f in breach if f["check"] in INPUT_CHECKS]
    if not worse:
        inputs += pred_drift  # explained by the inputs: part of the drift, not harm

    if slower and worse:
        verdict = "both"
    elif slower:
        verdict = "slower"
    elif worse:
        verdict = "worse"
    elif inputs:
        verdict = "drift"
    elif any(f["status"] == "ok" for f in whole):
        verdict = "healthy"
    else:
        verdict = "insufficient_data"
    estimated = worse and not confirmed

    attribution: dict[str, Any] = {}
    if segment is not None:
        # The segment's own figures tell its story (its stages, its signals); the signals of all traffic
        # follow them, as what the whole service did beside it.
        mine = [f for f in own if (f.get("labels") or {}).get("segment") == segment]
        attribution = _attribution(mine, [f for f in seg_breach if f in mine])
        attribution["segment"] = segment
        attribution["signals"] += _attribution(whole, breach)["signals"]
    elif slower:
        attribution = _attribution(whole, breach)
    if worse:
        attribution["quality"] = [_short(f) for f in (confirmed or estimates)[:EVIDENCE_MAX]]
    if inputs and verdict != "healthy":
        attribution["inputs"] = [_short(f) for f in inputs[:EVIDENCE_MAX]]

    changed = _what_changed(versions, model_version, window_start, window_end, now) if verdict != "healthy" else []
    rollback = None
    if verdict in HARMFUL and model_version not in accepted_versions:
        rollback = _rollback(versions, accepted_versions, model_version)
    evidence = list(rule_breaches) + _evidence(verdict, breach, seg_breach + holding, attribution)
    rose = _latency_rose(breach + [f for f in seg_breach if (f.get("labels") or {}).get("segment") == segment])
    if verdict == "insufficient_data":
        evidence = _insufficient(whole)
    return Verdict(**base, verdict=verdict, estimated=estimated, rows=rows, evidence=tuple(evidence[:EVIDENCE_MAX]),
                   attribution=attribution, what_changed=tuple(changed),
                   next_steps=tuple(words.next_steps(verdict, attribution, inputs, changed, rollback, rose)),
                   rollback_to=rollback, summary=words.summary(verdict, estimated, attribution, evidence, changed))


def signal_key(f: Mapping[str, Any]) -> tuple:
    """What names one signal across windows: its check and labels."""
    return f["check"], tuple(sorted((f.get("labels") or {}).items()))


def still_shifted(f: Mapping[str, Any]) -> bool:
    """Whether a prediction drift finding is still off its baseline beyond noise: significant and above its
    learned band, whatever its size (detail `shifted`)."""
    detail = f.get("detail")
    return f["check"] == "prediction_drift" and isinstance(detail, dict) and bool(detail.get("shifted"))


def episode_signals(evidence: Sequence[Mapping[str, Any]]) -> set[tuple]:
    """The estimated-quality signals a harmful verdict's evidence rests on (breaching or held): what the
    episode it belongs to holds on in the windows after it."""
    return {signal_key(e) for e in evidence
            if e["check"] == "prediction_drift" and e.get("status") in ("breach", "held")}


def _at(f: Mapping[str, Any], key: str, value: datetime) -> bool:
    return key not in f or f[key] == value


def _rows(findings: Sequence[Mapping[str, Any]]) -> int:
    """Requests in the window: the n of the latency rate findings (every row counts there)."""
    rates = [f["n"] for f in findings if f["check"] == "latency" and "rate" in (f.get("labels") or {})
             and "segment" not in f["labels"]]
    return max(rates) if rates else max((int(f.get("n") or 0) for f in findings), default=0)


def _compared_estimate(f: Mapping[str, Any]) -> bool:
    """A decided pre-label estimate with the reference's value to compare with (one without says nothing
    either way)."""
    return f["check"] == "quality_estimate" and f["status"] == "ok" and f.get("baseline") is not None


def _estimate_held(f: Mapping[str, Any]) -> bool:
    """A compared estimate that says quality held: the reference's value within reach of its interval."""
    high = f.get("interval_high") if f.get("interval_high") is not None else f.get("value")
    return high is not None and float(high) >= float(f["baseline"])


def _estimated(f: Mapping[str, Any]) -> bool:
    return isinstance(f.get("detail"), dict) and bool(f["detail"].get("estimated"))


def is_service_regression(f: Mapping[str, Any]) -> bool:
    """A total latency quantile or a failure / timeout / reject rate (not one stage alone, not a length
    bucket: those explain a regression, they are not one by themselves)."""
    labels = f.get("labels") or {}
    if any(k.startswith("length") for k in labels):
        return False
    return labels.get("stage") == "total" or "rate" in labels


def _service_hit(f: Mapping[str, Any]) -> bool:
    """A breaching finding that is a service regression by itself: a total latency quantile or a failure
    rate (is_service_regression), a cache that stopped hitting or serves stale results."""
    return (f["check"] in SERVICE_CHECKS and is_service_regression(f)
            or f["check"] in SERVING_CHECKS and (f.get("effect") is None or f["effect"] <= 0
                                                 or f["check"] != "cache_hit_rate"))


def _slow_segment(hits: list[Mapping[str, Any]], own: Sequence[Mapping[str, Any]], alone: bool) -> str | None:
    """The segment (`lang=de`) whose service regression is the strongest on the common effect scale (ties:
    the most requests), of those that regressed while another value of the same column held; None when
    none did. Every value of a column regressing is all traffic, not one part of it. When all traffic held
    (`alone`), every other value of the column whose same measure was decided must have held near its
    baseline (HELD_NEAR). When all traffic regressed too, a segment is named only when it is the one value
    of its column that did and every other value's same measure held near its baseline: several slower
    segments are a slower service, and one too small to breach says nothing of the sort."""
    values: dict[str, set[str]] = {}
    for f in own:
        seg = str((f.get("labels") or {}).get("segment") or "")
        if seg and f["check"] == "latency" and f["status"] in ("ok", "breach"):
            values.setdefault(seg.split("=", 1)[0], set()).add(seg)
    slow = {str(f["labels"]["segment"]) for f in hits}

    def column(f: Mapping[str, Any]) -> str:
        return str(f["labels"]["segment"]).split("=", 1)[0]

    def measure(f: Mapping[str, Any]) -> tuple:
        return f["check"], tuple(sorted((k, str(v)) for k, v in (f.get("labels") or {}).items() if k != "segment"))

    def near(f: Mapping[str, Any]) -> bool:
        v, b = f.get("value"), f.get("baseline")
        if f["status"] != "ok" or v is None or b is None:
            return False
        return float(v) - float(b) <= (HELD_NEAR[1] if "rate" in f["labels"] else HELD_NEAR[0] * abs(float(b)))

    def others_held(f: Mapping[str, Any], every: bool) -> bool:
        others = values.get(column(f), set()) - {f["labels"]["segment"]}
        same = {str(o["labels"]["segment"]): o for o in own if (o.get("labels") or {}).get("segment") in others
                and measure(o) == measure(f)}
        if every:
            return bool(others) and set(same) == others and all(near(o) for o in same.values())
        # Alone, a value too small to decide says nothing either way, but one that moved as far without
        # breaching (a client's burst of rejects spread over every contract type) says the whole column
        # moved: one segment breaching first is only the least widened by the clump.
        decided = [o for o in same.values() if o["status"] in ("ok", "breach")]
        return bool(decided) and all(near(o) for o in decided)

    kept = [f for f in hits if values.get(column(f), set()) - slow
            and (alone and others_held(f, every=False)
                 or len({s for s in slow if s.split("=", 1)[0] == column(f)}) == 1 and others_held(f, every=True))]
    if not kept:
        return None
    best = max(kept, key=lambda f: (effect(f) or 0.0, int(f.get("n") or 0)))
    return str(best["labels"]["segment"])


def _attribution(whole: list[Mapping[str, Any]], breach: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Each stage's share of the latency increase at the breaching quantile, the correlated signals,
    and whether latency per input length moved (service slower) or only the length mix did."""
    lat = [f for f in whole if f["check"] == "latency" and "quantile" in (f.get("labels") or {})
           and not length_labelled(f)]
    totals = {f["labels"]["quantile"]: f for f in lat if f["labels"].get("stage") == "total"}
    breached_q = [q for q in QUANTILE_ORDER if q in totals and totals[q]["status"] == "breach"]
    quantile = (breached_q or [q for q in QUANTILE_ORDER if q in totals] or ["p95"])[0]
    increases = {}
    for f in lat:
        stage = f["labels"].get("stage")
        # Time to first token overlaps the stages it spans (queue, prefill): no share of its own.
        if stage in (None, "total", "ttft") or f["labels"]["quantile"] != quantile:
            continue
        if f["value"] is not None and f["baseline"] is not None:
            increases[stage] = max(float(f["value"]) - float(f["baseline"]), 0.0)
    total_up = sum(increases.values())
    # Quantiles do not add up across stages; the shares say where the increase sits, not an exact split.
    stages = {s: round(v / total_up, 3) for s, v in sorted(increases.items(), key=lambda kv: -kv[1])
              if total_up > 0 and v > 0}
    total = totals.get(quantile)
    # Stored JSON sorts keys: `top_stage` keeps which stage carries most of the increase.
    out: dict[str, Any] = {"quantile": quantile, "stages": stages, "top_stage": next(iter(stages), None)}
    if total is not None:
        out["total"] = {"value": total["value"], "baseline": total["baseline"], "n": total["n"]}
        untimed = (total.get("detail") or {}).get("untimed_timeouts")
        if untimed:
            out["total"]["untimed_timeouts"] = untimed
    # Strongest first (the common effect scale): the summary names the first two.
    moved = sorted((f for f in breach if f["check"] in SIGNAL_CHECKS + LENGTH_CHECKS),
                   key=lambda f: -(effect(f) or 0.0))
    out["signals"] = [_short(f) for f in moved]
    out["length"] = _length_adjusted(whole, breach)
    return out


def _length_adjusted(whole: list[Mapping[str, Any]], breach: list[Mapping[str, Any]]) -> str:
    """'service' when latency rose within an input-length bucket, 'inputs' when the lengths shifted and
    latency per length bucket held, 'unknown' without per-length latency, '' when lengths did not shift."""
    shifted = any(f["check"] in LENGTH_CHECKS for f in breach)
    per_length = [f for f in whole if f["check"] == "latency" and length_labelled(f)
                  and f["status"] in ("ok", "breach")]
    if any(f["status"] == "breach" for f in per_length):
        return "service"
    if not shifted:
        return ""
    return "inputs" if per_length else "unknown"


def _short(f: Mapping[str, Any]) -> dict[str, Any]:
    out = {"check": f["check"], "labels": named_labels(f["check"], f.get("labels"), f.get("detail")),
           "value": f.get("value"), "baseline": f.get("baseline"), "n": f.get("n")}
    rule = rule_of(f)
    return out if rule is None else {**out, "rule": rule}


def _what_changed(versions: Sequence[Mapping[str, Any]], model_version: str, start: datetime, end: datetime,
                  now: datetime) -> list[dict[str, Any]]:
    """Versions first seen within CHANGE_LOOKBACK before the window's end (and not the very first version
    of their kind: the service's first deploy is not a change), newest first."""
    firsts: dict[str, datetime] = {}
    for v in versions:
        firsts[v["kind"]] = min(firsts.get(v["kind"], v["first_seen"]), v["first_seen"])
    out = []
    for v in versions:
        seen = v["first_seen"]
        if seen == firsts[v["kind"]] or seen > min(end, now) or seen < start - CHANGE_LOOKBACK:
            continue
        if v["kind"] == "model_version" and v["value"] != model_version:
            continue  # another version's deploy does not explain this one's window
        out.append({"kind": v["kind"], "value": v["value"], "first_seen": seen.isoformat(),
                    "text": f"{v['kind']} {v['value']} first seen {seen:%Y-%m-%d %H:%M} UTC"})
    return sorted(out, key=lambda c: c["first_seen"], reverse=True)


def _rollback(versions: Sequence[Mapping[str, Any]], accepted: Sequence[str], model_version: str) -> str | None:
    """The newest accepted model version seen before `model_version` (or any accepted one when neither
    was seen): where to roll back to."""
    seen = {v["value"]: v["first_seen"] for v in versions if v["kind"] == "model_version"}
    mine = seen.get(model_version)
    older = [a for a in accepted if a != model_version and a in seen and (mine is None or seen[a] < mine)]
    if older:
        return max(older, key=lambda a: seen[a])
    others = [a for a in accepted if a != model_version]
    return others[-1] if others and mine is None else None


def _evidence(verdict: str, breach: list[Mapping[str, Any]], extra: list[Mapping[str, Any]],
              attribution: dict[str, Any]) -> list[Evidence]:
    """The breaching findings that make the verdict, most telling first: the service regression, then
    stages by share, signals, quality, inputs; per-segment findings (and those an episode holds on,
    `extra`) for the quality the verdict rests on, and every breach of the segment a slowdown rests on
    (attribution `segment`), which leads."""
    order = {"slower": SERVICE_CHECKS + SIGNAL_CHECKS + LENGTH_CHECKS,
             "worse": CONFIRMED_QUALITY + ESTIMATED_QUALITY,
             "both": SERVICE_CHECKS + CONFIRMED_QUALITY + SIGNAL_CHECKS + ESTIMATED_QUALITY + LENGTH_CHECKS,
             "drift": INPUT_CHECKS + names("predictions")}.get(verdict, ())
    shares = attribution.get("stages", {})
    # Per segment: the quality the verdict rests on (a segment's predictions count as estimated harm).
    rests_on = CONFIRMED_QUALITY + (ESTIMATED_QUALITY if verdict in ("worse", "both") else ())
    segment = attribution.get("segment")
    pool = breach + [f for f in extra if f["check"] in rests_on
                     or segment is not None and f["status"] == "breach"
                     and (f.get("labels") or {}).get("segment") == segment]

    def rank(f: Mapping[str, Any]) -> tuple:
        labels = f.get("labels") or {}
        family = order.index(f["check"]) if f["check"] in order else len(order)
        headline = 0 if is_service_regression(f) else 1
        # The stage shares are the named segment's when there is one: they rank its stages only.
        share = shares.get(labels.get("stage"), 0.0) if labels.get("segment") == segment else 0.0
        # Signals by their size (the strongest is what the summary and the messages name); latency by n.
        size = 0.0 if f["check"] in SERVICE_CHECKS else -(effect(f) or 0.0)
        return (segment is not None and labels.get("segment") != segment, family, headline,
                f["status"] != "breach", -share, size, -(f.get("n") or 0))

    out = []
    for f in sorted((f for f in pool if f["check"] in order), key=rank):
        labels = f.get("labels") or {}
        stage = labels.get("stage")
        # `held`: under the floor that opens an episode, not back within its baseline either.
        status = "held" if f["status"] == "ok" else f["status"]
        share = (shares.get(stage) if f["check"] == "latency" and stage != "total"
                 and labels.get("segment") == segment else None)
        out.append(Evidence(f["check"], named_labels(f["check"], labels, f.get("detail")),
                            f.get("value"), f.get("baseline"),
                            int(f.get("n") or 0), f.get("interval_low"), f.get("interval_high"), status,
                            share, rule=rule_of(f)))
    return out


def _insufficient(whole: list[Mapping[str, Any]]) -> list[Evidence]:
    """The findings that could not decide, those that say how many samples they need first."""
    def needed(f: Mapping[str, Any]) -> int | None:
        detail = f.get("detail")
        return detail.get("needed_n") if isinstance(detail, dict) else None

    pool = sorted((f for f in whole if f["status"] == "insufficient"),
                  key=lambda f: (needed(f) is None, f["check"], sorted((f.get("labels") or {}).items())))
    return [Evidence(f["check"], dict(f.get("labels") or {}), f.get("value"), f.get("baseline"), int(f.get("n") or 0),
                     f.get("interval_low"), f.get("interval_high"), f["status"], needed_n=needed(f))
            for f in pool]


def _latency_rose(breach: list[Mapping[str, Any]]) -> bool:
    """Whether a total latency quantile breached: only then does a stage's share of the increase point
    somewhere (otherwise it is a share of noise)."""
    return any(f["check"] == "latency" and "quantile" in (f.get("labels") or {}) and is_service_regression(f)
               for f in breach)
