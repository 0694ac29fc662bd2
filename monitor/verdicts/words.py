"""A verdict in words: the one line a person reads first (`summary`) and the next steps its evidence
points at (`next_steps`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from monitor.verdicts.evidence import label_text, length_labelled, ranked, rule_text, show, unit
from monitor.verdicts.families import CONFIRMED_QUALITY, LENGTH_CHECKS

# What to look at when a stage carries most of the latency increase.
STAGE_STEPS = {"batch_wait": "micro-batcher: max wait and max batch size",
               "model": "model: compute per batch (hardware, model size, batch run time)",
               "preprocess": "preprocessing: its version and the features it computes",
               "parse": "parsing: request size and format"}


def next_steps(verdict: str, attribution: dict[str, Any], inputs: list, changed: list[dict[str, Any]],
               rollback: str | None, latency_rose: bool) -> list[str]:
    """Only the steps the evidence points at (what changed is listed beside them, not repeated here): a
    rollback when this model version is new; the cache when its hit rate fell or it served stale results;
    the top stage's own knobs when total latency rose; the queue, memory or batch size when that signal
    rose, speculative decoding when its acceptance moved; the segment a slowdown rests on; input lengths when they shifted; for worse, preprocessing when its version changed or a
    labelled slice got worse, the threshold when the model version changed or a class's recall or
    precision moved; the upstream producer for changed inputs."""
    steps = []
    kinds = {c["kind"] for c in changed}
    if rollback and "model_version" in kinds:
        steps.append(f"consider rolling back to accepted version {rollback}")
    signals = attribution.get("signals", [])
    moved = {str(s["labels"].get("signal")) for s in signals if s["check"] == "service_signal"}
    # Load signals explain a slowdown when they rose: a queue that emptied at night is no saturation.
    rose = {str(s["labels"].get("signal")) for s in signals if s["check"] == "service_signal"
            and s["value"] is not None and s["baseline"] is not None and s["value"] > s["baseline"]}
    if verdict in ("slower", "both"):
        fell = [s for s in signals if s["check"] == "cache_hit_rate" and s["value"] is not None
                and s["baseline"] is not None and s["value"] < s["baseline"]]
        if fell or any(s["check"] == "stale_cache" for s in signals):
            steps.append("cache: hit rate and cache key (did a deploy change the key or flush the cache?)")
        top = next(iter(attribution.get("stages", {})), None) if latency_rose else None
        if top is not None:
            steps.append(STAGE_STEPS.get(top, f"stage {top}: what runs in it and what changed there"))
        if "batch_size" in rose and top != "batch_wait":
            steps.append(STAGE_STEPS["batch_wait"])
        if "queue_depth" in rose:
            steps.append("queue: queue depth and replica count (is the service saturated?)")
        if "memory_mb" in rose:
            steps.append("memory: memory use and swapping / GC pauses on the replicas")
        if any(m.startswith("spec_accept") for m in moved):
            steps.append("speculative decoding: the draft model and its acceptance rate (a draft that stops "
                         "matching the target model makes every decode step slower)")
        segment = attribution.get("segment")
        if segment:
            column = segment.split("=", 1)[0]
            steps.append(f"segment {segment}: what serves its requests differently from the other {column} "
                         "values (model or draft model, route, prompt template, tokenizer)")
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


def summary(verdict: str, estimated: bool, attribution: dict[str, Any], evidence: Sequence[Any],
            changed: list[dict[str, Any]]) -> str:
    """One line a person reads first."""
    segment = attribution.get("segment")
    head = verdict + (" (estimated)" if estimated else "") + (f" for segment {segment}" if segment else "")
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
                   and not length_labelled(e.as_dict()) and e.status == "breach" for e in evidence)
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
        # Beside a segment's own signals, one of all traffic says so.
        against += " (all traffic)" if segment and "segment" not in labels else ""
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
        if e.get("rule"):  # an acceptance rule: its figure against the rule's own number
            rule = e["labels"].get("rule")
            parts.append(f"rule {rule}: {rule_text(e)}" + (f" (n={e['n']:,})" if e.get("n") is not None else ""))
        else:
            parts.append(f"{e['check']} {labels} {show(e['value'], u)}{base} (n={e['n']:,}{held})")
    if changed:
        parts.append(changed[0]["text"])
    return head + (": " + "; ".join(parts) if parts else "")
