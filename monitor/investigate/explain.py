"""`tailwatch explain INCIDENT`: the verdict, the evidence chain, the per-stage latency before and during,
the affected fields, segments, classes and groups with n and interval, what changed, and the next queries.

Read from the incident's stored verdicts and, beside them, from the findings and bucket partials of its
windows: the explanation holds even where a verdict row carries no evidence (an SLO rule, no_data).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel

from checks.catalog import names
from monitor.aggregate.keys import CACHE_TIME, LATENCY, STAGE_PREFIX
from monitor.aggregate.partial import Partial
from monitor.investigate import history, query
from monitor.investigate.next_steps import measured, next_queries
from monitor.investigate.output import table
from monitor.verdicts.evidence import NAMED_VALUE, RULE, named_labels, named_values, parts, ranked, rule_of
from storage.store import Store

BEFORE = timedelta(hours=2)  # the "before" of the latency decomposition: this long before the first window
CHANGE_LOOKBACK = timedelta(hours=6)  # versions first seen this long before the first window count as changes
# Findings that say an input field moved (labels `field`), and those that say a model output moved.
FIELD_CHECKS = names("completeness", "ranges", "drift", "lengths", "vocabulary")
EVIDENCE_MAX = 12
SLOWER_RATIO, SLOWER_MIN_MS = 1.2, 2.0  # total p95 during vs before from which "which stage" is asked
# Label-quality findings score windows of hours or days: those overlapping the incident count, even when
# they start before it or end after it (labels land late; their windows do not follow the tick's).
QUALITY_CHECKS = names("quality")
LABEL_WINDOW_MAX = timedelta(days=7)
WHOLE = ("all", "macro", "weighted")  # how far before the incident a label-quality window may start
# A stage whose mean time on cache hits is under this share of its mean on misses is one a hit skips.
SKIPPED_SHARE = 0.1
# "More misses" explains a slowdown when the shift from hits to misses carries this share of the mean increase.
MIX_SHARE = 0.5


@dataclass(frozen=True)
class Explanation:
    """What `explain` says about one incident. Tables are lists of plain dicts (JSON-ready).

    named: the headline of each kind of cause — stage (largest share of the latency increase), the stages
    cache misses newly run (`cache_path`), fields, segments, classes, groups, signals and versions that changed.
    cache: the mean latency increase split into more cache misses and slower requests (None: no cache)."""

    incident: dict[str, Any]
    verdict: str
    summary: str
    verdicts: dict[str, int]  # verdict -> windows
    evidence: list[dict[str, Any]]
    stages: list[dict[str, Any]]
    affected: list[dict[str, Any]]
    what_changed: list[dict[str, Any]]
    next_queries: list[str]
    named: dict[str, Any] = field(default_factory=dict)
    window: tuple[datetime, datetime] | None = None
    before: tuple[datetime, datetime] | None = None
    requests: tuple[int, int] | None = None  # requests before and during, the stages' sample sizes
    cache: dict[str, Any] | None = None
    # The hot routing value's per-stage latency beside the other values' (`logs.ByValue` as a dict), from
    # the raw logs: the caller that can read them fills it in.
    hotspot: dict[str, Any] | None = None
    # The merged partials before and during (None: no rows) the figures above come from, for a caller that
    # draws them; not part of the answer (as_dict leaves them out).
    spans: tuple[Any, Any] = field(default=(None, None), repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(replace(self, spans=(None, None))).items() if k != "spans"}


def explain(store: Store, service: str, incident_id: int, now: datetime | None = None,
            groups: Mapping[str, str] | None = None) -> Explanation:
    """The explanation of incident `incident_id` of `service`; QueryError if there is no such incident.
    `groups`: the service's quality groups (name -> expression), so the affected ones are named with it."""
    frame = query.incidents(store, service, incident_id=incident_id)
    if frame.empty:
        raise query.QueryError(f"no incident {incident_id} for service {service} "
                               f"(see `tailwatch query incidents`)")
    inc = frame.iloc[0].to_dict()
    verdicts = query.verdicts(store, service, incident_id=incident_id)
    first = _first(inc, verdicts)
    last = _last(inc, verdicts, now)
    version = inc.get("model_version") or (verdicts["model_version"].iloc[-1] if len(verdicts) else None)
    if len(verdicts) == 0:
        verdicts = query.verdicts(store, service, since=first, until=last, model_version=version)
    findings = query.findings(store, service, since=first, until=last, model_version=version)
    findings = findings[(findings["window_end"] <= pd.Timestamp(last)) & ~findings["check"].isin(QUALITY_CHECKS)]
    labelled = _label_findings(store, service, version, first, last)
    if not labelled.empty:  # as records: concat warns on the all-None columns of either frame
        findings = pd.DataFrame(findings.to_dict("records") + labelled.to_dict("records"), columns=findings.columns)
    breaches = findings[findings["status"] == "breach"]
    # A hotspot's value (`replica=api-2`) is in its detail, read for those findings only (the costly column).
    named = pd.concat([query.findings(store, service, since=first, until=last, model_version=version, check=c,
                                      status="breach", detail=True) for c in NAMED_VALUE])
    details = dict(zip(named["id"], named["detail"], strict=True))
    breaches = breaches.assign(labels=[named_labels(c, lab, details.get(i)) for c, lab, i in zip(
        breaches["check"], breaches["labels"], breaches["id"], strict=True)])

    # The merged partials before (every version: what served then) and during (the incident's version),
    # read once for the latency decomposition and the cache split.
    spans = [history.merged_partials(store, service, since=first - BEFORE, until=first, group_by=()),
             history.merged_partials(store, service, since=first, until=last, model_version=version, group_by=())]
    before, during = (span[0][1] if span else None for span in spans)
    stages, top_stage = _stages(before, during)
    requests = (int(before.rows), int(during.rows)) if stages else None
    cache = _cache_split(before, during)
    affected = _affected(breaches)
    evidence = _evidence(verdicts, breaches)
    # Per model version before and during: what changed, and what served before (to compare with).
    served = (history.metrics(store, service, since=first - BEFORE, until=first),
              history.metrics(store, service, since=first, until=last))
    changed = _what_changed(store, service, verdicts, first, last, *served)
    named = _named(top_stage, affected, evidence, changed, verdicts, groups or {}, cache)
    # What the raw-log drill-down can rank by: the measures the incident's own rows carried.
    named["measured"] = measured(during)
    summary = next((s for s in reversed(verdicts["summary"].tolist()) if s), "") if "summary" in verdicts else ""
    counts = verdicts["verdict"].value_counts().to_dict() if len(verdicts) else {}
    incident = {k: query.jsonable(inc.get(k)) for k in query.INCIDENT_COLUMNS}
    return Explanation(
        incident=incident, verdict=str(inc["verdict"]), summary=summary or _fallback_summary(inc, named),
        verdicts={str(k): int(v) for k, v in counts.items()}, evidence=evidence, stages=stages,
        affected=affected, what_changed=changed,
        next_queries=next_queries(service, incident_id, version, first, last, named, stages, verdicts,
                                  _previous_version(served[0]), BEFORE),
        named=named, window=(first, last), before=(first - BEFORE, first), requests=requests, cache=cache,
        spans=(before, during))


def _label_findings(store: Store, service: str, version: str | None, first: datetime, last: datetime
                    ) -> pd.DataFrame:
    """The quality and acceptance findings of `version` whose windows overlap [first, last); the rules'
    with their detail (what holds their floor)."""
    frames = [query.findings(store, service, since=first - LABEL_WINDOW_MAX, until=last, model_version=version,
                             check=check, detail=check == RULE) for check in QUALITY_CHECKS]
    found = pd.DataFrame([r for f in frames for r in f.to_dict("records")], columns=frames[0].columns)
    return found[found["window_end"] > pd.Timestamp(first)] if len(found) else found


def _first(inc: dict, verdicts: pd.DataFrame) -> datetime:
    for value in (inc.get("first_window_start"),
                  verdicts["window_start"].min() if len(verdicts) else None, inc.get("opened_at")):
        if value is not None and not pd.isna(value):
            return pd.Timestamp(value).to_pydatetime()
    raise query.QueryError("the incident has no window and no opening time")


def _last(inc: dict, verdicts: pd.DataFrame, now: datetime | None) -> datetime:
    for value in (inc.get("last_window_end"), verdicts["window_end"].max() if len(verdicts) else None,
                  inc.get("resolved_at"), now):
        if value is not None and not pd.isna(value):
            return pd.Timestamp(value).to_pydatetime()
    return pd.Timestamp.now(tz="UTC").to_pydatetime()


def _stages(before: Partial | None, during: Partial | None) -> tuple[list[dict[str, Any]], str | None]:
    """p50 / p95 / p99 per stage before and during, and each stage's share of the p95 increase (quantiles
    do not add: a pointer, not a split)."""
    if before is None or during is None:
        return [], None
    b, d = history.partial_metrics(before), history.partial_metrics(during)
    names = sorted({c.rsplit("_", 2)[0] for c in d if c.endswith("_p95_ms")},
                   key=lambda s: (s != "total", s))
    rows = []
    for stage in names:
        row: dict[str, Any] = {"stage": stage}
        for q in history.QUANTILES:
            row[f"{q}_before"] = _num(b.get(f"{stage}_{q}_ms"))
            row[f"{q}_during"] = _num(d.get(f"{stage}_{q}_ms"))
        up = (row["p95_during"] or 0) - (row["p95_before"] or 0) if row["p95_before"] is not None else None
        row["p95_change_ms"] = up
        rows.append(row)
    gains = {r["stage"]: max(r["p95_change_ms"] or 0, 0) for r in rows if r["stage"] != "total"}
    total_gain = sum(gains.values())
    for r in rows:
        # A stage that carries none of the increase has no share to show.
        r["share_of_increase"] = (round(gains[r["stage"]] / total_gain, 3)
                                  if gains.get(r["stage"]) and total_gain else None)
    total = next((r for r in rows if r["stage"] == "total"), None)
    slower = (total is not None and total["p95_before"] and total["p95_during"] is not None
              and total["p95_during"] >= SLOWER_RATIO * total["p95_before"]
              and total["p95_during"] - total["p95_before"] >= SLOWER_MIN_MS)
    # A stage is named only when the whole request got slower: otherwise its share is a share of noise.
    top = max(gains, key=gains.get) if total_gain > 0 and slower else None
    return rows, top


def _cache_split(before: Partial | None, during: Partial | None) -> dict[str, Any] | None:
    """The mean latency before and during (ms), split into the part that more cache misses add (the shift
    from hits to misses, at the before span's time per hit and per miss) and the part requests at the same
    outcome add (slower hits or misses); each stage's mean per hit and per miss, and the stages a hit skips.
    Means add up where quantiles do not. None without timed hits and misses in both spans."""
    if before is None or during is None:
        return None
    b, d = before.counts, during.counts
    hits_b, miss_b = b[f"{CACHE_TIME}hit:rows"], b[f"{CACHE_TIME}miss:rows"]
    hits_d, miss_d = d[f"{CACHE_TIME}hit:rows"], d[f"{CACHE_TIME}miss:rows"]
    if not (hits_b and miss_b and miss_d and hits_d + miss_d):
        return None

    def mean_ms(c, outcome: str, name: str, n: int) -> float:
        return c[f"{CACHE_TIME}{outcome}:{name}"] / n / 1000 if n else 0.0

    share_b, share_d = miss_b / (hits_b + miss_b), miss_d / (hits_d + miss_d)
    names = [LATENCY] + sorted({k.split(":", 2)[2] for k in d if k.startswith(CACHE_TIME)
                                and k.split(":", 2)[2].startswith(STAGE_PREFIX)})
    rows = []
    for name in names:
        hit, miss = mean_ms(b, "hit", name, hits_b), mean_ms(b, "miss", name, miss_b)
        rows.append({"stage": "total" if name == LATENCY else name[len(STAGE_PREFIX):], "hit_ms": hit,
                     "miss_ms": miss, "hit_ms_during": mean_ms(d, "hit", name, hits_d),
                     "miss_ms_during": mean_ms(d, "miss", name, miss_d),
                     "from_misses_ms": (share_d - share_b) * (miss - hit)})
    total = rows[0]
    mean_b = (1 - share_b) * total["hit_ms"] + share_b * total["miss_ms"]
    mean_d = (1 - share_d) * total["hit_ms_during"] + share_d * total["miss_ms_during"]
    skipped = sorted((r for r in rows[1:] if r["miss_ms"] > 0 and r["hit_ms"] < SKIPPED_SHARE * r["miss_ms"]),
                     key=lambda r: -r["from_misses_ms"])
    return {"miss_share_before": round(share_b, 4), "miss_share_during": round(share_d, 4),
            "mean_ms_before": round(mean_b, 3), "mean_ms_during": round(mean_d, 3),
            "from_misses_ms": round(total["from_misses_ms"], 3),
            "from_slower_requests_ms": round(mean_d - mean_b - total["from_misses_ms"], 3),
            "skipped_by_hits": [r["stage"] for r in skipped],
            "stages": [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in rows]}


def _num(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _affected(breaches: pd.DataFrame) -> list[dict[str, Any]]:
    """Breaching findings that point at a part of the traffic or of the input: segment, class, group,
    field or signal, with the windows that breached, the largest n and the latest value and interval."""
    out: dict[tuple, dict[str, Any]] = {}
    rows = breaches.sort_values("window_start").to_dict("records")
    # A segment whose finding also breached for all traffic in that window says nothing of its own.
    whole = {(r["check"], r["window_start"], r["window_end"], tuple(sorted((r["labels"] or {}).items())))
             for r in rows if "segment" not in (r["labels"] or {})}
    for row in rows:
        labels = row["labels"] or {}
        kinds = [k for k in ("segment", "group", "class", "field", "signal", "output") if k in labels]
        if not kinds or (row["check"] == "latency" and ("segment" not in labels or "length" in labels)):
            continue
        if "segment" in labels:
            rest = tuple(sorted((k, v) for k, v in labels.items() if k != "segment"))
            if (row["check"], row["window_start"], row["window_end"], rest) in whole:
                continue
        key = (row["check"], tuple(sorted(labels.items())))
        entry = out.setdefault(key, {"check": row["check"], "labels": dict(labels), "windows": 0, "n": 0})
        entry["windows"] += 1
        entry["n"] = max(entry["n"], int(row["n"] or 0))
        entry.update(value=_num(row["value"]), baseline=_num(row["baseline"]), **_rule(row),
                     interval=None if pd.isna(row["interval_low"]) else [row["interval_low"], row["interval_high"]])
    return sorted(out.values(), key=lambda e: (-e["windows"], -e["n"]))


def _evidence(verdicts: pd.DataFrame, breaches: pd.DataFrame) -> list[dict[str, Any]]:
    """The verdicts' evidence with the signals, inputs and quality their attribution names (each distinct
    check and labels once, with the windows citing it), else the breaching findings of the incident's
    windows; ranked by effect size (`evidence.ranked`, as Slack and Alertmanager rank them)."""
    out: dict[tuple, dict[str, Any]] = {}
    quantile, rows = None, 0
    segment = _segment(verdicts)
    for row in verdicts.to_dict("records") if len(verdicts) else []:
        attribution = row.get("attribution") or {}
        quantile = attribution.get("quantile") or quantile
        rows = max(rows, int(row.get("rows") or 0))
        extra = [{**s, "status": "breach"} for key in ("signals", "inputs", "quality") for s in attribution.get(key) or []]
        cited = {}  # each item once per window, the evidence's copy (with its interval) first
        for e in list(row.get("evidence") or []) + extra:
            cited.setdefault((e.get("check"), tuple(sorted((e.get("labels") or {}).items()))), e)
        for key, e in cited.items():
            entry = out.setdefault(key, {**e, "windows": 0})
            entry["windows"] += 1
    if not out:
        for row in breaches.to_dict("records"):
            key = (row["check"], tuple(sorted((row["labels"] or {}).items())))
            entry = out.setdefault(key, {"check": row["check"], "labels": row["labels"] or {}, "windows": 0})
            entry["windows"] += 1
            entry.update(value=_num(row["value"]), baseline=_num(row["baseline"]), n=int(row["n"] or 0),
                         interval_low=_num(row["interval_low"]), interval_high=_num(row["interval_high"]),
                         status="breach", **_rule(row))
    return ranked(out.values(), quantile, rows or None, segment)[:EVIDENCE_MAX]


def _rule(row: Mapping[str, Any]) -> dict[str, Any]:
    """An acceptance finding's `rule` (evidence.rule_of: its floor and baseline source), as the verdicts'
    evidence carries it, so its words hold the rule's own number; nothing for another check."""
    rule = rule_of(row)
    return {"rule": rule} if rule else {}


def _segment(verdicts: pd.DataFrame) -> str | None:
    """The segment most of the incident's verdicts rest on (their attribution `segment`), if any."""
    cited = [(a or {}).get("segment") for a in (verdicts["attribution"] if len(verdicts) else [])]
    cited = [c for c in cited if c]
    return max(set(cited), key=lambda c: (cited.count(c), c)) if cited else None


def _what_changed(store: Store, service: str, verdicts: pd.DataFrame, first: datetime, last: datetime,
                  before: pd.DataFrame, during: pd.DataFrame) -> list[dict[str, Any]]:
    """The verdicts' what_changed, versions (model, preprocessing, config...) first seen from
    CHANGE_LOOKBACK before the incident to its end, and the cache hit rate and model versions `before` vs
    `during` (metrics per model version of the two spans)."""
    out: list[dict[str, Any]] = []
    seen = set()
    for items in (verdicts["what_changed"] if len(verdicts) else []):
        for c in items or []:
            key = (c.get("kind"), c.get("value"))
            if key not in seen:
                seen.add(key)
                out.append(dict(c))
    with store.transaction() as session:
        firsts = store.versions.load(session, service)
    earliest: dict[str, datetime] = {}
    for kind, value, when in ((v["kind"], v["value"], v["first_seen"]) for v in firsts):
        earliest.setdefault(kind, when)
        if when == earliest[kind] or not (first - CHANGE_LOOKBACK <= when < last) or (kind, value) in seen:
            continue
        seen.add((kind, value))
        out.append({"kind": kind, "value": value, "first_seen": query.jsonable(when),
                    "text": f"{kind} {value} first seen {when:%Y-%m-%d %H:%M} UTC"})
    versions_before, versions_during = set(before.get("model_version", [])), set(during.get("model_version", []))
    for v in sorted(versions_during - versions_before):
        if ("model_version", v) not in seen and versions_before:
            out.append({"kind": "model_version", "value": v,
                        "text": f"model version {v} serves during the incident, not before "
                                f"({', '.join(sorted(versions_before))} did)"})
    hit_b = _rate(before, "cache_hit_rate")
    hit_d = _rate(during, "cache_hit_rate")
    if hit_b is not None and hit_d is not None and abs(hit_d - hit_b) >= 0.05:
        out.append({"kind": "cache", "value": round(hit_d, 3), "before": round(hit_b, 3),
                    "text": f"cache hit rate {hit_b:.1%} before, {hit_d:.1%} during"})
    return out


def _rate(frame: pd.DataFrame, column: str) -> float | None:
    """A request-weighted rate over the rows of a metrics frame (None when absent)."""
    if frame.empty or column not in frame:
        return None
    rows = frame.dropna(subset=[column])
    if rows.empty:
        return None
    weights = rows["requests"].astype(float)
    return float((rows[column] * weights).sum() / weights.sum())


def _named(top_stage: str | None, affected: list[dict], evidence: list[dict], changed: list[dict],
           verdicts: pd.DataFrame, groups: Mapping[str, str], cache_split: dict | None = None) -> dict[str, Any]:
    """The headline of each kind of cause, most cited first; `group_definitions` gives the expression of
    each named group the config defines (a group is a slice of the inputs: `short_tenure` is `tenure < 12`).
    `cache_path`: when the cache is implicated and more misses carry most of the mean increase, the stages
    a hit skips, most added time first — the work the lost hits now send down the serving path."""
    stage = top_stage
    for verdict, items in (zip(verdicts["verdict"], verdicts["attribution"], strict=True) if len(verdicts) else []):
        stages = (items or {}).get("stages") or {}
        if stages and verdict in ("slower", "both"):
            stage = items.get("top_stage") or max(stages, key=stages.get)  # the verdict's own, at its breaching quantile
    # A hotspot's `field` is a routing field (replica), not an input: it is named by its hot value.
    labelled = [e for e in affected + evidence if e.get("check") not in ("latency", "hotspot")]
    cache = any(e.get("check") in ("cache_hit_rate", "stale_cache") for e in evidence + affected) or any(
        c.get("kind") == "cache" for c in changed)

    def values(key: str) -> list[str]:
        out: list[str] = []
        for item in labelled:
            value = (item.get("labels") or {}).get(key)
            # `all`, `macro`, `weighted` are the whole traffic or an average of classes, not a part of either.
            if value is not None and str(value) not in out and str(value) not in WHOLE:
                out.append(str(value))
        return out

    increase = cache_split and cache_split["mean_ms_during"] - cache_split["mean_ms_before"]
    path = (cache_split["skipped_by_hits"] if cache and increase and increase > 0
            and cache_split["from_misses_ms"] >= MIX_SHARE * increase else [])
    # The segment the verdicts rest on leads the segments named.
    segment = _segment(verdicts)
    segments = ([segment] if segment else []) + [s for s in values("segment") if s != segment]
    return {"stage": stage, "cache_path": path, "hotspots": named_values(affected + evidence),
            "fields": values("field") + ["cache_hit"] * cache, "segments": segments,
            "classes": values("class"), "groups": values("group"), "signals": values("signal"),
            "outputs": values("output"),
            "group_definitions": {g: groups[g] for g in values("group") if g in groups},
            "versions": [str(c["value"]) for c in changed if c.get("kind") == "model_version"],
            "changed": [c.get("text", "") for c in changed]}


def _fallback_summary(inc: dict, named: dict) -> str:
    parts = [str(inc.get("verdict"))]
    if named.get("stage"):
        parts.append(f"stage {named['stage']}")
    if named.get("cache_path"):
        parts.append(f"cache misses now run {', '.join(named['cache_path'])}")
    for key in ("hotspots", "fields", "segments", "classes", "groups"):
        if named.get(key):
            parts.append(f"{key[:-1]} {', '.join(named[key][:3])}")
    return "; ".join(parts)


def _previous_version(before: pd.DataFrame) -> str | None:
    """The model version that served most requests in `before` (metrics per version of the BEFORE span)."""
    return None if before.empty else str(before.sort_values("requests", ascending=False)["model_version"].iloc[0])


def _key(labels: Mapping[str, Any] | None) -> tuple:
    return tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items()))


def render(result: Explanation, console: Console) -> None:
    """The explanation as panels and tables a person reads top to bottom."""
    inc = result.incident
    named = result.named
    # The summary names the verdict first (`slower for segment lang=de: ...`, `worse (estimated): ...`):
    # said once, in bold.
    summary = result.summary
    rest = summary[len(result.verdict):] if summary.startswith(result.verdict) else None
    headline = (f"[bold]{result.verdict}[/]{escape(rest)}" if rest is not None and rest[:1] in (" ", ":", "")
                else f"[bold]{result.verdict}[/] — {escape(summary)}")
    # Markup only where written here: versions, stages, segments, classes and groups come from the logs.
    lines = [headline,
             f"incident {inc['id']} ({inc['status']}), model version {escape(str(inc.get('model_version') or '-'))}, "
             f"windows {result.window[0]:%Y-%m-%d %H:%M} .. {result.window[1]:%Y-%m-%d %H:%M} UTC",
             "verdicts of its windows: " + (", ".join(f"{k} x{v}" for k, v in result.verdicts.items()) or "none stored")]
    pointers = [f"stage [bold]{escape(named['stage'])}[/]"] if named.get("stage") else []
    if named.get("cache_path"):
        pointers.append(f"cache misses now run [bold]{escape(', '.join(named['cache_path']))}[/]")
    pointers += [f"{k[:-1]} [bold]{escape(', '.join(map(str, named[k][:4])))}[/]"
                 for k in ("hotspots", "fields", "segments", "classes", "signals", "outputs", "versions") if named.get(k)]
    defined = named.get("group_definitions") or {}
    if named.get("groups"):
        pointers.append("group " + ", ".join(f"[bold]{escape(g)}[/]" + (f" ({escape(defined[g])})" if g in defined
                                                                         else "") for g in named["groups"][:4]))
    if pointers:
        lines.append("points at: " + "; ".join(pointers))
    console.print(Panel("\n".join(lines), title=f"incident {inc['id']}", expand=False))

    def shown(frame: pd.DataFrame, title: str, columns: list[str]) -> None:  # fits the terminal; JSON has all
        console.print(table(frame, title, columns, width=console.width, every="--format json"))

    if result.evidence:
        worded = pd.DataFrame([{**parts(e), "windows": e.get("windows")} for e in result.evidence])
        shown(worded, "evidence, strongest first (effect size across checks)",
              ["check", "labels", "value", "baseline", "change", "n", "interval", "windows"])
    if result.stages:
        shown(pd.DataFrame(result.stages),
              f"latency per stage (ms): before = {result.before[0]:%H:%M}-{result.before[1]:%H:%M} "
              f"({result.requests[0]:,} requests), during = the incident's windows ({result.requests[1]:,} requests)",
              # p95 first: the verdict's figure, and what stays at 80 columns.
              ["stage", "p95_before", "p95_during", "p95_change_ms", "share_of_increase", "p50_before", "p50_during",
               "p99_before", "p99_during"])
    if result.cache:
        c = result.cache
        shown(pd.DataFrame(c["stages"]),
              f"cache hits vs misses, mean ms per request: miss share {c['miss_share_before']:.1%} "
              f"before, {c['miss_share_during']:.1%} during; of the {c['mean_ms_during'] - c['mean_ms_before']:+.2f} ms "
              f"mean change, more misses add {c['from_misses_ms']:+.2f} ms and slower requests "
              f"{c['from_slower_requests_ms']:+.2f} ms",
              ["stage", "hit_ms", "miss_ms", "hit_ms_during", "miss_ms_during", "from_misses_ms"])
    if result.hotspot and result.hotspot["stages"]:
        h, n = result.hotspot, result.hotspot["requests"]
        shown(pd.DataFrame(h["stages"]), f"{h['field']}={h['value']} ({n['before']:,} requests before, "
              f"{n['during']:,} during) vs the other {h['field']}s ({n['others_before']:,}, "
              f"{n['others_during']:,}): latency per stage (ms) from the raw logs",
              ["stage", "p95_before", "p95_during", "others_p95_before", "others_p95_during", "p50_before",
               "p50_during", "others_p50_before", "others_p50_during"])
    # The affected parts not in the evidence already: a section never repeats another.
    cited = {(e["check"], _key(e.get("labels"))) for e in result.evidence}
    affected = [{**parts({**a, "interval_low": (a.get("interval") or [None, None])[0],
                          "interval_high": (a.get("interval") or [None, None])[1]}), "windows": a["windows"]}
                for a in result.affected if (a["check"], _key(a.get("labels"))) not in cited]
    if affected:
        shown(pd.DataFrame(affected), "also affected: segments, classes, groups and fields",
              ["check", "labels", "value", "baseline", "change", "n", "interval", "windows"])
    if result.what_changed:
        console.print("[bold]what changed[/]")
        for c in result.what_changed:
            console.print(f"  - {c.get('text') or c}", markup=False, highlight=False)  # values from the logs
    console.print("[bold]next queries[/]")
    for line in result.next_queries:
        # One line each however narrow the terminal: a command is copied whole.
        console.print(f"  $ {line}", highlight=False, markup=False, soft_wrap=True)
