"""Evidence as people read it: each value with its unit, and a verdict's evidence ranked by effect size
across check families. Slack, the Alertmanager annotation and `tailwatch explain` all rank with `ranked`
and word each item with `parts`, so the three say the same thing in the same order.

Effect sizes are put on one scale, about Cohen's h (0.2 small, 0.5 medium, 0.8 large): shares by Cohen's h,
PSI by its square root (which is h for a small shift of a two-valued mix), magnitudes (ms, a signal's mean,
a rate per second) by the absolute log of their ratio (1.5x is 0.41, 2x is 0.69). An effect measured on a
slice of the traffic (a segment, a group, an input-length bucket) counts by the share of requests it covers,
so a new category on 28% of traffic outranks the latency of one length bucket.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from checks.catalog import REGISTRY
from checks.quality import FEEDBACK_MEAN

# Checks whose value is a share of something, 0..1 (shown in %).
SHARES = ("cache_hit_rate", "stale_cache", "missing_rate", "out_of_range", "unseen_categories", "oov_rate",
          "label_coverage", "label_bias")
PSI = ("drift", "prediction_drift", "length_distribution")
QUALITY = ("quality", "quality_estimate", "acceptance")
# The units of the service signals whose meaning the contract fixes; a user's own signal has none known.
SIGNAL_UNITS = {"batch_size": "requests", "queue_depth": "requests", "memory_mb": "MB", "spec_accept_rate": "%"}
# Labels that name a slice of the traffic: an effect there counts by the share of requests the slice holds.
SLICES = ("segment", "group", "bucket")
# Labels that say which quantile: one line per measure, at the verdict's quantile (else the strongest).
QUANTILE = "quantile"
RULE = "acceptance"  # the check of the acceptance rules: worded against the rule's own number (rule_text)
# Checks that name one value of their field (`detail.value`): a hotspot's busiest route, expert or replica.
NAMED_VALUE = ("hotspot",)


def named_labels(check: str, labels: Mapping[str, Any] | None, detail: Any = None) -> dict[str, Any]:
    """A finding's labels as evidence: those of a check that names one value of its field carry it under
    the field's own name (`field=replica` gains `replica=api-2`), so every reader names the value."""
    out = dict(labels or {})
    field = out.get("field")
    if check in NAMED_VALUE and field and isinstance(detail, Mapping) and detail.get("value") is not None:
        out[str(field)] = str(detail["value"])
    return out


def named_values(items: Iterable[Mapping[str, Any]]) -> list[str]:
    """The values the items of NAMED_VALUE checks name (`replica=api-2`), in order of the items, each once."""
    out: list[str] = []
    for item in items:
        labels = item.get("labels") or {}
        field = str(labels.get("field") or "")
        if item.get("check") in NAMED_VALUE and field in labels and f"{field}={labels[field]}" not in out:
            out.append(f"{field}={labels[field]}")
    return out


def length_labelled(f: Mapping[str, Any]) -> bool:
    """Whether a finding is measured on one input-length bucket (labels `length`, `length_*`)."""
    return any(str(k).startswith("length") for k in (f.get("labels") or {}))


def rule_of(f: Mapping[str, Any]) -> dict[str, Any] | None:
    """What an acceptance rule's words need beyond value and baseline: its `floor` (the rule's `min`, or
    the baseline less `max_drop`), `min`, `max_drop` and where the baseline came from (`baseline_from`),
    from a finding's detail or an evidence item's `rule`; None for any other check."""
    if f.get("check") != RULE:
        return None
    if isinstance(f.get("rule"), Mapping):
        return dict(f["rule"])
    detail = f.get("detail") if isinstance(f.get("detail"), Mapping) else {}
    out = {k: detail.get(k) for k in ("floor", "min", "max_drop", "baseline_from")}
    return {k: v for k, v in out.items() if v is not None}


def rule_text(e: Mapping[str, Any]) -> str:
    """An acceptance rule's figure against the rule's own number, the baseline's figure beside it:
    `recall 0.286 vs floor 0.60 (v1 0.789)` for `min: 0.6`, `recall 0.70 vs floor 0.739 (v1 0.789 - 0.05)`
    for `max_drop: 0.05`, `recall 0.01 vs no floor (v1 0.03 - 0.05 < 0)` where the drop passes the bottom
    of a 0..1 figure (a `feedback_mean`, on the user's own scale, keeps its floor). One n per rule goes
    beside it (`parts`). Every reader words a rule with this (evidence lines, Slack, `explain`, the web
    pages)."""
    value, against = _rule_parts(e)
    return f"{value} vs {against}" if against else value


def _rule_parts(e: Mapping[str, Any]) -> tuple[str, str]:
    """The figure (`recall 0.286`) and what it is held against (`floor 0.60 (v1 0.789)`) of a rule."""
    labels = e.get("labels") or {}
    rule = rule_of(e) or {}
    u = unit(RULE, labels)
    value = f"{labels.get('metric') or 'figure'} {show(e.get('value'), u)}".strip()
    base, floor = e.get("baseline"), rule.get("floor")
    name, _, how = str(rule.get("baseline_from") or "baseline").removeprefix("version ").partition(", ")
    beside, since = "", f", {how}" if how else ""
    if base is not None:
        drop = rule.get("max_drop") if rule.get("min") is None else None
        beside = f"{name} {show(base, u)}" + (f" - {_own(drop)}" if drop is not None else "")
    if floor is None:
        return value, (beside + since) if beside else ""
    if rule.get("min") is None and float(floor) < 0 and labels.get("metric") != FEEDBACK_MEAN:
        # A drop past the bottom of a 0..1 figure: no figure can fall below it, so the rule holds no floor.
        return value, f"no floor ({beside} < 0{since})" if beside else "no floor"
    beside += since if beside else ""
    own = _own(floor) if rule.get("min") is not None else show(floor, u)
    return value, f"floor {own}" + (f" ({beside})" if beside else "")


def _own(number: Any) -> str:
    """A number the user wrote in a rule, as written: 0.6 reads 0.60, 0.725 reads 0.725."""
    v = float(number)
    return f"{v:.2f}" if abs(v - round(v, 2)) < 1e-12 else _digits(v)


def label_text(labels: Mapping[str, Any], sep: str = " ") -> str:
    """Labels as `key=value`, sorted by key; `field=F` left out where the labels name F's value (`F=v`)."""
    shown = {k: v for k, v in labels.items() if not (k == "field" and str(v) in labels)}
    return sep.join(f"{k}={v}" for k, v in sorted(shown.items(), key=lambda kv: str(kv[0])))


def unit(check: str, labels: Mapping[str, Any]) -> str:
    """The unit of a finding's value: ms, %, PSI, nats, pp (a difference of shares), x (a ratio), a rate per
    second, a signal's unit, or '' (a metric's own 0..1 figure, a signal without a known unit)."""
    if check.startswith("slo:"):
        return "ms" if "latency" in str(labels.get("slo", "")) else "%"
    if check in SHARES:
        return "%"
    if check in PSI:
        return "PSI"
    if check in QUALITY:
        return "nats" if labels.get("metric") == "log_loss" else ""
    if check == "version_compare":
        return "pp"
    if check == "service_signal":
        return SIGNAL_UNITS.get(str(labels.get("signal")), "")
    if check == "hotspot":
        return "ms" if labels.get("measure") == "latency" else "%"
    if check == "latency":
        if "rate" in labels:
            return "%"
        if "throughput" in labels:
            return f"{str(labels['throughput']).replace('_', ' ')}/s"
        if "tokens_per_s" in labels:
            return "tokens/s"
        if "queue" in labels:
            return "x"
        return "ms"
    return ""


def show(value: Any, unit_: str) -> str:
    """`value` in `unit_`: 3 significant digits (whole from 1,000, thousands separated), shares and differences
    of shares as percent, PSI named before its value; '-' for no value."""
    if value is None or isinstance(value, float) and math.isnan(value):
        return "-"
    prefix, number, suffix = _form(unit_)
    return f"{prefix}{number(float(value))}{suffix}"


def _form(unit_: str) -> tuple[str, Callable[[float], str], str]:
    """How a value in `unit_` is written: what comes before the number, the number, what comes after."""
    if unit_ == "%":
        return "", lambda v: _digits(100 * v), "%"
    if unit_ == "pp":
        return "", lambda v: f"{100 * v:+.3g}", " pp"
    if unit_ == "PSI":
        return "PSI ", _digits, ""
    if unit_ == "x":
        return "", _digits, "x"
    return "", _digits, f" {unit_}" if unit_ else ""


def _digits(v: float) -> str:
    """Never in scientific notation: 1,110 ms, not 1.11e+03; 0.00003, not 3e-05."""
    if abs(v) >= 1e3:
        return f"{v:,.0f}"
    if v == 0 or abs(v) >= 0.001:
        return f"{v:.3g}"
    decimals = 1 - math.floor(math.log10(abs(v)))  # two significant digits
    return f"{v:.{decimals}f}".rstrip("0")


def parts(e: Mapping[str, Any]) -> dict[str, str]:
    """The words of one evidence item, raw (escape before markup): its value and baseline with their unit,
    the change (a ratio for magnitudes, points for shares), n with what it counts, the 95% interval."""
    check, labels = str(e.get("check")), dict(e.get("labels") or {})
    u = unit(check, labels)
    value, base = e.get("value"), e.get("baseline")
    change = ""
    rule = _rule_parts(e) if check == RULE else None
    if rule is not None:
        labels.pop("metric", None)  # the figure names its metric
    elif value is not None and base is not None:
        if u == "%":
            change = f"{100 * (float(value) - float(base)):+.3g} pp"
        elif u not in ("PSI", "pp", "x", "%", "") and float(base) > 0 and float(value) >= 0:
            change = f"{float(value) / float(base):.2g}x"
    low, high = e.get("interval_low"), e.get("interval_high")
    contract = REGISTRY.get("slo" if check.startswith("slo:") else check)
    n = e.get("n")
    return {"check": check,
            "labels": label_text(labels),
            # A PSI is measured against the reference already: its baseline of 0 says nothing.
            "value": rule[0] if rule else show(value, u),
            "baseline": rule[1] if rule else "" if base is None or u == "PSI" and not base else show(base, u),
            "change": change,
            "n": "" if n is None else f"n={int(n):,}" + (f" {contract.n_of}" if contract is not None else ""),
            "interval": "" if low is None or high is None else f"95% CI {_range(low, high, u)}"}


def _range(low: Any, high: Any, unit_: str) -> str:
    """An interval with its unit once: `44.7–45.6 ms`, `13.3–16.6%`, `PSI 0.987–1.26`."""
    prefix, number, suffix = _form(unit_)
    return f"{prefix}{number(float(low))}–{number(float(high))}{suffix}"


def text(e: Mapping[str, Any]) -> str:
    """One evidence item as plain text: check and labels, value vs baseline (change), n and interval."""
    p = parts(e)
    line = f"{p['check']} {p['labels']}".strip() + f": {p['value']}"
    if p["baseline"]:
        line += f" vs {p['baseline']}"
    detail = [x for x in (p["change"], p["n"], p["interval"]) if x]
    return line + (f" ({', '.join(detail)})" if detail else "")


def effect(e: Mapping[str, Any], whole_n: float | None = None) -> float | None:
    """The effect size of one evidence item on the common scale (module docstring), counted by the share
    of `whole_n` requests its slice holds; None when value or baseline is missing. SLO rules (the user's
    own objective) rank first: infinite."""
    check, labels = str(e.get("check")), e.get("labels") or {}
    if check.startswith("slo:"):
        return math.inf
    value, base = e.get("value"), e.get("baseline")
    if value is None or (base is None and check != "label_bias"):
        return None
    v, b = float(value), float(base or 0.0)
    u = unit(check, labels)
    if u == "%" or (check in QUALITY and u == ""):
        size = abs(_h(v) - _h(b))
    elif u == "PSI":
        size = abs(math.sqrt(max(v, 0.0)) - math.sqrt(max(b, 0.0)))
    elif u == "pp":
        size = 2 * abs(v)
    elif v > 0 and b > 0:
        size = abs(math.log(v / b))
    else:
        size = abs(v - b) / abs(b) if b else None
    if size is None:
        return None
    if whole_n and any(k in labels for k in SLICES) and e.get("n") is not None:
        size *= min(float(e["n"]) / whole_n, 1.0)
    return size


def _h(p: float) -> float:
    return 2 * math.asin(math.sqrt(min(max(p, 0.0), 1.0)))


def ranked(items: Iterable[Mapping[str, Any]], quantile: str | None = None,
           rows: int | None = None, segment: str | None = None) -> list[dict[str, Any]]:
    """Evidence items strongest first: each check and labels once (the first item wins, later ones fill
    its missing keys), one quantile per measure (`quantile`, the verdict's, else the strongest), ranked by
    `effect` with slices counted against `rows` requests (else the largest n of the same check outside a
    slice); items without an effect last, in their given order. `segment`: the segment the verdict rests
    on (attribution `segment`): its items lead at their own size, being what the verdict is about, ahead
    of the signals of all traffic (which move with the day's load against a trailing baseline)."""
    merged: dict[tuple, dict[str, Any]] = {}
    for e in items:
        key = (e.get("check"), tuple(sorted((str(k), str(v)) for k, v in (e.get("labels") or {}).items())))
        if key in merged:
            merged[key].update({k: v for k, v in e.items() if merged[key].get(k) is None})
        else:
            merged[key] = dict(e)
    whole: dict[str, float] = {}
    for e in merged.values():
        if not any(k in (e.get("labels") or {}) for k in SLICES):
            whole[e["check"]] = max(whole.get(e["check"], 0.0), float(e.get("n") or 0))
    def mine(e: Mapping[str, Any]) -> bool:
        return segment is not None and (e.get("labels") or {}).get("segment") == segment

    sized = [(effect(e, None if mine(e) else whole.get(e["check"]) or rows), i, e)
             for i, e in enumerate(merged.values())]
    best: dict[tuple, tuple] = {}
    for size, i, e in sized:
        labels = e.get("labels") or {}
        measure = (e["check"], tuple(sorted((str(k), str(v)) for k, v in labels.items() if k != QUANTILE)))
        at = QUANTILE in labels and quantile is not None and labels[QUANTILE] == quantile
        rank = (at, size if size is not None else -1.0, -i)
        if measure not in best or rank > best[measure][0]:
            best[measure] = (rank, size, i, e)
    # An SLO rule (infinite) leads, then the verdict's segment, then the rest by size.
    kept = sorted(best.values(), key=lambda r: (r[1] != math.inf and not mine(r[3]), r[1] is None,
                                                -(r[1] or 0.0), r[2]))
    return [e for _, _, _, e in kept]


def gathered(notes: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ranked evidence of one alert's annotations: its evidence with the correlated signals, the input
    changes and the quality the verdict's attribution names, each once."""
    attribution = notes.get("attribution") or {}
    pool = list(notes.get("evidence") or [])
    for key in ("signals", "inputs", "quality"):
        pool += [{**s, "status": s.get("status", "breach")} for s in attribution.get(key) or []]
    return ranked(pool, attribution.get("quantile"), notes.get("rows"), attribution.get("segment"))
