"""`tailwatch compare`: two model versions side by side over the same period, from the stored partials and
findings, with the configured hard constraints marked pass or fail (a release review's acceptance table)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pandas as pd

from checks.drift import DriftThreshold, drift, prediction_drift
from monitor.aggregate import keys
from monitor.aggregate.partial import ALL, Partial
from monitor.aggregate.profile import Profile
from monitor.config import Constraint, Service
from monitor.contract import STATUSES
from monitor.investigate import history, query
from storage.store import Store


@dataclass(frozen=True)
class Comparison:
    """`table`: one row per metric (metric, unit, baseline, candidate, difference = candidate - baseline,
    ratio = candidate / baseline, None when the baseline is 0); `constraints`: one row per configured constraint with pass / fail / n/a per
    version; `passed`: every candidate constraint passed (True when none is configured)."""

    baseline: str
    candidate: str
    since: datetime
    until: datetime
    table: pd.DataFrame
    constraints: pd.DataFrame
    passed: bool


RATE_SUFFIXES = ("_rate", "_share")
FAILURES = ("error", "timeout", "rejected")  # the statuses `failure_rate` counts


def version_metrics(store: Store, service: Service, version: str, since: datetime, until: datetime,
                    profile: Profile | None) -> dict[str, float | None]:
    """One version's metrics over [since, until): service health from its merged partials, serving hours,
    throughput, cost per 1,000 valid (ok) predictions, drift (PSI) vs the reference, quality from findings."""
    merged = history.merged_partials(store, service.name, since=since, until=until, model_version=version,
                                   segment=ALL, group_by=())
    part = merged[0][1] if merged else Partial()
    out: dict[str, float | None] = dict(history.partial_metrics(part))
    n = part.rows
    # The service's failures: a cancelled request (the client went away) or a truncated answer (cut at its
    # length limit) is counted in a rate of its own, not as a failure.
    failed = sum(part.counts[keys.status(s)] for s in FAILURES)
    out["failure_rate"] = failed / n if n else None
    with store.transaction() as session:
        # Buckets of each size counted apart: compacted history holds hours or days beside 5-minute buckets.
        served = store.partials.served(session, service.name, version, ALL, since, until)
    hours = sum(size * buckets for size, buckets in served) / 3600
    out["serving_hours"] = hours
    out["throughput_rps"] = n / (hours * 3600) if hours else None
    price = service.compare.price(version)
    ok = part.counts[keys.OK]
    out["cost_per_1k"] = price * hours / ok * 1000 if price is not None and ok else None
    if profile is not None and n:
        for f in drift(part, profile, None, DriftThreshold()) + prediction_drift(part, profile, None,
                                                                                  DriftThreshold()):
            # psi:<feature>, psi:prediction, psi:score:<class>
            out[f"psi:{f.labels.get('field') or f.labels.get('output')}"] = f.value
    out.update(_quality(store, service.name, version, since, until))
    return out


def _quality(store: Store, service: str, version: str, since: datetime, until: datetime) -> dict[str, float]:
    """Label quality findings, when stored: n-weighted mean per metric and class over all traffic,
    and label coverage."""
    out: dict[str, float] = {}
    for check in ("quality", "label_coverage"):
        frame = query.findings(store, service, since=since, until=until, model_version=version, check=check)
        if frame.empty:
            continue
        frame = frame[frame["value"].notna() & (frame["n"] > 0)]
        frame = frame[[(lab or {}).get("group", "all") == "all" and "segment" not in (lab or {})
                       for lab in frame["labels"]]]
        for labels_json, rows in frame.groupby(frame["labels"].map(lambda d: tuple(sorted((d or {}).items())))):
            labels = dict(labels_json)
            name = check if check == "label_coverage" else \
                f"quality:{labels.get('metric', '?')}:{labels.get('class', 'all')}"
            out[name] = float(np.average(rows["value"], weights=rows["n"]))
    return out


def compare(store: Store, service: Service, baseline: str, candidate: str, since: datetime,
            until: datetime, profile: Profile | None = None) -> Comparison:
    """Compare `candidate` with `baseline` over [since, until) and check the service's constraints."""
    if baseline == candidate:
        raise ValueError("--baseline and --candidate name the same version")
    b = version_metrics(store, service, baseline, since, until, profile)
    c = version_metrics(store, service, candidate, since, until, profile)
    for version, m in ((baseline, b), (candidate, c)):
        if not m.get("requests"):
            raise ValueError(f"no stored requests of version {version!r} between {since} and {until}")
    for status in history.LOGGED:
        if status in b or status in c:  # one version logs it: the other's none is a count of 0, not n/a
            for m in (b, c):
                m.setdefault(status, 0)
                m.setdefault(history.RATE_OF[status], 0.0)
    names = _ordered(b.keys() | c.keys())
    rows = []
    for name in names:
        bv, cv = _number(b.get(name)), _number(c.get(name))
        both = bv is not None and cv is not None
        rows.append({"metric": name, "unit": unit(name), "baseline": bv, "candidate": cv,
                     "difference": cv - bv if both else None, "ratio": cv / bv if both and bv else None})
    table = pd.DataFrame(rows, columns=["metric", "unit", "baseline", "candidate", "difference", "ratio"])
    checks = [_check(con, b, c) for con in service.compare.constraints]
    cons = pd.DataFrame(checks, columns=["metric", "rule", "baseline", "candidate", "baseline_status", "status"])
    passed = all(row["status"] == "pass" for row in checks)
    return Comparison(baseline, candidate, since, until, table, cons, passed)


def _number(value) -> float | None:
    return None if value is None or pd.isna(value) else value


def unit(metric: str) -> str:
    """The unit a compared metric is in: ms, h, req/s, share (0..1), count, /1k ok (the price's currency per
    1,000 ok predictions), or '' (an index: PSI, quality scores)."""
    if metric.endswith("_ms"):
        return "ms"
    if metric == "serving_hours":
        return "h"
    if metric == "throughput_rps":
        return "req/s"
    if metric.endswith(RATE_SUFFIXES) or metric == "label_coverage":
        return "share"
    if metric == "requests" or metric in STATUSES:
        return "count"
    if metric == "cost_per_1k":
        return "/1k ok"
    return ""


def _check(con: Constraint, b: dict, c: dict) -> dict:
    """One constraint: 'pass', 'fail', or 'n/a' (metric not measured) for each version."""
    bv, cv = b.get(con.metric), c.get(con.metric)
    rule = " ".join(part for part in (
        f"<= {con.max:g}" if con.max is not None else "", f">= {con.min:g}" if con.min is not None else "",
        f"<= {con.max_ratio:g} x baseline" if con.max_ratio is not None else "") if part)

    def absolute(v) -> str:
        if v is None or pd.isna(v):
            return "n/a"
        ok = (con.max is None or v <= con.max) and (con.min is None or v >= con.min)
        return "pass" if ok else "fail"

    status = absolute(cv)
    if con.max_ratio is not None and status != "n/a":
        if bv is None or pd.isna(bv) or not bv:
            status = "n/a"
        elif cv / bv > con.max_ratio:
            status = "fail"
    base_status = absolute(bv) if con.max is not None or con.min is not None else "-"
    return {"metric": con.metric, "rule": rule, "baseline": bv, "candidate": cv,
            "baseline_status": base_status, "status": status}


# Health first: traffic, the failure rate, each status's rate, then each status's count but ok's.
_ORDER = ("requests", "serving_hours", "throughput_rps", "ok", "failure_rate", *history.RATE_OF.values(),
          *(s for s in STATUSES if s != "ok"), "total_p50_ms", "total_p95_ms", "total_p99_ms")


def _ordered(names) -> list[str]:
    """Health first, then stages, signals, cost, drift, quality."""
    def rank(name: str) -> tuple:
        if name in _ORDER:
            return (0, _ORDER.index(name), name)
        if name.endswith("_ms"):
            return (1, 0, name)
        if name == "cache_hit_rate" or name.endswith(("_mean", "_p95")):
            return (2, 0, name)
        if name == "cost_per_1k":
            return (3, 0, name)
        if name.startswith("psi:"):
            return (4, 0, name)
        return (5, 0, name)
    return sorted(names, key=rank)
