"""`tailwatch demo`: simulate a serving incident, replay its logs into a growing directory tick by tick
with an injected clock, and show what tailwatch saw next to the ground truth."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import yaml
from rich.console import Console
from rich.panel import Panel
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from monitor import config as config_mod
from monitor.aggregate.partial import ALL, Partial
from monitor.daemon.jobs import tick_job
from monitor.daemon.runner import TickReport, tick
from storage.store import Store

TICK_EVERY = timedelta(minutes=15)
# Malformed lines the demo appends once, so the quarantine is visible: (line, what is wrong with it).
BROKEN_LINES = [
    ('{{"request_id": "demo-bad-1", "ts": "{ts}", "model_vers', "truncated JSON"),
    ('{{"request_id": "demo-bad-2", "ts": "{ts}", "model_version": "v1", "status": "maybe"}}', "unknown status"),
    ('{{"ts": "{ts}", "model_version": "v1", "status": "ok"}}', "no request_id"),
]


def demo_config(work: Path) -> dict:
    """The config the demo writes: the simulator's churn service on SQLite."""
    return {
        "storage": {"url": "sqlite:///tailwatch.db"},
        "services": [{
            "name": "churn",
            "sources": {"predictions": {"kind": "files", "path": "./logs/predictions"},
                        "timings": {"kind": "files", "path": "./logs/timings"}},
            "schema": {
                "features": {"tenure": "numeric", "MonthlyCharges": "numeric", "Contract": "categorical",
                             "InternetService": "categorical", "notes": "text"},
                "segments": ["Contract"], "classes": ["No", "Yes"], "positive_class": "Yes",
                "signals": ["batch_size", "queue_depth"],
            },
            "reference": {"path": "./generated/reference.parquet"},
            "buckets": {"size": "5m", "windows": ["15m", "1h"]},
            "join": {"lateness": "5m"},
        }],
    }


def run_demo(scenario: str, hours: float, seed: int, keep: Path | None, console: Console) -> dict:
    """Run `scenario` for `hours` simulated hours, print what tailwatch saw on `console`; returns the summary
    record (what was read, breaches, incidents, the ground truth)."""
    from monitor.simulate import ALL_SCENARIOS, generate

    if scenario not in ALL_SCENARIOS:
        raise ValueError(f"--scenario: unknown scenario {scenario!r}; one of {', '.join(ALL_SCENARIOS)}")
    if hours <= 0:
        raise ValueError(f"--hours: must be positive, got {hours}")
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="tailwatch-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        console.print(f"[bold]tailwatch demo[/]: scenario [cyan]{scenario}[/], {hours:g} simulated hours, seed {seed}")
        with console.status("simulating the churn service ..."):
            truth = generate(scenario, work / "generated", seed=seed, hours=hours, otlp=False)
        for kind in ("predictions", "timings"):
            (work / "logs" / kind).mkdir(parents=True, exist_ok=True)
        (work / "tailwatch.yaml").write_text(yaml.safe_dump(demo_config(work), sort_keys=False))
        cfg = config_mod.load(work / "tailwatch.yaml")
        store = Store(cfg.storage.url)
        store.upgrade()
        # The daemon's tick job: ingest and checks, then verdicts, alerts and the (unconfigured) Slack outbox.
        reports = replay(work, cfg, store, truth, console, job=tick_job)
        summary = {"scenario": scenario, "hours": hours, "seed": seed, "kept_in": str(work) if keep else None,
                   **_show(console, store, reports, truth, keep)}
        store.dispose()
        if keep:
            # One line however narrow the terminal: the command is copied whole. The path is the user's.
            console.print(f"\nlogs, config and database kept in {work}; try "
                          f"`tailwatch --config {work / 'tailwatch.yaml'} explain 1`", soft_wrap=True, markup=False,
                          highlight=False)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return summary


def _lines_with_time(folder: Path, time_col: str) -> pd.DataFrame:
    """Every line of every part file with the time it becomes visible to a log shipper."""
    frames = []
    for part in sorted(folder.glob("part-*.jsonl")):
        raw = part.read_bytes().splitlines()
        times = pd.read_json(part, lines=True, dtype=False, convert_dates=False)[time_col]
        frames.append(pd.DataFrame({"line": raw, "at": pd.to_datetime(times, utc=True, format="ISO8601")}))
    return pd.concat(frames, ignore_index=True).sort_values("at", kind="stable")


def replay(work: Path, cfg, store: Store, truth, console: Console | None = None, *,
           broken_lines: bool = True, job=tick, first_tick: datetime | None = None) -> list[TickReport]:
    """Append each line of `work/generated` to `work/logs` when its time comes (one file per hour, as a
    logger rotates) and run `job(cfg, store, now)` every 15 min with the clock at the tick (`tick`, or the
    daemon's `jobs.tick_job` with its verdict and alert stages); `broken_lines` appends the demo's
    malformed lines once. `first_tick` (on the 15-minute grid from the start) replays a backlog: every
    line up to it is written before the first tick runs there. Returns one report per tick."""
    preds = _lines_with_time(work / "generated" / "predictions", "ts")
    timings = _lines_with_time(work / "generated" / "timings", "start_ts")
    start, end = pd.Timestamp(truth.start), pd.Timestamp(truth.end)
    live = {"predictions": work / "logs" / "predictions", "timings": work / "logs" / "timings"}
    reports = []
    steps = int((end - start) / TICK_EVERY) + 1
    first = 1
    if first_tick is not None:
        first = (pd.Timestamp(first_tick) - start) / TICK_EVERY
        if first != int(first) or not 1 <= first <= steps:
            raise ValueError(f"first_tick must be on the 15-minute grid within the run, got {first_tick}")
        first = int(first)
    with Progress(console=console, transient=True, disable=console is None) as progress:
        task = progress.add_task("ticking", total=steps - first + 1)
        for step in range(first, steps + 1):
            now = min(start + step * TICK_EVERY, end + TICK_EVERY)
            prev = now - TICK_EVERY if step > first else start - TICK_EVERY
            for kind, rows in (("predictions", preds), ("timings", timings)):
                window = rows[(rows["at"] > prev) & (rows["at"] <= now)]
                for hour, group in window.groupby(window["at"].dt.floor("h")):
                    with open(live[kind] / f"{kind}-{hour:%Y%m%d%H}.jsonl", "ab") as fh:
                        fh.write(b"\n".join(group["line"]) + b"\n")
            if step == first + 1 and broken_lines:
                with open(live["predictions"] / "late-batch.jsonl", "ab") as fh:
                    ts = f"{now - timedelta(minutes=1):%Y-%m-%dT%H:%M:%SZ}"
                    fh.write("".join(line.format(ts=ts) + "\n" for line, _ in BROKEN_LINES).encode())
            reports.append(job(cfg, store, now.to_pydatetime())[0])
            progress.advance(task)
    return reports


def _show(console: Console, store: Store, reports: list[TickReport], truth, keep: Path | None) -> dict:
    read, accepted, quarantined = Counter(), Counter(), Counter()
    for r in reports:
        read.update(r.read)
        accepted.update(r.accepted)
        quarantined.update(r.quarantined)
    totals = Table(title=f"ingest over {len(reports)} ticks", show_header=False)
    totals.add_column(style="bold")
    totals.add_column(justify="right")
    for kind in sorted(read):
        totals.add_row(f"{kind} read / accepted", f"{read[kind]:,} / {accepted[kind]:,}")
    totals.add_row("quarantined", f"{sum(quarantined.values()):,}")
    for reason, n in quarantined.most_common():
        totals.add_row(f"  {reason}", f"{n:,}")
    totals.add_row("joined with stage timings", f"{sum(r.joined for r in reports):,}")
    totals.add_row("unmatched (timings never came)", f"{sum(r.unmatched for r in reports):,}")
    totals.add_row("orphan timings", f"{sum(r.orphan_timings for r in reports):,}")
    totals.add_row("duplicate request_ids", f"{sum(r.duplicates for r in reports):,}")
    console.print(totals)
    console.print(f"[dim]the demo appended {len(BROKEN_LINES)} malformed lines on purpose: "
                  f"{'; '.join(why for _, why in BROKEN_LINES)}[/]")
    console.print(_hourly(store, truth))
    breaches = _breach_groups(store)
    for part in _breaches(breaches, truth, keep):
        console.print(part, soft_wrap=isinstance(part, Text))
    console.print(_verdicts(store, truth))
    for panel in _incidents(store):
        console.print(panel)
    onset = _onset(truth)
    when = "no fault" if onset is None else f"onset {onset:%Y-%m-%d %H:%M} UTC"
    if truth.fault_end is not None:
        when += f", fault ends {pd.Timestamp(truth.fault_end):%Y-%m-%d %H:%M} UTC"
    console.print(Panel(
        f"[bold]{truth.scenario}[/] — right verdict: [bold]{truth.verdict}[/]\n"
        f"{when}: {truth.what_changed}\n"
        f"versions: {truth.model_versions}   affected: {truth.affected}\n"
        f"expected findings: {', '.join(truth.expected_findings) or 'none'}",
        title="ground truth", expand=False))
    with store.transaction() as session:
        incidents = store.incidents.load(session, "churn")[::-1]
    return {"ticks": len(reports), "read": dict(read), "accepted": dict(accepted), "quarantined": dict(quarantined),
            "breaches": [{k: v for k, v in g.items() if k != "found"} for g in breaches],
            "incidents": [{k: i[k] for k in ("id", "verdict", "status", "opened_at")} for i in incidents],
            "truth": {"verdict": truth.verdict, "onset": _onset(truth), "what_changed": truth.what_changed}}


def _onset(truth) -> datetime | None:
    """The fault's onset as a UTC datetime; None when the run has no fault."""
    return None if truth.onset is None else pd.Timestamp(truth.onset).to_pydatetime()


VERDICT_STYLE = {"healthy": "green", "slower": "red", "worse": "magenta", "both": "bold red", "drift": "yellow",
                 "insufficient_data": "dim", "no_data": "dim"}


def _verdicts(store: Store, truth) -> Table:
    """The verdict of each 15-minute window, runs of the same verdict folded into one line."""
    with store.transaction() as session:
        rows = store.verdicts.search(session, "churn")
    rows = [(r["window_start"], r["window_end"], r["model_version"],
             r["verdict"] + (" (estimated)" if r["estimated"] else ""), r["summary"])
            for r in rows if r["window_end"] - r["window_start"] == DEMO_WINDOW]
    onset = _onset(truth)
    table = Table(title="verdict per 15-minute window")
    for col in ("from", "to", "version", "verdict", "why"):
        table.add_column(col, no_wrap=col != "why")
    runs: list[list] = []
    for start, end, version, verdict, summary in rows:
        last = next((r for r in reversed(runs) if r[2] == version), None)
        if last is not None and last[3] == verdict and last[1] == start:
            last[1] = end
        else:
            runs.append([start, end, version, verdict, summary])
    for start, end, version, verdict, summary in sorted(runs, key=lambda r: (r[0], r[2])):
        mark = " ◀" if onset is not None and start <= onset < end else ""
        style = VERDICT_STYLE.get(verdict.split(" ")[0], "")
        table.add_row(f"{start:%H:%M}{mark}", f"{end:%H:%M}", version, f"[{style}]{verdict}[/]",
                      "" if verdict.startswith("healthy") else summary)
    table.caption = "◀ the run holding the onset; 'why' is the verdict's own one-line summary"
    return table


def _incidents(store: Store) -> list[Panel]:
    """Each incident as the Slack message on-call would get (the demo has no Slack: this is the outbox)."""
    from monitor.alerts.render import render, terminal
    with store.transaction() as session:
        incidents = store.incidents.load(session, "churn")[::-1]  # oldest first
    panels = [Panel(terminal(render(incident, "post", "open", None)), expand=False,
                    title=f"incident {incident['id']} ({incident['status']}): the Slack message")
              for incident in incidents[:3]]
    if not incidents:
        panels.append(Panel("no incident opened: nothing would have been sent to Slack", expand=False))
    return panels


DEMO_WINDOW = timedelta(minutes=15)


def _breach_groups(store: Store) -> list[dict]:
    """Breaching findings of the 15-minute windows, one per check and labels, most severe first (the largest
    departure of a window from its baseline, relative to it), then earliest."""
    with store.transaction() as session:
        # All traffic only: the per-segment findings repeat the same story once per segment.
        rows = [f for f in store.findings.load(session, "churn")
                if f["status"] == "breach" and f["window_end"] - f["window_start"] == DEMO_WINDOW
                and "segment" not in f["labels"]]
    groups: dict[tuple, list[dict]] = {}
    for f in rows:
        key = (f["check"], f["model_version"], " ".join(str(v) for _, v in sorted(f["labels"].items())))
        groups.setdefault(key, []).append(f)
    out = [{"check": check, "model_version": version, "what": labels, "windows": len(found),
            "first_window": found[0]["window_start"], "value": found[0]["value"], "baseline": found[0]["baseline"],
            "severity": max(_departure(f) for f in found), "found": found}
           for (check, version, labels), found in groups.items()]
    return sorted(out, key=lambda g: (-g["severity"], g["first_window"], g["check"], g["what"]))


def _departure(finding: dict) -> float:
    """How far a finding's value is from its baseline, relative to the baseline; 0 when either is missing."""
    value, baseline = finding["value"], finding["baseline"]
    if value is None or baseline is None:
        return 0.0
    return abs(value - baseline) / abs(baseline) if baseline else float(value != baseline)


def _breaches(groups: list[dict], truth, keep: Path | None, limit: int = 10) -> list[Table | Text | str]:
    """The breach groups as a table, the first `limit` of them; under a cut table, the command that shows the
    rest (a line of its own: it is copied, never wrapped inside the table)."""
    if not groups:
        return ["[green]no breaches: every 15-minute window stayed within its thresholds[/]"]
    onset = _onset(truth)
    table = Table(title="what tailwatch found: breaching 15-minute windows, most severe first")
    several = len({g["model_version"] for g in groups}) > 1
    for col in ("from", "windows", "check", "what", "value", "baseline"):
        table.add_column(col, justify="right" if col in ("windows", "value", "baseline") else "left",
                         no_wrap=col != "what")
    for g in groups[:limit]:
        when = g["first_window"]
        mark = " ◀" if onset is not None and when <= onset < when + DEMO_WINDOW else ""
        what = f"{g['model_version']} {g['what']}" if several else g["what"]
        table.add_row(f"{when:%H:%M}{mark}", f"{g['windows']:,}", g["check"], what, _fmt(g["value"]),
                      _fmt(g["baseline"]))
    table.caption = "◀ the window holding the onset"
    if len(groups) <= limit:
        return [table]
    config = f"--config {keep / 'tailwatch.yaml'} " if keep else ""
    rerun = "" if keep else " (after a rerun of the demo with --keep DIR: the database is gone)"
    return [table, Text(f"{len(groups) - limit:,} more breaching windows; all of them: "
                        f"tailwatch {config}query findings --status breach --window 15m --segment all{rerun}")]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _hourly(store: Store, truth) -> Table:
    """Stored bucket counts rolled up per hour and model version: what a window sees."""
    start, end = pd.Timestamp(truth.start).to_pydatetime(), pd.Timestamp(truth.end).to_pydatetime()
    with store.transaction() as session:
        rows = store.partials.load(session, "churn", start - timedelta(hours=1), end + timedelta(hours=1), segment=ALL)
    per: dict[tuple[datetime, str], Partial] = {}
    for row in rows:
        key = (row.bucket_start.replace(minute=0, second=0, microsecond=0), row.model_version)
        part = Partial.from_bytes(row.payload)
        per[key] = per[key].merge(part) if key in per else part
    onset = _onset(truth)
    table = Table(title="stored per hour (UTC), from the bucket partials")
    for col in ("hour", "version", "requests", "ok", "timeout", "rejected", "error"):
        table.add_column(col, justify="left" if col in ("hour", "version") else "right", no_wrap=True)
    for (hour, version), part in sorted(per.items()):
        c = part.counts
        marker = " ◀" if onset is not None and hour <= onset < hour + timedelta(hours=1) else ""
        table.add_row(f"{hour:%H:00}{marker}", version, f"{c['rows']:,}", f"{c['status:ok']:,}",
                      f"{c['status:timeout']:,}", f"{c['status:rejected']:,}", f"{c['status:error']:,}")
    table.caption = "◀ the hour the incident starts"
    return table
