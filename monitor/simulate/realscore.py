"""Running and scoring a real-data evaluation case (monitor/simulate/realdata.py builds it): `run(out)` runs
`tailwatch db upgrade`, `reference build` and `backfill` over the whole range; `score(out)` reads the stored
verdicts and findings and judges the criteria of docs/evaluation.md against `truth.json`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from monitor.investigate import query
from monitor.simulate.realdata import ALERTING
from storage.store import Store


def tailwatch(out: Path, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    """`tailwatch --config out/tailwatch.yaml ARGS` with this Python (the code on its path)."""
    return subprocess.run([sys.executable, "-c", "from monitor.cli import main; main()",
                           "--config", str(Path(out) / "tailwatch.yaml"), *args],
                          cwd=out, env={**os.environ, "COLUMNS": "160", "NO_COLOR": "1"},
                          capture_output=True, text=True, timeout=timeout, check=False)


def run(out: Path) -> dict[str, float]:
    """Upgrade the database, build the reference profile and backfill the whole range; seconds per step.
    RuntimeError naming the command when one fails."""
    truth = json.loads((Path(out) / "truth.json").read_text())
    seconds: dict[str, float] = {}
    for name, args in (("db upgrade", ("db", "upgrade")), ("reference build", ("reference", "build")),
                       ("backfill", ("backfill", "--since", truth["start"], "--until", truth["end"]))):
        started = time.perf_counter()
        checked(out, *args)
        seconds[name] = round(time.perf_counter() - started, 1)
    return seconds


def checked(out: Path, *args: str) -> subprocess.CompletedProcess:
    """`tailwatch(out, *args)`; RuntimeError naming the command and its last output when it fails."""
    done = tailwatch(out, *args)
    if done.returncode != 0:
        raise RuntimeError(f"`tailwatch {' '.join(args)}` exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[-2000:]}")
    return done


@dataclass
class Criterion:
    name: str
    passed: bool
    detail: str


@dataclass
class CaseScore:
    case: str
    criteria: list[Criterion] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.criteria)


def _overlaps(frame: pd.DataFrame, start: str, end: str) -> pd.Series:
    return (frame["window_start"] < pd.Timestamp(end)) & (frame["window_end"] > pd.Timestamp(start))


def score(out: Path) -> CaseScore:
    """Judge the stored results of a run against `truth.json`: one criterion per fault (by its kind), then
    no false alarm in the healthy range and n and an interval on every finding (docs/evaluation.md)."""
    out = Path(out)
    truth = json.loads((out / "truth.json").read_text())
    service = yaml.safe_load((out / "tailwatch.yaml").read_text())["services"][0]["name"]
    store = Store(f"sqlite:///{out / 'tailwatch.db'}")
    try:
        verdicts = query.verdicts(store, service)
        findings = query.findings(store, service)
        quarantine = query.quarantine(store, service, group_by=("kind", "reason"))
        incidents = query.incidents(store, service)
        hotspots = query.findings(store, service, check="hotspot", status="breach", detail=True)
    finally:
        store.dispose()
    result = CaseScore(truth["case"])
    result.facts = {"verdicts": dict(Counter(verdicts["verdict"])), "findings": len(findings),
                    "incidents": len(incidents),
                    "quarantined": {f"{r['kind']}:{r['reason']}": int(r["rows"]) for r in quarantine.to_dict("records")}}

    for fault in truth["faults"]:
        during = verdicts[_overlaps(verdicts, fault["onset"], fault["end"])]
        if fault["kind"] == "slowdown":
            slower = during[during["verdict"].isin(["slower", "both"])]
            named = Counter(_top_stage(a) for a in slower["attribution"])
            right = named.get(fault["stage"], 0)
            result.criteria.append(Criterion(
                "slowdown stage named", right > 0,
                f"{fault['stage']} x{fault['factor']:g} {fault['onset'][:16]}..{fault['end'][:16]}: "
                f"{len(slower)} slower/both verdicts, stages named {dict(named) or 'none'}"))
        elif fault["kind"] == "timeouts":
            slower = during[during["verdict"].isin(["slower", "both"])]
            mine = findings[_overlaps(findings, fault["onset"], fault["end"]) & (findings["check"] == "latency")]
            rate = mine[[(labels or {}).get("rate") == "timeout" for labels in mine["labels"]]]
            result.criteria.append(Criterion(
                "timeouts found", len(slower) > 0 and bool((rate["status"] == "breach").any()),
                f"{fault['share']:.0%} at the deadline {fault['onset'][:16]}..{fault['end'][:16]}: "
                f"{len(slower)} slower/both verdicts of {len(during)}, timeout rate breaches "
                f"{int((rate['status'] == 'breach').sum())} of {len(rate)}"))
        elif fault["kind"] == "hotspot":
            hot = hotspots[_overlaps(hotspots, fault["onset"], fault["end"])]
            named = Counter(f"{(labels or {}).get('field')}={(detail or {}).get('value')}"
                            for labels, detail in zip(hot["labels"], hot["detail"], strict=True))
            slower = during[during["verdict"].isin(["slower", "both"])]
            result.criteria.append(Criterion(
                "hot value named", named.get(f"replica={fault['value']}", 0) > 0 and len(slower) > 0,
                f"replica={fault['value']} {fault['share']:.0%} of traffic, {fault['stage']} x{fault['factor']:g}: "
                f"{len(slower)} slower/both verdicts of {len(during)}, hotspot breaches name {dict(named) or 'none'}"))
        else:
            version = fault["version"]
            mine = findings[_overlaps(findings, fault["onset"], fault["end"]) & (findings["model_version"] == version)]
            accept = mine[mine["check"] == "acceptance"]
            breaches = accept[accept["status"] == "breach"]
            worse = during[during["verdict"].isin(["worse", "both"]) & (during["model_version"] == version)
                           & (during["estimated"] == False)]  # noqa: E712 (a column, not a bool)
            scored = mine[mine["check"] == "quality"]
            groups = Counter((labels or {}).get("group", "all") for labels in breaches["labels"])
            result.criteria.append(Criterion(
                "quality change found from labels", len(breaches) > 0 or len(worse) > 0,
                f"{version} ({fault['change']}): {len(breaches)} acceptance breaches of {len(accept)}"
                f"{' ' + str(dict(groups)) if len(groups) > 1 or 'all' not in groups else ''}, "
                f"{len(worse)} confirmed worse verdicts (rollback_to {dict(Counter(worse['rollback_to'].fillna('none')))}), "
                f"{len(scored)} quality findings "
                f"({int((scored['status'] == 'ok').sum())} with a value)"))

    h0, h1 = truth["healthy"]
    healthy = verdicts[(verdicts["window_start"] >= pd.Timestamp(h0)) & (verdicts["window_end"] <= pd.Timestamp(h1))]
    alarms = healthy[healthy["verdict"].isin(ALERTING)]
    lengths = Counter(f"{v}@{_length(e - s)}" for v, s, e in
                      zip(alarms["verdict"], alarms["window_start"], alarms["window_end"], strict=True))
    result.criteria.append(Criterion(
        "no false alarm in the healthy range", alarms.empty,
        f"{h0[:16]}..{h1[:16]}: {len(alarms)} alerting verdicts of {len(healthy)} "
        f"{dict(lengths.most_common(6)) or ''}".strip()))

    valued = findings[findings["value"].notna()]
    missing = valued[valued["n"].isna() | valued["interval_low"].isna() | valued["interval_high"].isna()]
    result.criteria.append(Criterion(
        "every finding with a value has n and an interval", len(valued) > 0 and missing.empty,
        f"{len(missing)} of {len(valued)} lack one; by check: "
        f"{dict(Counter(missing['check']).most_common(8)) if len(missing) else '-'}"))
    return result


def stored(out: Path) -> tuple[list[dict], list[dict]]:
    """The incidents and verdicts a run under `out` stored, as dicts of every column."""
    service = yaml.safe_load((Path(out) / "tailwatch.yaml").read_text())["services"][0]["name"]
    store = Store(f"sqlite:///{Path(out) / 'tailwatch.db'}")
    try:
        with store.transaction() as session:
            return store.incidents.load(session, service), store.verdicts.load(session, service)
    finally:
        store.dispose()


def fault_name(fault: dict) -> str:
    """A real-data fault of truth.json in a few words."""
    if fault["kind"] == "slowdown":
        return f"{fault['stage']} x{fault['factor']:g}"
    if fault["kind"] == "timeouts":
        return f"{fault['share']:.0%} time out"
    if fault["kind"] == "hotspot":
        return f"{fault['value']} {fault['share']:.0%}, {fault['stage']} x{fault['factor']:g}"
    return fault["change"]


def healthy_alarms(truth: dict, incidents: list[dict], verdicts: list[dict]) -> str:
    """False alarms in a real-data case's healthy range: the incidents opened in it (by verdict) and its
    alerting verdicts (by verdict and window length) of all its windows."""
    lo, hi = (datetime.fromisoformat(x.replace("Z", "+00:00")) for x in truth["healthy"])
    opened = Counter(i["verdict"] for i in incidents if lo <= (i["first_window_start"] or i["opened_at"]) < hi)
    inside = [v for v in verdicts if v["window_start"] >= lo and v["window_end"] <= hi]
    alerting = Counter(f"{v['verdict']}@{(v['window_end'] - v['window_start']) / timedelta(hours=1):g}h"
                       for v in inside if v["verdict"] in ALERTING)
    return (f"{sum(opened.values())} incidents {dict(opened) or ''}; {sum(alerting.values())} alerting verdicts "
            f"of {len(inside)} {dict(alerting.most_common(6)) or ''}").replace("  ", " ").strip()


def _top_stage(attribution: Any) -> str | None:
    if not isinstance(attribution, dict):
        return None
    stages = attribution.get("stages") or {}
    return attribution.get("top_stage") or (max(stages, key=stages.get) if stages else None)


def _length(delta: pd.Timedelta) -> str:
    hours = delta / pd.Timedelta(hours=1)
    return f"{hours / 24:g}d" if hours >= 24 else f"{hours:g}h"


def table(scores: list[CaseScore]) -> str:
    """The scores as a plain-text table, one block per case."""
    lines = []
    for s in scores:
        lines.append(f"{s.case}: {'PASS' if s.passed else 'FAIL'}")
        for c in s.criteria:
            lines.append(f"  [{'pass' if c.passed else 'MISS'}] {c.name}: {c.detail}")
        lines.append(f"  verdicts {s.facts.get('verdicts')}, findings {s.facts.get('findings')}, "
                     f"incidents {s.facts.get('incidents')}")
        lines.append(f"  quarantined {s.facts.get('quarantined') or '{}'}")
    return "\n".join(lines)
