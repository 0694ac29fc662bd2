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
from monitor.verdicts.evidence import label_text, named_labels, ranked, show, unit

VERDICTS = ("slower", "worse", "both", "drift", "healthy", "insufficient_data", "no_data")
HARMFUL = ("slower", "worse", "both")

# What each family of finding (checks.catalog) means for the verdict.
SERVICE_CHECKS = names("latency")  # total quantiles and failure / timeout / reject rates
# Serving-efficiency losses that are a service regression by themselves: a cache that stopped hitting (or
# serves another version's results) costs every request its compute, before the latency shows it at load.
SERVING_CHECKS = names("cache")
SIGNAL_CHECKS = names("cache", "signals", "routing", "vocabulary")
CONFIRMED_QUALITY = names("quality", "versions")  # rest on delivered labels
ESTIMATED_QUALITY = names("estimates", "predictions")  # before labels arrive
INPUT_CHECKS = names("completeness", "ranges", "drift", "lengths", "vocabulary")
# Contract-level input changes: when one breaches, a prediction shift is what the new inputs do to the
# model, not evidence of harm by itself.
CONTRACT_INPUT_CHECKS = names("completeness", "ranges")
LENGTH_CHECKS = names("lengths")  # input lengths: they explain a slowdown, or tell it apart from longer inputs
LABEL_CHECKS = names("labels")
QUANTILE_ORDER = ("p95", "p99", "p50")
EVIDENCE_MAX = 8
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

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("share", "needed_n"):
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

    service_hits = [f for f in breach if f["check"] in SERVICE_CHECKS and is_service_regression(f)
                    or f["check"] in SERVING_CHECKS and (f.get("effect") is None or f["effect"] <= 0
                                                         or f["check"] != "cache_hit_rate")]
    slower = bool(service_hits) or bool(rule_breaches)
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
    if slower:
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
    if verdict == "insufficient_data":
        evidence = _insufficient(whole)
    return Verdict(**base, verdict=verdict, estimated=estimated, rows=rows, evidence=tuple(evidence[:EVIDENCE_MAX]),
                   attribution=attribution, what_changed=tuple(changed),
                   next_steps=tuple(_next_steps(verdict, attribution, inputs, changed, rollback, _latency_rose(breach))),
                   rollback_to=rollback, summary=_summary(verdict, estimated, attribution, evidence, changed))


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


def _length_labelled(f: Mapping[str, Any]) -> bool:
    return any(k.startswith("length") for k in (f.get("labels") or {}))


def _attribution(whole: list[Mapping[str, Any]], breach: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Each stage's share of the latency increase at the breaching quantile, the correlated signals,
    and whether latency per input length moved (service slower) or only the length mix did."""
    lat = [f for f in whole if f["check"] == "latency" and "quantile" in (f.get("labels") or {})
           and not _length_labelled(f)]
    totals = {f["labels"]["quantile"]: f for f in lat if f["labels"].get("stage") == "total"}
    breached_q = [q for q in QUANTILE_ORDER if q in totals and totals[q]["status"] == "breach"]
    quantile = (breached_q or [q for q in QUANTILE_ORDER if q in totals] or ["p95"])[0]
    increases = {}
    for f in lat:
        stage = f["labels"].get("stage")
        if stage in (None, "total") or f["labels"]["quantile"] != quantile:
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
    signals = []
    for f in breach:
        if f["check"] in SIGNAL_CHECKS + LENGTH_CHECKS:
            signals.append(_short(f))
    out["signals"] = signals
    out["length"] = _length_adjusted(whole, breach)
    return out


def _length_adjusted(whole: list[Mapping[str, Any]], breach: list[Mapping[str, Any]]) -> str:
    """'service' when latency rose within an input-length bucket, 'inputs' when the lengths shifted and
    latency per length bucket held, 'unknown' without per-length latency, '' when lengths did not shift."""
    shifted = any(f["check"] in LENGTH_CHECKS for f in breach)
    per_length = [f for f in whole if f["check"] == "latency" and _length_labelled(f)
                  and f["status"] in ("ok", "breach")]
    if any(f["status"] == "breach" for f in per_length):
        return "service"
    if not shifted:
        return ""
    return "inputs" if per_length else "unknown"


def _short(f: Mapping[str, Any]) -> dict[str, Any]:
    return {"check": f["check"], "labels": named_labels(f["check"], f.get("labels"), f.get("detail")),
            "value": f.get("value"),
            "baseline": f.get("baseline"), "n": f.get("n")}


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
    `extra`) only for the quality the verdict rests on."""
    order = {"slower": SERVICE_CHECKS + SIGNAL_CHECKS + LENGTH_CHECKS,
             "worse": CONFIRMED_QUALITY + ESTIMATED_QUALITY,
             "both": SERVICE_CHECKS + CONFIRMED_QUALITY + SIGNAL_CHECKS + ESTIMATED_QUALITY + LENGTH_CHECKS,
             "drift": INPUT_CHECKS + names("predictions")}.get(verdict, ())
    shares = attribution.get("stages", {})
    # Per segment: the quality the verdict rests on (a segment's predictions count as estimated harm).
    rests_on = CONFIRMED_QUALITY + (ESTIMATED_QUALITY if verdict in ("worse", "both") else ())
    pool = breach + [f for f in extra if f["check"] in rests_on]

    def rank(f: Mapping[str, Any]) -> tuple:
        labels = f.get("labels") or {}
        family = order.index(f["check"]) if f["check"] in order else len(order)
        headline = 0 if is_service_regression(f) else 1
        share = shares.get(labels.get("stage"), 0.0)
        return (family, headline, f["status"] != "breach", -share, -(f.get("n") or 0))

    out = []
    for f in sorted((f for f in pool if f["check"] in order), key=rank):
        stage = (f.get("labels") or {}).get("stage")
        # `held`: under the floor that opens an episode, not back within its baseline either.
        status = "held" if f["status"] == "ok" else f["status"]
        out.append(Evidence(f["check"], named_labels(f["check"], f.get("labels"), f.get("detail")),
                            f.get("value"), f.get("baseline"),
                            int(f.get("n") or 0), f.get("interval_low"), f.get("interval_high"), status,
                            shares.get(stage) if f["check"] == "latency" and stage != "total" else None))
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


# What to look at when a stage carries most of the latency increase.
STAGE_STEPS = {"batch_wait": "micro-batcher: max wait and max batch size",
               "model": "model: compute per batch (hardware, model size, batch run time)",
               "preprocess": "preprocessing: its version and the features it computes",
               "parse": "parsing: request size and format"}


def _latency_rose(breach: list[Mapping[str, Any]]) -> bool:
    """Whether a total latency quantile breached: only then does a stage's share of the increase point
    somewhere (otherwise it is a share of noise)."""
    return any(f["check"] == "latency" and "quantile" in (f.get("labels") or {}) and is_service_regression(f)
               for f in breach)


def _next_steps(verdict: str, attribution: dict[str, Any], inputs: list, changed: list[dict[str, Any]],
                rollback: str | None, latency_rose: bool) -> list[str]:
    """Only the steps the evidence points at (what changed is listed beside them, not repeated here): a
    rollback when this model version is new; the cache when its hit rate fell or it served stale results;
    the top stage's own knobs when total latency rose; the queue, memory or batch size when that signal
    moved; input lengths when they shifted; for worse, preprocessing when its version changed or a
    labelled slice got worse, the threshold when the model version changed or a class's recall or
    precision moved; the upstream producer for changed inputs."""
    steps = []
    kinds = {c["kind"] for c in changed}
    if rollback and "model_version" in kinds:
        steps.append(f"consider rolling back to accepted version {rollback}")
    signals = attribution.get("signals", [])
    moved = {str(s["labels"].get("signal")) for s in signals if s["check"] == "service_signal"}
    if verdict in ("slower", "both"):
        fell = [s for s in signals if s["check"] == "cache_hit_rate" and s["value"] is not None
                and s["baseline"] is not None and s["value"] < s["baseline"]]
        if fell or any(s["check"] == "stale_cache" for s in signals):
            steps.append("cache: hit rate and cache key (did a deploy change the key or flush the cache?)")
        top = next(iter(attribution.get("stages", {})), None) if latency_rose else None
        if top is not None:
            steps.append(STAGE_STEPS.get(top, f"stage {top}: what runs in it and what changed there"))
        if "batch_size" in moved and top != "batch_wait":
            steps.append(STAGE_STEPS["batch_wait"])
        if "queue_depth" in moved:
            steps.append("queue: queue depth and replica count (is the service saturated?)")
        if "memory_mb" in moved:
            steps.append("memory: memory use and swapping / GC pauses on the replicas")
        if attribution.get("length") == "inputs":
            steps.append("inputs got longer (latency per length bucket held): expect it to follow input length")
        elif attribution.get("length") == "unknown":
            steps.append("input lengths shifted: compare latency per input length before blaming the service")
    if verdict in ("worse", "both"):
        quality = attribution.get("quality", [])
        sliced = any(set(q["labels"]) & {"segment", "group"} for q in quality if q["check"] in CONFIRMED_QUALITY)
        if "preprocess_version" in kinds or sliced:
            steps.append("preprocessing: diff the preprocessing version and its outputs on a few requests"
                         + (" of the affected slice" if sliced else ""))
        if "model_version" in kinds or any(q["check"] in CONFIRMED_QUALITY and q["labels"].get("metric")
                                           in ("recall", "precision") for q in quality):
            steps.append("threshold: did the decision threshold or class mapping change?")
        if any(f["check"] in LENGTH_CHECKS for f in inputs):
            steps.append("truncation: are long text inputs cut before the model?")
    if inputs and verdict != "healthy":
        fields = sorted({str(f["labels"].get("field")) for f in inputs if f["labels"].get("field")})
        steps.append(f"inputs changed{' in ' + ', '.join(fields) if fields else ''}: check the upstream "
                     "producer for new values, units or scale"
                     + ("; quality is not confirmed hurt until labels arrive" if verdict == "drift" else ""))
    return steps


def _summary(verdict: str, estimated: bool, attribution: dict[str, Any], evidence: list[Evidence],
             changed: list[dict[str, Any]]) -> str:
    """One line a person reads first."""
    head = verdict + (" (estimated)" if estimated else "")
    parts = []
    total = attribution.get("total")
    if verdict in ("slower", "both") and total:
        # Without a deadline, timed-out requests that logged no latency are not in it: said so, beside
        # the rate that counts them.
        untimed = total.get("untimed_timeouts")
        what = "latency of the requests that logged one" if untimed else "total latency"
        parts.append(f"{attribution['quantile']} {what} {show(total['value'], 'ms')} vs "
                     f"{show(total['baseline'], 'ms')}"
                     + (f" ({untimed:,} timed-out requests logged none)" if untimed else ""))
    if verdict in ("slower", "both"):
        # The failing share: first when total latency did not breach (the requests that failed are the news).
        rates = [f"{e.labels['rate']} rate {show(e.value, '%')} vs {show(e.baseline, '%')}" for e in evidence
                 if e.check == "latency" and "rate" in e.labels and e.status == "breach"]
        rose = any(e.check == "latency" and e.labels.get("stage") == "total" and "quantile" in e.labels
                   and len(e.labels) == 2 and e.status == "breach" for e in evidence)
        parts = parts + rates if rose else rates + parts
    stages = attribution.get("stages", {})
    if verdict in ("slower", "both") and stages:
        top = next(iter(stages))
        parts.append(f"{stages[top]:.0%} of the increase in stage {top}")
    for s in attribution.get("signals", [])[:2]:
        labels = s["labels"]
        field = str(labels.get("field") or "")
        # A hotspot names its value and what it is compared with: the other values, or an even split.
        what = (f"{field}={labels[field]}" if field in labels else labels.get("signal") or field)
        against = ("" if field not in labels else " (an even split)" if labels.get("measure") == "share"
                   else f" on the other {field}s")
        u = unit(s["check"], labels)
        parts.append(f"{s['check']}{' ' + what if what else ''} {show(s['value'], u)} vs "
                     f"{show(s['baseline'], u)}{against}")
    if verdict == "insufficient_data":
        parts = [f"{e.check} {','.join(f'{k}={v}' for k, v in sorted(e.labels.items()))} n={e.n}"
                 + (f" of {e.needed_n} needed" if e.needed_n else "") for e in evidence[:3]]
    if verdict not in ("slower",) and evidence and not parts:
        # The strongest item, as the messages rank it.
        e = ranked([x.as_dict() for x in evidence], attribution.get("quantile"))[0]
        labels = label_text(e["labels"], ",")
        held = ", held: still shifted from its baseline" if e["status"] == "held" else ""
        u = unit(e["check"], e["labels"])
        base = "" if e["baseline"] is None or u == "PSI" and not e["baseline"] else f" vs {show(e['baseline'], u)}"
        parts.append(f"{e['check']} {labels} {show(e['value'], u)}{base} (n={e['n']:,}{held})")
    if changed:
        parts.append(changed[0]["text"])
    return head + (": " + "; ".join(parts) if parts else "")
