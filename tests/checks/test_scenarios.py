"""The checks on the real pipeline: simulate each scenario, replay its logs into growing files, tick every
15 minutes with an injected clock on SQLite, and read the stored findings.

- healthy: no breach of any check in 24 windows of 15 min (~1,900 rows each), and windows of ~100 rows
  give only 'ok' or 'insufficient' from the drift checks.
- each incident scenario: at least one of its expected findings that a check exists for breaches, for
  the model version that carries the incident, in a window starting no later than onset + 2 windows.

Eight runs, two at a time: the healthy ones over 6 simulated hours; the incidents with the same 3 hours
before the onset and 1.5 after it (six windows: the test reads the first three; seeds 7-9 all breach in
the onset's own window).
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from checks.contract import REGISTRY
from checks.evaluate import evaluate  # noqa: F401 (registers every check)
from monitor.simulate import SCENARIOS

pytestmark = pytest.mark.slow

HOURS, ONSET_HOURS, AFTER_ONSET_HOURS, SEED = 6.0, 3.0, 1.5, 7
WINDOW = timedelta(minutes=15)
WITHIN = 2  # windows after the one holding the onset
DRIFT_CHECKS = {"drift", "prediction_drift", "length_distribution"}
# Expected findings the window checks do not measure: `quality` is scored from labels (tests/quality/).
NOT_BUILT = {"quality": "scored from labels, see tests/quality"}

# scenario -> (expected findings covered by a check today, not covered): the table the runs must meet.
TABLE = {
    "slower-batching": (("latency",), ()),
    "slower-cache": (("cache_hit_rate", "stale_cache", "latency"), ()),
    "worse-preprocessing": (("prediction_drift",), ("quality",)),
    "worse-threshold": (("prediction_drift",), ("quality",)),
    "both-long-inputs": (("length_distribution", "latency", "prediction_drift"), ("quality",)),
    "drift-new-category": (("unseen_categories", "out_of_range", "drift", "prediction_drift"), ()),
    "missing-fields": (("missing_rate",), ()),
}


def run_scenario(scenario: str, work: str, rate_per_s: float = 3.0, hours: float = HOURS) -> dict:
    """Generate, replay and tick one scenario; its ground truth and every stored finding (as dicts)."""
    from monitor import config as config_mod
    from monitor.demo import demo_config, replay
    from monitor.simulate import generate
    from storage.models import FindingRow
    from storage.store import Store

    root = Path(work)
    truth = generate(scenario, root / "generated", seed=SEED, hours=hours, onset_hours=ONSET_HOURS,
                     rate_per_s=rate_per_s, otlp=False)
    for kind in ("predictions", "timings"):
        (root / "logs" / kind).mkdir(parents=True, exist_ok=True)
    cfg = demo_config(root)
    cfg["services"][0]["buckets"]["windows"] = ["15m"]
    (root / "tailwatch.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    config = config_mod.load(root / "tailwatch.yaml")
    store = Store(config.storage.url)
    store.upgrade()
    try:
        reports = replay(root, config, store, truth, None, broken_lines=False)
        with store.transaction() as session:
            rows = session.execute(select(FindingRow)).scalars().all()
            findings = [{"check": r.check, "version": r.model_version, "start": r.window_start,
                         "labels": dict(r.labels or {}), "status": r.status, "value": r.value,
                         "baseline": r.baseline, "n": r.n} for r in rows]
    finally:
        store.dispose()
    return {"truth": truth, "findings": findings, "errors": [r.error for r in reports if r.status != "ok"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    """Every scenario at 3 requests/s, and `healthy-100` at ~100 requests per 15-minute window."""
    incident_hours = ONSET_HOURS + AFTER_ONSET_HOURS
    jobs = {s: (s, 3.0, HOURS if s == "healthy" else incident_hours) for s in SCENARIOS} | {
        "healthy-100": ("healthy", 100 / WINDOW.total_seconds(), HOURS)}
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        futures = {name: pool.submit(run_scenario, scenario, str(tmp_path_factory.mktemp(name)), rate, hours)
                   for name, (scenario, rate, hours) in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def _at(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


def _describe(f: dict) -> str:
    return f"{f['start']:%H:%M} {f['version']} {f['check']} {f['labels']}: {f['value']} vs {f['baseline']} (n={f['n']})"


def test_the_table_names_every_incident_and_only_checks_that_exist(runs):
    for scenario, (covered, missing) in TABLE.items():
        assert set(covered) | set(missing) == set(runs[scenario]["truth"].expected_findings), scenario
        assert set(covered) <= set(REGISTRY) and set(missing) <= set(NOT_BUILT), scenario
    assert set(TABLE) == set(SCENARIOS) - {"healthy"}


def test_healthy_raises_no_breach_in_twenty_windows(runs):
    run = runs["healthy"]
    assert run["errors"] == []
    windows = {f["start"] for f in run["findings"]}
    assert len(windows) >= 20
    assert [_describe(f) for f in run["findings"] if f["status"] == "breach"] == []


def test_healthy_serving_checks_measure_and_stay_ok(runs):
    """The checks of the serving path see what the simulator logs (cache_version, replica, notes) and
    judge it: 'ok' findings in most windows, so their silence above is not for want of data."""
    findings = [f for f in runs["healthy"]["findings"] if not f["labels"].get("segment")]
    windows = len({f["start"] for f in findings})

    def ok_windows(check, **labels):
        return len({f["start"] for f in findings if f["check"] == check and f["status"] == "ok"
                    and labels.items() <= f["labels"].items()})

    assert ok_windows("stale_cache") >= windows - 1
    assert ok_windows("hotspot", field="replica", measure="share") >= windows - 1
    assert ok_windows("hotspot", field="replica", measure="latency") >= windows // 2
    assert ok_windows("oov_rate", field="notes") >= windows - 1
    assert ok_windows("latency", length="len:notes", quantile="p50") >= windows - 1
    assert ok_windows("latency", queue="completions_vs_arrivals") >= windows - 1


def test_healthy_windows_of_100_rows_never_report_drift(runs):
    run = runs["healthy-100"]
    assert run["errors"] == []
    sizes = [f["n"] for f in run["findings"] if f["check"] == "drift" and not f["labels"].get("segment")]
    assert len(sizes) >= 20 and 60 <= sorted(sizes)[len(sizes) // 2] <= 160  # about 100 rows a window
    drift = [f for f in run["findings"] if f["check"] in DRIFT_CHECKS]
    assert drift and {f["status"] for f in drift} <= {"ok", "insufficient"}


def first_breach(run: dict, checks: tuple[str, ...]) -> tuple[datetime | None, list[str]]:
    """The first window (start) at or after the onset where one of `checks` breached for the incident's
    model version, and which findings breached in it."""
    truth = run["truth"]
    onset, version = _at(truth.onset), truth.model_versions["after"]
    hits = sorted((f for f in run["findings"] if f["check"] in checks and f["status"] == "breach"
                   and f["version"] == version and f["start"] + WINDOW > onset), key=lambda f: f["start"])
    if not hits:
        return None, []
    first = hits[0]["start"]
    return first, sorted({f["check"] for f in hits if f["start"] == first})


@pytest.mark.parametrize("scenario", list(TABLE))
def test_incident_breaches_an_expected_check_within_two_windows_of_onset(runs, scenario):
    run = runs[scenario]
    assert run["errors"] == []
    covered, _ = TABLE[scenario]
    first, checks = first_breach(run, covered)
    onset = _at(run["truth"].onset)
    assert first is not None, f"{scenario}: none of {covered} breached after the onset"
    late = (first - onset) // WINDOW
    assert late <= WITHIN, f"{scenario}: first breach {late} windows after onset ({checks})"


def test_print_scenario_table(runs, capsys):
    """The table: scenario, verdict, covered checks, first breaching window vs onset (shown with -s)."""
    lines = [f"{'scenario':22} {'verdict':8} {'first breach':13} {'breached':36} not covered"]
    for scenario, (covered, missing) in TABLE.items():
        first, checks = first_breach(runs[scenario], covered)
        offset = "-" if first is None else f"onset+{(first - _at(runs[scenario]['truth'].onset)) // WINDOW}w"
        verdict = "pass" if first is not None and offset <= f"onset+{WITHIN}w" else "FAIL"
        missing_text = ", ".join(f"{m} ({NOT_BUILT[m]})" for m in missing) or "-"
        lines.append(f"{scenario:22} {verdict:8} {offset:13} {','.join(checks) or '-':36} {missing_text}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
