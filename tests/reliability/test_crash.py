"""Crash recovery: a process killed with SIGKILL at seeded points of outbox sends and nightly runs, then
restarted, ends with the stored state (and, for Slack, what the fake Slack server received) of an
uninterrupted run: every notification delivered exactly once, every quality finding as if never killed.
(Ticks killed at random moments: tests/ops/test_exactly_once.py, also in `make reliability`.)

The worker processes are forked from a multiprocessing forkserver that has imported tailwatch once, so a
kill and a restart cost milliseconds, not an interpreter start. A kill point is either the n-th store
transaction of the process (just before or just after its commit; the process kills itself with SIGKILL)
or the n-th Slack call of a kind (the fake Slack server kills the process before it acts, or after it
acted and before it answers: the response is lost with the process).

Seeded; TAILWATCH_CRASH_POINTS=20 tries more points per kind, TAILWATCH_CRASH_SEED another draw.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import secrets
import shutil
import signal
import sys
import time
from collections import Counter
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / d) for d in ("alerts", "quality")]
from alerts_support import FakeSlack, make_config  # noqa: E402
from support import at as sim_at  # noqa: E402
from support import quality_config, release_labels, simulate  # noqa: E402
from test_after_tick import at, write_window  # noqa: E402

from storage.store import Store  # noqa: E402

pytestmark = pytest.mark.reliability

SEED = int(os.environ.get("TAILWATCH_CRASH_SEED", "20261203"))
POINTS = int(os.environ.get("TAILWATCH_CRASH_POINTS", "0"))  # 0: the CI sizes below
TIMEOUT = 90  # seconds any one worker may take before the test fails

# --- the worker side: runs in a process forked from the forkserver ------------------------------------------

_done = {"transactions": 0}


def _arm(kill: tuple | None) -> None:
    """Count this process's store transactions; with kill ("txn", n, "before" | "after"), SIGKILL itself
    just before or just after the n-th one commits."""
    real = Store.transaction

    @contextmanager
    def counted(self):
        with real(self) as session:
            yield session
            _done["transactions"] += 1
            if kill == ("txn", _done["transactions"], "before"):
                os.kill(os.getpid(), signal.SIGKILL)
        if kill == ("txn", _done["transactions"], "after"):
            os.kill(os.getpid(), signal.SIGKILL)

    Store.transaction = counted


def _no_proxy() -> None:
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        os.environ.pop(var, None)


OUTBOX_VERSIONS = ("v2", "v3")
OUTBOX_SHAPES = ["slower", "slower", "healthy", "healthy", "healthy"]
OUTBOX_STEPS = [at(k) for k in range(1, len(OUTBOX_SHAPES) + 1)]


def _outbox_config(work: Path, slack_url: str):
    """Two model versions, each its own incident; Slack with a bot token read from a file."""
    token = work / "slack-token"
    slack = {"token": {"file": str(token)}, "channel": "#alerts", "base_url": slack_url, "timeout": "2s"}
    return make_config(work, alerts={"verdict": {"for": "0s", "resolve_after": 1}, "group_wait": "0s",
                                     "slack": slack}, accepted=["v1"])


def outbox_worker(work: str, slack_url: str, kill: tuple | None) -> None:
    """The daemon's after-tick stages, step by step: after_tick then drain; a restart redoes the step it
    was killed in (the progress file says which steps completed), then a last drain an hour later."""
    from monitor.alerts.evaluate import after_tick
    from monitor.notify import drain

    _no_proxy()
    _arm(kill)
    root = Path(work)
    config = _outbox_config(root, slack_url)
    store = Store((root / "db_url").read_text())
    progress = root / "progress"
    done = int(progress.read_text()) if progress.exists() else 0
    for i in range(done, len(OUTBOX_STEPS)):
        after_tick(config, store, OUTBOX_STEPS[i])
        drain(config, store, OUTBOX_STEPS[i] + timedelta(minutes=1))
        progress.write_text(str(i + 1))
    drain(config, store, OUTBOX_STEPS[-1] + timedelta(hours=1))  # retries left by the last step
    (root / "counts.json").write_text(json.dumps(_done))


def nightly_worker(work: str, now: str, kill: tuple | None) -> None:
    """One nightly quality run at `now`."""
    from monitor.daemon.nightly import run_nightly

    _arm(kill)
    root = Path(work)
    store = Store(f"sqlite:///{root / 'tw.db'}")
    run_nightly(nightly_config(root), store, datetime.fromisoformat(now))
    (root / "counts.json").write_text(json.dumps(_done))


def nightly_config(root: Path):
    return quality_config(root, "sqlite://", coverage_threshold=0.3)


# --- the test side ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def forkserver():
    """A multiprocessing context whose workers fork from a server that imported tailwatch once."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["monitor.alerts.evaluate", "monitor.notify", "monitor.daemon.nightly", "storage.store",
                                "alerts_support", "support", "test_after_tick", "test_crash"])
    return ctx


def run_worker(ctx, target, *args, victim: dict | None = None) -> int:
    """Run `target(*args)` in a forked worker; its exit code (-9 when killed)."""
    proc = ctx.Process(target=target, args=args)
    proc.start()
    if victim is not None:
        victim["pid"] = proc.pid
    proc.join(TIMEOUT)
    if proc.exitcode is None:
        proc.kill()
        proc.join(10)
        pytest.fail(f"{target.__name__} still running after {TIMEOUT} s")
    return proc.exitcode


def _dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


class KillingSlack(FakeSlack):
    """The fake Slack Web API that SIGKILLs the worker at its `plan` = (method, n, "before" | "after"):
    the n-th call of `method` (counted per worker run), before acting or after acting and before
    answering."""

    def __init__(self) -> None:
        super().__init__()
        self.plan: tuple | None = None
        self.victim: dict = {}
        self.seen: Counter = Counter()
        self.kills = 0
        self.server.handle_error = lambda request, address: None  # answers to a killed worker go nowhere

    def arm(self, plan: tuple | None) -> dict:
        self.plan, self.victim, self.seen = plan, {}, Counter()
        return self.victim

    def _kill(self) -> None:
        deadline = time.monotonic() + 10
        while "pid" not in self.victim and time.monotonic() < deadline:
            time.sleep(0.005)
        pid = self.victim["pid"]
        os.kill(pid, signal.SIGKILL)
        while not _dead(pid) and time.monotonic() < deadline:
            time.sleep(0.005)
        self.kills += 1

    def act(self, method: str, params: dict) -> dict:
        self.seen[method] += 1
        hit = self.plan is not None and self.plan[:2] == (method, self.seen[method])
        if hit and self.plan[2] == "before":
            self._kill()
            return {"ok": False, "error": "fatal_error"}  # nobody is left to read it
        body = super().act(method, params)
        if hit and self.plan[2] == "after":
            self._kill()
        return body


def dedup_key(msg: dict) -> str | None:
    meta = msg.get("metadata")
    if isinstance(meta, str):
        meta = json.loads(meta)
    return ((meta or {}).get("event_payload") or {}).get("dedup_key")


def slack_state(fake: FakeSlack) -> tuple[Counter, list]:
    """(messages per dedup key, every message as it reads now: channel, reply or not, text, edited)."""
    per_key = Counter(dedup_key(m) for m in fake.messages)
    final = sorted((m["channel"], bool(m["thread_ts"]), m["text"], m["edits"] > 0) for m in fake.messages)
    return per_key, final


def outbox_state(store: Store) -> tuple[list, list]:
    """(outbox items: kind, dedup key, status; incidents: version, status, verdict, revision, posted)."""
    from sqlalchemy import select

    from storage.models import Incident, Outbox

    with store.transaction() as session:
        items = sorted((o.kind, o.dedup_key, o.status) for o in session.scalars(select(Outbox)))
        incidents = sorted((i.model_version, i.status, i.verdict, i.revision, i.slack_ts is not None)
                           for i in session.scalars(select(Incident)))
    return items, incidents


def posted_ts(store: Store) -> set[str]:
    """The Slack ts each incident's updates and replies go to."""
    from sqlalchemy import select

    from storage.models import Incident

    with store.transaction() as session:
        return {i.slack_ts for i in session.scalars(select(Incident))}


def sizes(default: int) -> int:
    return POINTS or default


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def outbox_work(request, tmp_path):
    """A callable making a work dir with its own migrated database (its URL in `db_url`) holding the
    episode's windows, and the Slack token file; on SQLite a copy of one template, on PostgreSQL a schema."""
    schemas: list[str] = []
    admin = None
    if request.param == "postgres":
        url, _ = request.getfixturevalue("pg_schema")  # skips (or fails under CI) without the server
        admin = create_engine(url)

    def migrated(db: str) -> None:
        store = Store(db)
        store.upgrade()
        for version in OUTBOX_VERSIONS:
            for k, shape in enumerate(OUTBOX_SHAPES):
                write_window(store, k, shape, version)
        store.dispose()

    def fresh(name: str) -> Path:
        work = tmp_path / name
        if admin is None:
            template = tmp_path / "template"
            if not template.exists():
                template.mkdir()
                migrated(f"sqlite:///{template / 'tw.db'}")
            shutil.copytree(template, work)
            db = f"sqlite:///{work / 'tw.db'}"
        else:
            work.mkdir()
            schema = f"tw_crash_{secrets.token_hex(5)}"
            with admin.begin() as conn:
                conn.execute(text(f'CREATE SCHEMA "{schema}"'))
            schemas.append(schema)
            db = make_url(url).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
                hide_password=False)
            migrated(db)
        (work / "db_url").write_text(db)
        (work / "slack-token").write_text("xoxb-test-0123456789-SECRETVALUE\n")
        (work / "slack-token").chmod(0o600)
        return work

    yield fresh
    if admin is not None:
        with admin.begin() as conn:
            for schema in schemas:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def test_outbox_sends_killed_at_seeded_points_deliver_exactly_once(outbox_work, forkserver, record_property):
    fresh = outbox_work
    fake = KillingSlack()
    fake.thread.start()
    try:
        # The uninterrupted run: what every crashed-and-restarted run must end with.
        ref_work = fresh("reference")
        fake.arm(None)
        assert run_worker(forkserver, outbox_worker, str(ref_work), fake.base_url, None) == 0
        ref_calls = Counter(fake.calls)
        ref_slack = slack_state(fake)
        ref_store = Store((ref_work / "db_url").read_text())
        ref_items = outbox_state(ref_store)
        ref_store.dispose()
        transactions = json.loads((ref_work / "counts.json").read_text())["transactions"]
        kinds = Counter(kind for kind, _, _ in ref_items[0])
        assert kinds["post"] == len(OUTBOX_VERSIONS) and kinds["update"] and kinds["reply"], ref_items
        assert {s for _, _, s in ref_items[0]} == {"sent"}
        assert all(n == 1 for n in ref_slack[0].values()) and sum(ref_slack[0].values()) == len(fake.messages)

        # Seeded points: a post killed before Slack saw it, a post Slack accepted whose outcome was never
        # stored, an update likewise, then store transactions (before / after commit) drawn at random.
        rng = random.Random(SEED)
        points: list[tuple] = [("chat.postMessage", rng.randint(1, ref_calls["chat.postMessage"]), "before"),
                               ("chat.postMessage", rng.randint(1, ref_calls["chat.postMessage"]), "after"),
                               ("chat.update", rng.randint(1, ref_calls["chat.update"]), "after")]
        points += [("txn", rng.randint(1, transactions), rng.choice(["before", "after"]))
                   for _ in range(sizes(5 if ref_work.joinpath("tw.db").exists() else 2))]
        points += [("chat.postMessage", rng.randint(1, ref_calls["chat.postMessage"]), rng.choice(["before", "after"]))
                   for _ in range(max(POINTS - 3, 0))]

        crashes = lost = duplicates = 0
        problems = []
        for n, point in enumerate(points):
            work = fresh(f"point-{n}")
            fake.messages.clear()
            fake.calls.clear()
            kill = point if point[0] == "txn" else None
            victim = fake.arm(None if kill else point)
            code = run_worker(forkserver, outbox_worker, str(work), fake.base_url, kill, victim=victim)
            assert code == -signal.SIGKILL, (point, code)  # every point lies on the uninterrupted path
            crashes += 1
            fake.arm(None)
            assert run_worker(forkserver, outbox_worker, str(work), fake.base_url, None) == 0, point
            per_key, final = slack_state(fake)
            lost += sum(max(ref_slack[0][k] - per_key[k], 0) for k in ref_slack[0])
            duplicates += sum(max(per_key[k] - ref_slack[0][k], 0) for k in per_key)
            store = Store((work / "db_url").read_text())
            items = outbox_state(store)
            threads = posted_ts(store)
            store.dispose()
            lost += sum(1 for _, _, status in items[0] if status != "sent")
            if (per_key, final, items) != (ref_slack[0], ref_slack[1], ref_items):
                problems.append((point, {k: v for k, v in per_key.items() if v != 1}, items))
            # Every incident's thread is the one message Slack holds for its post.
            assert threads <= {m["ts"] for m in fake.messages if not m["thread_ts"]}, point
        record_property("rel_inputs", len(points))
        record_property("rel_faults", len(points))
        record_property("rel_crashes", crashes)
        record_property("rel_rows", len(ref_items[0]) * len(points))
        record_property("rel_rows_lost", lost)
        record_property("rel_duplicates", duplicates)
        assert not problems, problems
        assert lost == 0 and duplicates == 0
    finally:
        fake.server.shutdown()
        fake.server.server_close()


NIGHTLY_HOURS = 2.0


def finding_table(store: Store) -> dict:
    """Every stored finding by identity, without its id and wall-clock write time (`created_at`, stamped
    again by every rewrite, so it differs between any two runs)."""
    with store.transaction() as session:
        rows = store.findings.load(session, "churn")
    return {(f["check"], f["model_version"], f["window_start"], f["window_end"], f["labels_key"]):
            {k: v for k, v in f.items() if k not in ("id", "created_at")} for f in rows}


def test_nightly_killed_at_seeded_points_equals_an_uninterrupted_run(tmp_path, forkserver, record_property):
    template = tmp_path / "template"
    template.mkdir()
    truth, labels = simulate("worse-threshold", template, hours=NIGHTLY_HOURS)
    store = Store(f"sqlite:///{template / 'tw.db'}")
    store.upgrade()
    # The tick scores with the first few labels; by the nightly run's clock the windows have matured by age,
    # so the nightly run writes quality figures the tick could not.
    release_labels(template, labels, sim_at(truth, 0.2), 0)
    from monitor.daemon.runner import tick

    [report] = tick(nightly_config(template), store, sim_at(truth, 0.2))
    assert report.status == "ok", report.error
    before = finding_table(store)
    store.dispose()
    now = sim_at(truth, 96.0).isoformat()

    def fresh(name: str) -> Path:
        work = tmp_path / name
        shutil.copytree(template, work, symlinks=True)
        return work

    ref_work = fresh("reference")
    assert run_worker(forkserver, nightly_worker, str(ref_work), now, None) == 0
    ref_store = Store(f"sqlite:///{ref_work / 'tw.db'}")
    expected = finding_table(ref_store)
    ref_store.dispose()
    transactions = json.loads((ref_work / "counts.json").read_text())["transactions"]
    changed = sum(1 for k, v in expected.items() if before.get(k) != v)
    assert changed > 20 and transactions >= 2  # the run has something to lose

    rng = random.Random(SEED + 1)
    every = [("txn", n, phase) for n in range(1, transactions + 1) for phase in ("before", "after")]
    points = rng.sample(every, min(sizes(4), len(every)))
    crashes = lost = duplicates = 0
    for n, point in enumerate(points):
        work = fresh(f"point-{n}")
        assert run_worker(forkserver, nightly_worker, str(work), now, point) == -signal.SIGKILL, point
        crashes += 1
        assert run_worker(forkserver, nightly_worker, str(work), now, None) == 0, point
        store = Store(f"sqlite:///{work / 'tw.db'}")
        got = finding_table(store)
        store.dispose()
        lost += sum(1 for k in expected if k not in got)
        duplicates += sum(1 for k in got if k not in expected)
        different = [k for k in expected if k in got and got[k] != expected[k]]
        assert not different, (point, [(k, {f: (got[k][f], expected[k][f]) for f in got[k] if got[k][f] != expected[k][f]}) for k in different[:3]])
    record_property("rel_inputs", len(points))
    record_property("rel_faults", len(points))
    record_property("rel_crashes", crashes)
    record_property("rel_rows", changed * len(points))
    record_property("rel_rows_lost", lost)
    record_property("rel_duplicates", duplicates)
    assert lost == 0 and duplicates == 0
