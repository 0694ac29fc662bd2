"""Security canaries: a canary Slack token (kept in a secret file) and a canary database password (from an
environment variable, on a PostgreSQL URL; the test server's trust auth ignores it, so the connection works)
go through every output path: `tailwatch tick`, `run --once`, the daemon's JSON logs and `/metrics`,
forced errors (a database that refuses the connection, Slack answering invalid_auth), `notify drain`,
`query ... --format json`, `report`, what the fake Slack server received, and every row of every table.
None may hold a canary, plain or URL-quoted. Also: the health server binds 127.0.0.1 by default, a secret
file readable by others is warned about, `query sql` writes nothing, and Slack messages hold aggregates
only (no request's raw `notes` text, no request id).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sqlite3
import sys
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
import yaml
from sqlalchemy import select, text
from sqlalchemy.engine import make_url

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / d) for d in ("alerts", "ops")]
from alerts_support import TOKEN, FakeSlack  # noqa: E402
from opsfeed import stop, tailwatch, wait_for  # noqa: E402
from test_after_tick import T0, at, write_window  # noqa: E402

from monitor import config as config_mod  # noqa: E402
from storage.models import Base  # noqa: E402
from storage.store import Store  # noqa: E402

pytestmark = pytest.mark.reliability

# The canaries: what must never come out. Odd characters, so the URL-quoted forms differ from the plain.
DB_CANARY = "cAnArY-db/pw?4471#@:%&"
SLACK_CANARY = TOKEN  # the token the fake Slack server accepts: a unique string of its own
WRONG_SLACK_CANARY = "xoxb-cAnArY-wrong-88120-Zq8x"
RAW_NOTE = "RAWNOTE-private-text-{i:05d}"  # every request's free text: raw, never to leave the logs


def forms(canary: str) -> set[str]:
    return {canary, quote(canary, safe=""), quote_plus(canary)}


CANARIES = forms(DB_CANARY) | forms(SLACK_CANARY) | forms(WRONG_SLACK_CANARY)


def leaks(text_: str) -> list[str]:
    """The canary forms in `text_`, also across a line wrapped by a terminal-width printer."""
    joined = text_.replace("\n", "")
    return sorted(f for f in CANARIES if f in text_ or f in joined)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> list[str]:
    """The local addresses a TCP socket is listening on at `port` (from /proc/net/tcp and tcp6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:
                found.append(addr)
    return ["127.0.0.1" if a == "0100007F" else a for a in found]


def feed(root: Path, n: int = 600) -> None:
    """`n` requests of v1 in the first window, each with its own raw `notes` text."""
    lines = []
    for i in range(n):
        ts = T0 + timedelta(seconds=i * 900 / n)
        lines.append(json.dumps({"request_id": f"req-canary-{i:05d}", "ts": ts.isoformat().replace("+00:00", "Z"),
                                 "model_version": "v1", "status": "ok", "tenure": i % 72,
                                 "Contract": ["Month-to-month", "One year", "Two year"][i % 3],
                                 "notes": RAW_NOTE.format(i=i) + " " + "x" * (i % 40), "latency_ms": 40.0 + i % 17}))
    (root / "logs" / "predictions" / "p.jsonl").write_text("\n".join(lines) + "\n")
    # The reference profile (Evidently's report in `tailwatch report` compares against it), with raw text too.
    import pandas as pd

    pd.DataFrame({"tenure": [i % 60 for i in range(300)], "Contract": ["Month-to-month", "One year"] * 150,
                  "notes": [RAW_NOTE.format(i=90000 + i) for i in range(300)]}).to_parquet(root / "reference.parquet")


def raw_config(root: Path, url: str, slack_url: str, port: int, lock_key: int) -> dict:
    return {
        "storage": {"url": url, "password": {"env": "TW_CANARY_DB_PASSWORD"}},
        "daemon": {"log_format": "json", "interval": "2s", "heartbeat_interval": "0.5s", "shutdown_timeout": "5s",
                   "lock_key": lock_key, "nightly": None, "health": {"port": port}},
        "services": [{"name": "churn", "sources": {"predictions": {"kind": "files", "path": str(root / "logs/predictions")}},
                      "schema": {"features": {"tenure": "numeric", "Contract": "categorical", "notes": "text"},
                                 "segments": ["Contract"]},
                      "buckets": {"size": "5m", "windows": ["15m"]}, "join": {"lateness": "5m"},
                      "reference": {"path": str(root / "reference.parquet")}, "accepted_versions": ["v1"]}],
        "alerts": {"verdict": {"for": "0s", "resolve_after": 1}, "group_wait": "0s",
                   "slack": {"token": {"file": str(root / "secrets" / "slack-token")}, "channel": "#alerts",
                             "base_url": slack_url, "timeout": "2s"}},
    }


def dump_tables(store: Store) -> str:
    """Every row of every tailwatch table (and, on PostgreSQL, the large objects), as text."""
    parts = []
    with store.transaction() as session:
        if store.url.get_backend_name() == "postgresql":
            parts.append(f"large objects: {session.execute(text('SELECT count(*) FROM pg_largeobject_metadata')).scalar()}")
        for table in Base.metadata.sorted_tables:
            for row in session.execute(select(table)):
                parts.append(f"{table.name}: {tuple(row)!r}")
    return "\n".join(parts)


@pytest.fixture
def slack():
    fake = FakeSlack()
    fake.thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()


@pytest.mark.postgres
def test_canary_secrets_never_leave_through_any_output(tmp_path, slack, pg_schema, record_property):
    url, connect_args = pg_schema
    schema = connect_args["options"].split("=", 1)[1]
    # The schema goes on the URL (the CLI takes no connect_args); the password comes from the environment.
    db_url = make_url(url).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
        hide_password=False)
    (tmp_path / "logs" / "predictions").mkdir(parents=True)
    (tmp_path / "secrets").mkdir()
    token_file = tmp_path / "secrets" / "slack-token"
    token_file.write_text(WRONG_SLACK_CANARY + "\n")
    token_file.chmod(0o644)  # readable by others: the CLI must warn
    port = free_port()
    feed(tmp_path)
    cfg_path = tmp_path / "tailwatch.yaml"
    cfg_path.write_text(yaml.safe_dump(raw_config(tmp_path, db_url, slack.base_url, port,
                                                  secrets.randbelow(2**40) + 1), sort_keys=False))
    env = {"TW_CANARY_DB_PASSWORD": DB_CANARY, "COLUMNS": "300", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    store = Store(db_url, password=DB_CANARY)
    store.upgrade()
    for version in ("v2",):  # a slower v2: an incident, so Slack gets messages
        for k, shape in enumerate(["slower", "slower"]):
            write_window(store, k, shape, version)
    outputs: dict[str, str] = {}
    faults = 0

    def cli(name: str, *args: str, expect: int | None = 0, timeout: float = 120) -> str:
        proc = tailwatch(cfg_path, *args, env=env)
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            stop(proc)
        outputs[name] = out.decode() + err.decode()
        if expect is not None:
            assert proc.returncode == expect, (name, outputs[name][-3000:])
        return outputs[name]

    # 1. A tick, as JSON; the world-readable token file is warned about.
    out = cli("tick", "tick", "--now", (T0 + timedelta(minutes=16)).isoformat(), "--format", "json")
    assert "slack-token is readable by group or others" in out
    # 2. The tick job with a Slack token Slack refuses: invalid_auth in the logs, the outbox and job events.
    out = cli("run --once (invalid_auth)", "run", "--once", "--now", at(1).isoformat())
    faults += 1
    assert "invalid_auth" in out and '"level"' in out  # the JSON logs say why, without the token
    assert any(h == f"Bearer {WRONG_SLACK_CANARY}" for h in slack.headers_seen)  # it was really sent
    with store.transaction() as session:
        failed = session.execute(text("SELECT count(*) FROM outbox WHERE status = 'failed'")).scalar()
        assert failed >= 1
        # An operator fixes the token and retries the failed items.
        session.execute(text("UPDATE outbox SET status = 'pending', attempts = 0"))
    token_file.write_text(SLACK_CANARY + "\n")
    token_file.chmod(0o600)
    # 3. `notify drain` with the right token: the messages reach Slack.
    out = cli("notify drain", "notify", "drain", "--now", (at(1) + timedelta(minutes=1)).isoformat())
    assert "sent 0" not in out and "failed 0" in out and "readable by group" not in out, out
    assert slack.top_level, "no Slack message to check"
    # 4. Queries and the report.
    cli("query findings", "query", "findings", "--format", "json")
    cli("query incidents", "query", "incidents", "--format", "json")
    cli("query sql", "query", "sql", "SELECT * FROM outbox", "--format", "json")
    report = tmp_path / "report.html"
    cli("report", "report", "--output", str(report), "--since", T0.isoformat(),
        "--until", (T0 + timedelta(hours=1)).isoformat())
    outputs["report.html"] = report.read_text()
    assert 'id="evidently"' in outputs["report.html"]  # the raw-rows part of the report ran
    # 5. A database that refuses the connection, the canary password on its URL: the error says which
    # database, never the password.
    bad_cfg = tmp_path / "bad.yaml"
    bad = yaml.safe_load(cfg_path.read_text())
    bad["storage"]["url"] = make_url(db_url).set(port=1).render_as_string(hide_password=False)
    bad["storage"]["password"] = {"file": str(tmp_path / "secrets" / "db-password")}
    (tmp_path / "secrets" / "db-password").write_text(DB_CANARY)
    (tmp_path / "secrets" / "db-password").chmod(0o600)
    bad_cfg.write_text(yaml.safe_dump(bad))
    proc = tailwatch(bad_cfg, "tick", env=env)
    out, err = proc.communicate(timeout=60)
    outputs["tick (database down)"] = out.decode() + err.decode()
    assert proc.returncode != 0 and "127.0.0.1" in outputs["tick (database down)"]
    faults += 1
    with pytest.raises(Exception) as caught:  # the same, in-process: the exception itself
        down = Store(bad["storage"]["url"], password=DB_CANARY)
        with down.transaction():
            pass
    outputs["StoreError"] = f"{caught.value!r} {caught.value}"
    faults += 1
    # 6. The daemon: JSON logs and /metrics, the health server on 127.0.0.1 (the default host).
    from test_daemon import get  # the ops tests' probe client

    proc = tailwatch(cfg_path, "run", env=env)
    try:
        page = wait_for(lambda: (r := get(port, "/metrics"))[0] == 200 and "tailwatch_ticks_total{" in r[1] and r[1],
                        timeout=60, what="a tick in /metrics")
        outputs["/metrics"] = page
        outputs["/readyz"] = get(port, "/readyz")[1]
        outputs["/livez"] = get(port, "/livez")[1]
        assert listening(port) == ["127.0.0.1"], listening(port)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        stop(proc)
    outputs["daemon logs"] = out.decode() + err.decode()
    assert proc.returncode == 0, outputs["daemon logs"][-2000:]
    logs = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    assert logs and any("health server listening" in e.get("message", "") for e in logs)
    # 7. What Slack received, and everything stored.
    outputs["slack messages"] = json.dumps(slack.messages)
    outputs["database"] = dump_tables(store)
    store.dispose()

    assert leaks(f"x{quote_plus(DB_CANARY)}y") and leaks(SLACK_CANARY[:9] + "\n" + SLACK_CANARY[9:])  # the grep sees
    found = {name: leaks(text_) for name, text_ in outputs.items()}
    record_property("rel_inputs", len(outputs))
    record_property("rel_faults", faults)
    print({name: len(text_) for name, text_ in outputs.items()})  # what was searched, shown on failure
    assert not any(found.values()), {k: v for k, v in found.items() if v}
    # Slack holds aggregates only: no request's raw text, no request id.
    assert "RAWNOTE" not in outputs["slack messages"] and "req-canary-" not in outputs["slack messages"]
    assert "RAWNOTE" not in outputs["report.html"] and "req-canary-" not in outputs["report.html"]
    # The raw text was there to leak: it is in the logs the tool reads.
    assert "RAWNOTE" in (tmp_path / "logs" / "predictions" / "p.jsonl").read_text()


def test_health_server_binds_loopback_by_default():
    assert config_mod.Health().host == "127.0.0.1"
    from monitor.daemon.health import Health, Metrics, serve

    cfg = config_mod.parse({"services": [{"name": "s", "sources": {"predictions": {"kind": "files", "path": "."}}}]},
                           base_dir=Path.cwd())
    assert cfg.daemon.health.host == "127.0.0.1"
    server = serve(Health(None, max_age_s=60, metrics=Metrics()), cfg.daemon.health.host, 0)
    try:
        assert server.server_address[0] == "127.0.0.1"
        assert listening(server.server_address[1]) == ["127.0.0.1"]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("where", ["storage.password", "alerts.slack.token", "alerts.slack.webhook_url",
                                   "daemon.redact"])
def test_a_secret_file_readable_by_others_is_warned_about(tmp_path, where, record_property):
    secret = tmp_path / "secret"
    secret.write_text("s3cret-value\n")
    ref = {"file": str(secret)}
    raw = {"services": [{"name": "s", "sources": {"predictions": {"kind": "files", "path": str(tmp_path)}}}]}
    if where == "storage.password":
        raw["storage"] = {"url": "postgresql+psycopg://postgres@127.0.0.1:5432/test", "password": ref}
    elif where == "daemon.redact":
        raw["daemon"] = {"redact": [ref]}
    else:
        raw["alerts"] = {"slack": {where.rsplit(".", 1)[1]: ref, "channel": "#alerts"}}
    secret.chmod(0o644)
    warnings = config_mod.parse(raw, base_dir=tmp_path).warnings()
    assert len(warnings) == 1 and str(secret) in warnings[0] and "s3cret" not in warnings[0]
    secret.chmod(0o640)  # group-readable is still too open
    assert len(config_mod.parse(raw, base_dir=tmp_path).warnings()) == 1
    secret.chmod(0o600)
    assert config_mod.parse(raw, base_dir=tmp_path).warnings() == []
    record_property("rel_inputs", 3)


# What `query sql` must refuse: the writes of tests/query/test_sql_readonly.py, plus per backend the ways
# around a plain write (attaching another file, PRAGMAs that write; sequences, large objects, row locks).
COMMON_WRITES = [
    "INSERT INTO ticks (service, started_at, now, status) VALUES ('x', '2026-01-01', '2026-01-01', 'ok')",
    "UPDATE findings SET value = 0",
    "DELETE FROM findings",
    "DROP TABLE findings",
    "SELECT 1; DELETE FROM findings",
    "SELECT 1; COMMIT; DELETE FROM findings",
    "VALUES (1); DELETE FROM findings",
    "CREATE TABLE x (a int)",
]
SQLITE_WRITES = [
    "ATTACH DATABASE '{other}' AS other",
    "SELECT 1; ATTACH DATABASE '{other}' AS other; CREATE TABLE other.x (a int)",
    "PRAGMA user_version = 7",
    "PRAGMA journal_mode = DELETE",
    "PRAGMA writable_schema = ON",
    "PRAGMA query_only = OFF",
    "WITH x AS (SELECT 1) INSERT INTO ticks (service, started_at, now, status) SELECT 'x', 'a', 'b', 'ok' FROM x",
    "SELECT load_extension('/nonexistent')",
    "EXPLAIN DELETE FROM findings",
]
POSTGRES_WRITES = [
    "WITH gone AS (DELETE FROM findings RETURNING id) SELECT count(*) FROM gone",
    "SELECT setval('findings_id_seq', 999999)",
    "SELECT nextval('findings_id_seq')",
    "SELECT lo_create(0)",
    "SELECT id FROM findings FOR UPDATE",
    "SELECT set_config('transaction_read_only', 'off', true); DELETE FROM findings",
    "EXPLAIN ANALYZE DELETE FROM findings",
]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request, tmp_path):
    if request.param == "sqlite":
        store = Store(f"sqlite:///{tmp_path / 'tw.db'}")
    else:
        url, connect_args = request.getfixturevalue("pg_schema")
        store = Store(url, connect_args=connect_args)
    store.upgrade()
    write_window(store, 0, "slower")
    yield store
    store.dispose()


def test_query_sql_writes_nothing(sql_store, tmp_path, record_property):
    from monitor.investigate import query as q
    from monitor.investigate import sql

    store = sql_store
    sqlite = store.url.get_backend_name() == "sqlite"
    reader = sql._sqlite_read if sqlite else sql._postgres_read
    other = tmp_path / "other.db"
    statements = COMMON_WRITES + (SQLITE_WRITES if sqlite else POSTGRES_WRITES)
    before = dump_tables(store)
    refused = 0
    for statement in statements:
        statement = statement.format(other=other)
        # Through the command's function, then straight at its read-only connection (past the verb check).
        for run in (sql.sql, lambda st, text_: reader(st, text_, 10)):
            try:
                run(store, statement)
            except q.QueryError:
                refused += 1
            else:  # may run: EXPLAIN lists the program without running it; lo_create's object is rolled back
                assert statement in ("EXPLAIN DELETE FROM findings", "SELECT lo_create(0)"), statement
            assert dump_tables(store) == before, statement
            assert not other.exists(), statement
    if sqlite:
        assert sqlite3.connect(tmp_path / "tw.db").execute("PRAGMA user_version").fetchone()[0] == 0
    assert sql.sql(store, "SELECT count(*) AS n FROM findings")["n"].iloc[0] > 0  # reads still run
    record_property("rel_inputs", 2 * len(statements))
    record_property("rel_faults", refused)
    record_property("rel_rows_lost", 0 if dump_tables(store) == before else 1)


def test_slack_messages_are_aggregates_only(tmp_path, slack, record_property):
    """Every notification of an incident episode rendered from stored evidence: counts, rates, quantiles,
    label names; never a request id or a feature value of a request."""
    from alerts_support import make_config

    from monitor.alerts.evaluate import after_tick
    from monitor.notify import drain

    token = tmp_path / "token"
    token.write_text(SLACK_CANARY)
    token.chmod(0o600)
    config = make_config(tmp_path, alerts={"verdict": {"for": "0s", "resolve_after": 1}, "group_wait": "0s",
                                           "slack": {"token": {"file": str(token)}, "channel": "#alerts",
                                                     "base_url": slack.base_url, "timeout": "2s"}},
                         accepted=["v1"])
    store = Store(config.storage.url)
    store.upgrade()
    for k, shape in enumerate(["slower", "slower", "healthy", "healthy"]):
        write_window(store, k, shape)
    old = os.environ.get("NO_PROXY")
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    try:
        for k in range(1, 5):
            after_tick(config, store, at(k))
            drain(config, store, at(k) + timedelta(minutes=1))
    finally:
        if old is None:
            os.environ.pop("NO_PROXY")
        else:
            os.environ["NO_PROXY"] = old
    store.dispose()
    assert len(slack.messages) >= 2
    body = json.dumps(slack.messages)
    assert not leaks(body)
    # What a message may hold: numbers with n and intervals, label names; nothing per request.
    assert "n=300" in body and "req-" not in body and "request_id" not in body
    record_property("rel_inputs", len(slack.messages))
