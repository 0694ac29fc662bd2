"""An incident's whole life, scored against the simulator's ground truth: onset, first alert, premature
resolves, resolve after the fault ends, false pages, and the verdict of every window.

    .venv/bin/python bench/incidents.py                  # every scenario, live and as a backlog
    .venv/bin/python bench/incidents.py --short          # shorter runs at a lower rate
    .venv/bin/python bench/incidents.py slower-cache healthy-week --mode live
    .venv/bin/python bench/incidents.py segment-short    # one real-data case (docs/evaluation.md)
    .venv/bin/python bench/incidents.py generation-slower-de generation-healthy-2d --short

Each scenario is generated with a fault end (a rollback or fix; the before regime returns) and replayed
with the harness of tests/alerts/test_end_to_end.py (a tick every 15 minutes, then the alert stage and
the outbox drain against a local fake Slack Web API server, on a new Store each tick):
- live: every line is written when its time comes, a tick every 15 minutes from the start;
- backlog: the daemon starts half way through the fault with every earlier line already written, then
  ticks live to the end (healthy-week: starts on day 3, after the deploy; generation-healthy-2d on day 2).
The text-generation service (monitor/simulate/generation.py) is replayed the same way, its thumbs up /
down feedback written to the label log when it arrives (tests/simulate/generation_support.py): a
segment-only slowdown (`lang=de`, whose incident must name the segment) and a healthy two-day run.
The real-data cases (monitor/simulate/realdata.py) are replayed by `tailwatch backfill` (each step a
daemon tick, alerts included), live by their smallest window or as a backlog (one step to the middle of
the first fault, then live), and scored per injected fault: a slowdown on that window, a quality fault on the
smallest quality window (the only length the case scores labels on), over the windows whose labels had
arrived by the end of the run.
The scores are read from the store (incidents, verdicts), never from logs. Targets: onset error <= one
window; no resolve before the fault ends; resolved within 3 windows after it; the right verdict on
>= 95% of the fault's windows and none of the opposite kind (slower called worse or the reverse);
healthy runs: no page, and no warn or page from the equivalent deploy. Exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests"), str(ROOT / "tests" / "alerts"),
                str(ROOT / "tests" / "simulate")]

from incident_score import (  # noqa: E402  (bench/ is on sys.path above)
    COLUMNS,
    OPPOSITE,
    WINDOW,
    Score,
    Truth,
    _parse,
    confusion,
    incidents_about,
    misses,
    score,
    severity,
    window_truth,
)

__all__ = ["Truth", "Score", "confusion", "misses", "score", "severity", "window_truth"]
# The generation service's scenarios bench/incidents.py replays (generation-worse-ja is scored on hourly
# quality windows, not on this harness's 15-minute ones: tests/quality/test_feedback.py runs it).
GENERATION = ("generation-slower-de", "generation-healthy-2d")

@dataclass(frozen=True)
class Plan:
    """How long a scenario runs and when its fault starts and ends (hours from the start)."""

    hours: float
    rate: float
    onset: float | None
    fault_end: float | None
    backlog_until: float  # the backlog's first tick

    @classmethod
    def of(cls, scenario: str, short: bool) -> Plan:
        if scenario == "healthy-week":
            # long enough for every event (the last at 83 h); the backlog ends on day 3 after the deploy
            return cls(96.0 if short else 168.0, 0.3, None, None, 48.0 if short else 72.0)
        if scenario == "generation-healthy-2d":
            # two days, so each hour of the day is seen twice; the backlog starts on day 2 (short: at 36 h)
            return cls(48.0, 0.5, None, None, 36.0) if short else cls(48.0, 2.0, None, None, 24.0)
        if scenario == "generation-slower-de":  # lang=de carries 10% of the traffic: 270 requests a window
            return cls(4.0, 3.0, 1.0, 2.5, 1.75) if short else cls(8.0, 4.0, 2.0, 5.0, 3.5)
        if scenario == "healthy":
            return cls(4.0, 2.0, None, None, 2.0) if short else cls(8.0, 3.0, None, None, 4.0)
        if short:
            return cls(4.0, 2.0, 1.0, 2.5, 1.75)
        return cls(8.0, 3.0, 2.0, 5.0, 3.5)


def replay(scenario: str, plan: Plan, mode: str) -> tuple[Truth, Score, list[dict], float]:
    """Generate and replay one scenario in `mode` ("live" or "backlog"); its truth, score, stored incidents
    and seconds."""
    from alerts_support import FakeSlack
    from generation_support import run_generation
    from test_end_to_end import run

    from monitor.simulate import DEFAULT_START

    fake = FakeSlack()
    fake.thread.start()
    started = time.perf_counter()
    first_tick = DEFAULT_START + timedelta(hours=plan.backlog_until) if mode == "backlog" else None
    try:
        with tempfile.TemporaryDirectory(prefix=f"tw-{scenario}-{mode}-") as tmp:
            replay_one = run_generation if scenario in GENERATION else partial(run, monkeypatch=None)
            result = replay_one(scenario, Path(tmp), fake, hours=plan.hours, onset=plan.onset,
                                fault_end=plan.fault_end, rate=plan.rate, first_tick=first_tick)
    finally:
        fake.server.shutdown()
    truth = Truth.of(result["truth"])
    incidents = result["incidents"]
    return (truth, score(truth, incidents, result["verdicts"], first_tick=first_tick), incidents,
            time.perf_counter() - started)


# -- the real-data cases (monitor/simulate/realdata.py) -------------------------------------------------

def realdata_cases() -> dict:
    """The real-data evaluation cases by name: the full ones and the short ones the test suite runs."""
    from monitor.simulate import realcases, realdata

    made = [make() for make in realcases.all_cases().values()]
    return {c.name: c for c in made + realdata.short_cases() + realcases.short_cases()}


def replay_realdata(case, mode: str, root: Path) -> tuple[dict, list[dict], list[dict], datetime | None, float]:
    """Build one real-data case under `root` and replay it with `tailwatch backfill` (every step a daemon
    tick, alerts included): `live` steps through the whole range by the smallest window; `backlog` first
    takes one step to the middle of the first fault (the daemon starting with that much already logged),
    then goes on live. Returns the truth, the stored incidents and verdicts, the backlog's first tick (None
    live), and seconds."""
    from monitor.durations import parse_duration
    from monitor.simulate import realcases, realscore

    out = root / f"{case.name}-{mode}"
    started = time.perf_counter()
    truth = realcases.build_case(case, out)
    start, end = _parse(truth["start"]), _parse(truth["end"])
    step = parse_duration(case.step)
    first = min(truth["faults"], key=lambda f: f["onset"])
    middle = _parse(first["onset"]) + (_parse(first["end"]) - _parse(first["onset"])) / 2
    middle = start + (middle - start) // step * step
    runs = [(start, end, None)] if mode == "live" else [(start, middle, middle - start), (middle, end, None)]
    for command in (("db", "upgrade"), ("reference", "build")):
        realscore.checked(out, *command)
    for since, until, jump in runs:
        command = ("backfill", "--since", since.isoformat(), "--until", until.isoformat())
        if jump is not None:
            command += ("--step", f"{int(jump.total_seconds())}s")
        realscore.checked(out, *command)
    incidents, verdicts = realscore.stored(out)
    return truth, incidents, verdicts, None if mode == "live" else middle, time.perf_counter() - started


def case_window(case, kind: str, end: datetime) -> tuple[timedelta, datetime | None]:
    """The window a real-data fault is scored on, and for a quality fault the last window end whose labels
    had all arrived by the run's `end`. A slowdown is judged on the smallest window; a quality fault on
    the smallest quality window, the only lengths the case's config scores labels on."""
    from monitor.durations import parse_duration

    if kind != "quality":
        return parse_duration(case.step), None
    return min(map(parse_duration, case.quality_windows)), end - case.label_delay - case.label_jitter


def realdata_scores(case, truth: dict, incidents: list[dict], verdicts: list[dict],
                    first_tick: datetime | None = None) -> list[tuple[str, Truth, Score, timedelta]]:
    """One score per injected fault, each over its own stretch of the run: from the end of the fault before
    it (or the start: the healthy range counts with the first) to the onset of the next (or the end). A
    slowdown keeps the case's version; a quality fault serves its own version while it lasts. Each with the
    window it is scored on (case_window)."""
    from monitor.simulate import realscore

    start, end = _parse(truth["start"]), _parse(truth["end"])
    faults = sorted(truth["faults"], key=lambda f: f["onset"])
    out = []
    for i, fault in enumerate(faults):
        lo = start if i == 0 else _parse(faults[i - 1]["end"])
        hi = end if i + 1 == len(faults) else _parse(faults[i + 1]["onset"])
        onset, fault_end = _parse(fault["onset"]), _parse(fault["end"])
        window, labels_until = case_window(case, fault["kind"], end)
        t = Truth(fault["expected"][0], lo, hi, onset, None if fault_end >= end else fault_end, case.version,
                  fault.get("version", case.version), labels_until=labels_until)
        # Incidents opened in the stretch (or within the resolve allowance after it, before the next fault).
        mine = [x for x in incidents if lo <= x["opened_at"] < hi]
        windows = [v for v in verdicts if v["window_start"] >= lo and v["window_end"] <= hi]
        what = realscore.fault_name(fault)
        out.append((f"{case.name}: {fault['kind']} ({what})", t, score(t, mine, windows, window, first_tick), window))
    return out


def breakdown(truth: Truth, s: Score, incidents: list[dict], window: timedelta) -> str:
    """Markdown cells of one real-data fault: its windows right / opposite / drift / healthy / other, onset
    error, first alert, how its incidents resolved (the reason, and the time against the fault's end)."""
    from monitor.investigate.query import why

    faulty = Counter({p: n for (t, p), n in s.confusion.items() if t != "healthy"})
    right, opposite = faulty.pop(truth.verdict, 0), faulty.pop(OPPOSITE.get(truth.verdict, ""), 0)
    drift, healthy = faulty.pop("drift", 0), faulty.pop("healthy", 0)
    other = ", ".join(f"{k} {n}" for k, n in sorted(faulty.items())) or "0"
    resolves = []
    for i in incidents_about(truth, incidents, window):
        if i["resolved_at"] is None:
            resolves.append(f"{i['verdict']}: open")
            continue
        against = "" if truth.fault_end is None else f" ({_min((i['resolved_at'] - truth.fault_end) / timedelta(minutes=1))})"
        resolves.append(f"{i['verdict']}: {why(i)}{against}")
    return (f"{right} | {opposite} | {drift} | {healthy} | {other} | {_min(s.onset_error_min)} "
            f"| {_min(s.first_alert_min)} | {'; '.join(resolves) or '–'}")


BREAKDOWN_HEADER = ("| fault | window | right | opposite | drift | healthy | other | onset error | first alert "
                    "| resolved (reason, against the fault's end) |\n|---|---|---:|---:|---:|---:|---|---:|---:|---|")


def describe(incident: dict) -> str:
    """One stored incident on one line, for the log: verdict, version, severity, since, opened, resolved."""
    def hm(d: datetime | None) -> str:
        return "-" if d is None else f"{d:%a %H:%M}"

    return (f"{incident['verdict']} {incident.get('model_version') or ''} {severity(incident)}: since "
            f"{hm(incident['first_window_start'])}, opened {hm(incident['opened_at'])}, "
            f"resolved {hm(incident['resolved_at'])}")


def window_length(window: timedelta) -> str:
    hours = window / timedelta(hours=1)
    return f"{hours / 24:g}d" if hours >= 24 else f"{hours:g}h"


def _min(x: float | None) -> str:
    """Signed minutes, as hours or days when long."""
    if x is None:
        return "–"
    if abs(x) >= 2 * 24 * 60:
        return f"{x / 1440:+.1f} d"
    if abs(x) >= 120:
        return f"{x / 60:+.1f} h"
    return f"{x:+.0f} min"


def row(scenario: str, mode: str, truth: Truth, s: Score, window: timedelta = WINDOW) -> str:
    share = "–" if s.right_share is None else f"{s.right_share:.0%} ({s.opposite_windows} opposite)"
    missed = misses(truth, s, window)
    return (f"| {scenario} | {mode} | {truth.verdict} | {s.verdict} | {_min(s.onset_error_min)} "
            f"| {_min(s.first_alert_min)} | {_min(s.resolve_delay_min)} | {s.premature_resolves} "
            f"| {s.false_pages_per_day:.2f} | {share} | {'; '.join(missed) or 'ok'} |")


def confusion_table(total: Counter) -> list[str]:
    """Markdown: right verdict (rows) by stored verdict (columns), windows summed over the runs."""
    lines = ["| right \\ stored | " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    for right in ("slower", "worse", "both", "drift", "healthy"):
        if any(k[0] == right for k in total):
            lines.append(f"| {right} | " + " | ".join(str(total[(right, c)]) for c in COLUMNS) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    from alerts_support import TOKEN

    from monitor.simulate import ALL_SCENARIOS, realscore

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cases = realdata_cases()
    parser.add_argument("scenarios", nargs="*", help=f"default: all of {', '.join(ALL_SCENARIOS + GENERATION)} and the "
                        f"real-data cases (one of {', '.join(cases)}; the short ones with --short)")
    parser.add_argument("--short", action="store_true", help="4 h runs at 2 req/s (healthy-week: 4 days; "
                        "generation-slower-de: 3 req/s; generation-healthy-2d: 2 days at 0.5 req/s)")
    parser.add_argument("--mode", choices=("live", "backlog", "both"), default="both")
    args = parser.parse_args(argv)
    simulated = ALL_SCENARIOS + GENERATION
    unknown = sorted(set(args.scenarios) - set(simulated) - set(cases))
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; one of {', '.join((*simulated, *cases))}")
    short_cases = [name for name in cases if name.endswith("-short")]
    real = [cases[n] for n in args.scenarios if n in cases] if args.scenarios else \
        [cases[n] for n in cases if (n in short_cases) == args.short]
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    os.environ["TW_SLACK_TOKEN"] = TOKEN
    modes = ("live", "backlog") if args.mode == "both" else (args.mode,)
    rows, failed, total = [], [], {m: Counter() for m in modes}
    for scenario in [n for n in args.scenarios if n in simulated] if args.scenarios else simulated:
        plan = Plan.of(scenario, args.short)
        for mode in modes:
            truth, s, incidents, seconds = replay(scenario, plan, mode)
            rows.append(row(scenario, mode, truth, s))
            for incident in sorted(incidents, key=lambda i: i["opened_at"]):
                print(f"  incident {describe(incident)}", file=sys.stderr)
            total[mode].update(s.confusion)
            if misses(truth, s):
                failed.append(f"{scenario} ({mode})")
            print(f"{scenario} {mode}: {seconds:.0f} s; {rows[-1]}", file=sys.stderr, flush=True)
    real_rows, details, alarms = [], [], []
    if real:
        with tempfile.TemporaryDirectory(prefix="tw-realdata-") as tmp:
            for case in real:
                for mode in modes:
                    truth, incidents, verdicts, first_tick, seconds = replay_realdata(case, mode, Path(tmp))
                    for incident in sorted(incidents, key=lambda i: i["opened_at"]):
                        print(f"  incident {describe(incident)}", file=sys.stderr)
                    for name, t, s, window in realdata_scores(case, truth, incidents, verdicts, first_tick):
                        real_rows.append(row(name, mode, t, s, window))
                        details.append(f"| {name} ({mode}) | {window_length(window)} | {breakdown(t, s, incidents, window)} |")
                        if misses(t, s, window):
                            failed.append(f"{name} ({mode})")
                        print(f"{name} {mode}: {real_rows[-1]}", file=sys.stderr, flush=True)
                    alarms.append(f"{case.name} ({mode}): {realscore.healthy_alarms(truth, incidents, verdicts)}")
                    print(f"{case.name} {mode}: {seconds:.0f} s", file=sys.stderr, flush=True)
    header = ("| replay | right verdict | incident verdict | onset error | first alert | resolve after fault end "
              "| premature resolves | false pages / day | right verdict (fault windows) | misses |")
    if rows:
        length = ("4 h at 2 req/s, fault 1 h - 2.5 h; generation-slower-de 3 req/s" if args.short
                  else "8 h at 3 req/s, fault 2 h - 5 h; generation-slower-de 4 req/s")
        print(f"| scenario ({length}) {header}")
        print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---|")
        print("\n".join(rows))
        for mode in modes:
            print(f"\nVerdict per 15-minute window, {mode} (windows straddling the onset or fault end left out):\n")
            print("\n".join(confusion_table(total[mode])))
    if real_rows:
        print(f"\n| real-data fault (slowdown: the smallest window; quality: the smallest quality window) {header}")
        print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---|")
        print("\n".join(real_rows))
        print(f"\n{BREAKDOWN_HEADER}\n" + "\n".join(details))
        print("\nHealthy range (before the first fault): " + "\n".join(alarms))
    if failed:
        print(f"\nmissed a target: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
