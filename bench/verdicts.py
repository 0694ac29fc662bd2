"""Every simulator scenario end to end: verdict, delay of the first Slack message after the onset, and the
messages sent — the README's scenario table, printed as Markdown.

    .venv/bin/python bench/verdicts.py                       # all scenarios (3 h, 3 req/s, onset at 1.5 h)
    .venv/bin/python bench/verdicts.py slower-cache healthy

Each scenario is generated, replayed into a growing directory with a tick every 15 minutes, and after each
tick the alert stage and the outbox drain run against a local fake Slack Web API server (the same harness
as tests/alerts/test_end_to_end.py). Exits 1 when a scenario's incident verdict differs from its ground
truth, when it does not get exactly one Slack thread, or when `healthy` gets any message.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "alerts")]
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

from alerts_support import TOKEN, FakeSlack  # noqa: E402
from test_end_to_end import run  # noqa: E402

from monitor.simulate import SCENARIOS  # noqa: E402

os.environ["TW_SLACK_TOKEN"] = TOKEN
REGRESSIONS = ("slower", "worse", "both", "drift")


def one(scenario: str) -> tuple[dict, bool]:
    fake = FakeSlack()
    fake.thread.start()
    started = time.perf_counter()
    try:
        result = run(scenario, Path(tempfile.mkdtemp(prefix=f"tw-{scenario}-")), fake, None)
    finally:
        fake.server.shutdown()
    truth = result["truth"]
    onset = datetime.fromisoformat(truth.onset.replace("Z", "+00:00"))
    first = next((now for now, _, sent in result["log"] if sent.sent), None)
    incidents = [i for i in result["incidents"] if i["verdict"] in REGRESSIONS]
    estimated = any(v["estimated"] for v in result["verdicts"]
                    if v["window_start"] >= onset and v["verdict"] == (incidents[0]["verdict"] if incidents else ""))
    verdict = incidents[0]["verdict"] if incidents else "healthy"
    threads = len(fake.top_level)
    row = {
        "scenario": scenario, "truth": truth.verdict,
        "verdict": verdict + (" (estimated)" if estimated else ""),
        "delay": "–" if first is None else f"{(first - onset).total_seconds() / 60:.0f} min",
        "threads": threads, "posts": fake.calls.count("chat.postMessage"),
        "updates": fake.calls.count("chat.update"), "seconds": time.perf_counter() - started,
    }
    expected_threads = 0 if truth.verdict == "healthy" else 1
    ok = verdict == truth.verdict and threads == expected_threads
    return row, ok


def main() -> int:
    scenarios = sys.argv[1:] or list(SCENARIOS)
    rows, failed = [], []
    for scenario in scenarios:
        row, ok = one(scenario)
        rows.append(row)
        if not ok:
            failed.append(scenario)
        print(f"{scenario}: {row}", file=sys.stderr, flush=True)
    print("| scenario (3 h, 3 req/s, onset at 1.5 h) | right verdict | tailwatch's verdict | first message after onset "
          "| Slack threads | messages posted (thread replies included) / updated |")
    print("|---|---|---|---|---:|---|")
    for r in rows:
        print(f"| {r['scenario']} | {r['truth']} | {r['verdict']} | {r['delay']} | {r['threads']} "
              f"| {r['posts']} / {r['updates']} |")
    if failed:
        print(f"\nwrong verdict or thread count: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
