"""Page times of the web UI on a month of history against a day (and a week) of it:
`python bench/ui.py [--days 30] [--versions 3] [--clients 50] [--rounds 1]`; and the screenshots in docs/img:
`python bench/ui.py --screenshots docs/img`.

Stores are filled the way bench/query.py fills one (a real 2-hour `healthy` run's 5-minute partials and
window findings copied onto every bucket and window of the span, per version), one with a day of history,
one with a week and one with `--days`, all ending at the same time, each with one incident over the last two
hours, then compacted as the daemon's retention would (default tiers: hourly partials after 14 days).
Each is served by uvicorn on 127.0.0.1 in this process (one worker, as `tailwatch ui` runs): each page
alone, 3 times (median), then `--clients` concurrent clients fetching the pages in turn for `--rounds`
rounds, first without the page cache and then with it, starting empty (as deployed after a tick). Times
are the server's to the last byte of the HTML (the browser's drawing of the charts is not in them). Prints
one JSON object: per store, each page's time alone and the p50 / p95 / max of the concurrent loads; and
the ratios of the same page on the month against the shortest history that fills it (a day; a week for
the 7-day overview). The slowest-requests page reads the raw log files, not the store, and is left out.

Then hostile loads on the month's store, served by `tailwatch ui`'s app in a child process (as deployed:
the page cache, the deploy files' glibc malloc settings): `--ranges` (50) distinct overview ranges and
`--slowest` (10) slowest-requests loads of its incident, all at once, over `--log-rows` (1.5M, about 470 MB
of CSV) prediction rows in its range; printed: the answers by status, the 5xx among them, and the server's
peak resident size (VmHWM) before and after.

`--screenshots DIR` instead runs the simulator's `worse-threshold` scenario with labels (the store the UI
tests read: v2's shifted threshold drops churn recall below its rule's floor) and writes, from Debian's
Chromium driven by Playwright, the incident page and the service overview around it at 1280 and 390 px
wide: ui-incident.png, ui-incident-phone.png, ui-service.png, ui-service-phone.png (the top of each page,
as a phone or laptop screen shows it first).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests" / "ui"), str(ROOT / "tests" / "reliability")]

from query import fill, seed_store  # noqa: E402  (bench/query.py)
from test_hostile_ui import MALLOC, write_logs  # noqa: E402  (tests/reliability/test_hostile_ui.py)
from ui_support import Served, scenario_run, serving  # noqa: E402  (tests/ui/ui_support.py)

FILLED_BY = {"/services/churn?span=7d": "week"}  # the shortest stored history a page's span is full on
PAGES = ("/", "/incidents/{incident}", "/services/churn", "/services/churn?span=7d", "/services/churn/quarantine",
         "/silences")


def add_incident(store, end: datetime) -> int:
    """One resolved `slower` incident of v1 over the last two hours (its findings are the copied ones)."""
    from storage.models import Incident

    with store.transaction() as session:
        row = Incident(service="churn", model_version="v1", verdict="slower", status="resolved",
                       opened_at=end - timedelta(hours=1, minutes=45), resolved_at=end,
                       first_window_start=end - timedelta(hours=2), last_window_end=end, fingerprint="bench",
                       updated_at=end)
        session.add(row)
        session.flush()
        return row.id


def fetch(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as response:
        response.read()
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")
    return time.perf_counter() - started


def concurrent(url: str, pages: list[str], clients: int, rounds: int) -> dict:
    urls = [url + pages[(c + r) % len(pages)] for r in range(rounds) for c in range(clients)]
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        times = sorted(pool.map(fetch, urls))
    wall = time.perf_counter() - started
    return {"loads": len(times), "wall_seconds": round(wall, 2), "p50_seconds": round(statistics.median(times), 3),
            "p95_seconds": round(statistics.quantiles(times, n=20)[18], 3), "max_seconds": round(times[-1], 3)}


def measure(cfg, store, end: datetime, incident: int, clients: int, rounds: int) -> dict:
    """Each page alone and the concurrent loads without the page cache, then the concurrent loads with it
    (as `tailwatch ui` runs)."""
    from monitor.ui.app import CACHE_SECONDS, create_app

    pages = [p.format(incident=incident) for p in PAGES]
    out = {}
    for name, seconds in (("uncached", 0.0), ("cached", CACHE_SECONDS)):
        with Served(create_app(cfg, store, clock=lambda: end, cache_seconds=seconds)) as served:
            fetch(served.url + "/static/plotly.min.js")  # the connection made, the file in the OS cache
            if not seconds:  # warm: templates compiled, the store's pages in the OS cache
                for page in pages:
                    fetch(served.url + page)
                out["alone_seconds"] = {page: round(statistics.median(fetch(served.url + page) for _ in range(3)), 3)
                                        for page in pages}
            out[name] = concurrent(served.url, pages, clients, rounds)
    return out


def peak_rss(pid: int) -> int:
    """A live process's peak resident size (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) >> 10
    return -1


def status_of(url: str) -> int:
    import urllib.error

    try:
        with urllib.request.urlopen(url, timeout=600) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code
    except OSError:
        return 599  # no answer: the connection dropped (the server died)


def hostile(config: Path, db: Path, work: Path, end: datetime, incident: int, ranges: int, slowest: int,
            log_rows: int) -> dict:
    """`ranges` distinct overviews and `slowest` slowest-requests loads at once against a child server."""
    import os
    import subprocess
    from collections import Counter

    import yaml

    written = write_logs(work / "hostile-logs", log_rows, 8, end - timedelta(hours=2), end)
    # The seed's config over the month's store and the written logs, beside the seed's (its relative paths).
    raw = yaml.safe_load(config.read_text())
    raw["storage"]["url"] = f"sqlite:///{db}"
    raw["services"] = raw["services"][:1]
    raw["services"][0]["sources"]["predictions"].update(path=str(work / "hostile-logs"), pattern="*.csv")
    served = config.with_name("hostile.yaml")
    served.write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {**os.environ, **MALLOC, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", "from monitor.cli import main; main()", "--config", str(served),
                              "ui", "--port", "0", "--now", end.isoformat()], stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        # "tailwatch ui on http://127.0.0.1:<port>/", printed once the port listens.
        url = child.stdout.readline().rsplit(" ", 1)[1].rstrip().rstrip("/")
        status_of(url + "/")
        idle = peak_rss(child.pid)
        spans = [(end - timedelta(days=1 + k % 28, hours=k), end - timedelta(hours=k)) for k in range(ranges)]
        urls = [f"{url}/services/churn?since={a:%Y-%m-%dT%H:%MZ}&until={b:%Y-%m-%dT%H:%MZ}" for a, b in spans]
        urls += [f"{url}/incidents/{incident}/requests"] * slowest
        started = time.perf_counter()
        with ThreadPoolExecutor(len(urls)) as pool:
            statuses = list(pool.map(status_of, urls))
        wall = time.perf_counter() - started
        alive = status_of(url + "/")
        peak = peak_rss(child.pid) if child.poll() is None else -1
    finally:
        child.terminate()
        child.communicate(timeout=120)
    return {"log_mb": round(written / 2**20), "log_rows": log_rows, "wall_seconds": round(wall, 1),
            "overview": dict(Counter(statuses[:ranges])), "slowest": dict(Counter(statuses[ranges:])),
            "5xx": sum(s >= 500 for s in statuses), "alive_after": alive, "idle_rss_mib": idle, "peak_rss_mib": peak}


# Screenshot sizes: a laptop's window and a phone's (CSS px); the shot is the first screen and a half.
SHOTS = {"": {"width": 1280, "height": 1500}, "-phone": {"width": 390, "height": 1400}}


def screenshots(out: Path) -> list[Path]:
    """The incident and service pages of a simulated quality incident, as PNGs in `out` (see the module)."""
    import shutil

    import pandas as pd
    from playwright.sync_api import sync_playwright

    from monitor.investigate import query
    from storage.store import Store

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium: install Debian's (sh tests/setup/debian.sh chromium chromium screenshots)")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(prefix="tailwatch-shots-") as tmp:
        run = scenario_run(Path(tmp), "worse-threshold", labels=True)
        store = Store(run["config"].storage.url)
        try:
            found = query.incidents(store, "churn", model_version=run["truth"].model_versions["after"])
        finally:
            store.dispose()
        if found.empty:
            raise SystemExit("the scenario opened no incident for its new version")
        start, end = (f"{t:%Y-%m-%dT%H:%MZ}" for t in (pd.Timestamp(run["truth"].start) - timedelta(hours=1),
                                                        pd.Timestamp(run["truth"].end) + timedelta(hours=1)))
        pages = {"ui-incident": f"/incidents/{int(found['id'].iloc[0])}",
                 "ui-service": f"/services/churn?since={start}&until={end}"}
        with serving(run["config"]) as (served, _), sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox"])
            for suffix, viewport in SHOTS.items():
                context = browser.new_context(viewport=viewport, device_scale_factor=1)
                page = context.new_page()
                for name, path in pages.items():
                    page.goto(served.url + path, wait_until="load")
                    page.wait_for_function("() => [...document.querySelectorAll('div.chart')].every("
                                           "el => el.querySelector('.main-svg'))")
                    target = out / f"{name}{suffix}.png"
                    page.screenshot(path=target)
                    written.append(target)
                context.close()
            browser.close()
    return written


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--only-hostile", action="store_true", help="the month's store and its hostile loads only")
    ap.add_argument("--ranges", type=int, default=50, help="distinct overview ranges loaded at once (hostile)")
    ap.add_argument("--slowest", type=int, default=10, help="slowest-requests loads at once (hostile)")
    ap.add_argument("--log-rows", type=int, default=1_500_000, help="raw prediction rows they read (hostile)")
    ap.add_argument("--screenshots", type=Path, metavar="DIR",
                    help="write the docs' screenshots into DIR instead of timing the pages")
    args = ap.parse_args()
    if args.screenshots is not None:
        for path in screenshots(args.screenshots):
            print(path)
        return

    from monitor.daemon import retention
    from storage.store import Store

    end = datetime(2026, 12, 1, tzinfo=UTC)
    out: dict = {"days": args.days, "versions": args.versions, "clients": args.clients, "rounds": args.rounds}
    with tempfile.TemporaryDirectory(prefix="tailwatch-bench-ui-") as tmp:
        work = Path(tmp)
        cfg, seed = seed_store(work / "seed")
        stores = (("day", 1), ("week", 7), ("month", args.days))
        for name, days in stores[2:] if args.only_hostile else stores:
            store = Store(f"sqlite:///{work / f'{name}.db'}")
            store.upgrade()
            counts = fill(seed, store, days, args.versions, end)
            retention.apply(cfg, store, end)
            incident = add_incident(store, end)
            if not args.only_hostile:
                out[name] = {**counts, **measure(cfg, store, end, incident, args.clients, args.rounds)}
                print(name, json.dumps(out[name]), flush=True)
            store.dispose()
            if name == "month":
                out["hostile"] = hostile(work / "seed" / "tailwatch.yaml", work / f"{name}.db", work, end, incident,
                                         args.ranges, args.slowest, args.log_rows)
                print("hostile", json.dumps(out["hostile"]), flush=True)
        seed.dispose()
    if args.only_hostile:
        return
    day, month = out["day"], out["month"]
    out["ratio"] = {**{f"p95 {name} vs {short}": round(month[name]["p95_seconds"] / out[short][name]["p95_seconds"], 2)
                       for name in ("uncached", "cached") for short in ("day", "week")},
                    **{page: round(month["alone_seconds"][page] / out[FILLED_BY.get(page, "day")]["alone_seconds"][page],
                                   2) for page in day["alone_seconds"]}}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
