"""Store against SQLite and PostgreSQL (the `store` fixture runs each test on both)."""

from __future__ import annotations

import json
import time
import traceback
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select, text

from storage.database import MIGRATIONS_DIR, SchemaError, StoreError
from storage.models import Base, FindingRow, Tick
from storage.offsets import OffsetState
from storage.rows import PartialRow
from storage.store import Store

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
# Every table the models declare; the migrations must create exactly these (checked column by column below).
TABLES = set(Base.metadata.tables)
HEAD = sorted(p.name.split("_", 1)[0] for p in (Path(MIGRATIONS_DIR) / "versions").glob("0*.py"))[-1]


def merge_counts(old: bytes, new: bytes) -> bytes:
    a, b = json.loads(old), json.loads(new)
    return json.dumps({k: a.get(k, 0) + b.get(k, 0) for k in sorted(a.keys() | b.keys())}).encode()


def partial(minute: int, counts: dict, *, version="v1", seconds=300, segment="", rows=None) -> PartialRow:
    return PartialRow(
        model_version=version, bucket_start=T0 + timedelta(minutes=minute), bucket_seconds=seconds,
        segment=segment, rows=sum(counts.values()) if rows is None else rows,
        payload=json.dumps(counts).encode(),
    )


# -- migrations --------------------------------------------------------------------------------


def test_upgrade_from_empty_creates_every_table(empty_store: Store) -> None:
    assert empty_store.current_revision() is None
    empty_store.upgrade()
    assert empty_store.current_revision() == empty_store.head_revision() == HEAD
    names = set(inspect(empty_store.engine).get_table_names())
    assert names == TABLES | {"alembic_version"}
    empty_store.upgrade()  # idempotent at head
    empty_store.ensure_current()


def test_migration_matches_models(store: Store) -> None:
    with store.engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diffs == []


def test_ensure_current_on_empty_database(empty_store: Store) -> None:
    with pytest.raises(SchemaError, match="run `tailwatch db upgrade`") as err:
        empty_store.ensure_current()
    assert "\n" not in str(err.value)


def test_ensure_current_at_unknown_revision(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffff9999'"))
    with pytest.raises(SchemaError, match="newer than this tailwatch"):
        store.ensure_current()


def test_downgrade_to_base_and_stamp(store: Store) -> None:
    from alembic import command

    cfg = store._alembic_config()
    with store.engine.connect() as conn, conn.begin():
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "base")
    assert store.current_revision() is None
    assert set(inspect(store.engine).get_table_names()) <= {"alembic_version"}
    store.upgrade()
    store.stamp("base")
    assert store.current_revision() is None
    store.stamp("head")
    store.ensure_current()


def test_ensure_current_behind(empty_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    empty_store.upgrade("0001")  # a real older revision: this code's head is newer
    with pytest.raises(SchemaError, match=f"behind {HEAD}; run `tailwatch db upgrade`"):
        empty_store.ensure_current()
    empty_store.upgrade()
    empty_store.ensure_current()


# -- transactions ------------------------------------------------------------------------------


def test_transaction_rolls_back_on_exception(store: Store) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with store.transaction() as session:
            store.ticks.start(session, "svc", T0)
            raise RuntimeError("boom")
    with store.transaction() as session:
        assert store.ticks.last(session, "svc", 10) == []
        store.ticks.start(session, "svc", T0)
    with store.transaction() as session:
        assert len(store.ticks.last(session, "svc", 10)) == 1


# -- offsets -----------------------------------------------------------------------------------


def test_offsets_round_trip_and_upsert(store: Store) -> None:
    a = OffsetState("a", "/logs/a.jsonl", offset=100, line=3, fingerprint="fp-a", size=100)
    b = OffsetState("b", "/logs/b.jsonl", offset=0, line=0)
    with store.transaction() as session:
        assert store.offsets.load(session, "preds") == {}
        store.offsets.save(session, "preds", [a, b])
    a2 = OffsetState("a", "/logs/a.jsonl", offset=250, line=7, fingerprint="fp-a", size=300)
    c = OffsetState("c", "db:table", cursor="2025-03-01T12:00:00Z")
    with store.transaction() as session:
        store.offsets.save(session, "preds", [a2, c])
        store.offsets.save(session, "other", [a])
    with store.transaction() as session:
        assert store.offsets.load(session, "preds") == {"a": a2, "b": b, "c": c}
        assert store.offsets.load(session, "other") == {"a": a}


# -- ticks -------------------------------------------------------------------------------------


def test_tick_lifecycle(store: Store) -> None:
    clock_times = iter([T0 + timedelta(seconds=1), T0 + timedelta(seconds=5), T0 + timedelta(seconds=9)])
    store.clock = lambda: next(clock_times)
    with store.transaction() as session:
        first = store.ticks.start(session, "svc", T0)
        store.ticks.finish(session, first, "ok", {"rows_read": 10, "accepted": 9, "quarantined": 1}, {"a": 1})
        second = store.ticks.start(session, "svc", T0 + timedelta(minutes=1))
    with store.transaction() as session:
        newest, oldest = store.ticks.last(session, "svc", 5)
        assert store.ticks.last(session, "svc", 1) == [newest]
        assert store.ticks.last(session, "other", 5) == []
    assert (newest.id, newest.status, newest.finished_at, newest.summary) == (second, "running", None, None)
    assert newest.now == T0 + timedelta(minutes=1)
    assert oldest.id == first and oldest.status == "ok"
    assert oldest.started_at == T0 + timedelta(seconds=1)
    assert oldest.finished_at == T0 + timedelta(seconds=5)
    assert oldest.counts == {
        "rows_read": 10, "accepted": 9, "quarantined": 1, "joined": 0, "unmatched": 0, "duplicates": 0,
    }
    assert oldest.summary == {"a": 1}
    with store.transaction() as session:
        with pytest.raises(ValueError, match="unknown tick counts"):
            store.ticks.finish(session, second, "ok", {"rows": 1}, {})
        with pytest.raises(ValueError, match="tick status"):
            store.ticks.finish(session, second, "done", {}, {})
        with pytest.raises(LookupError):
            store.ticks.finish(session, 10_000, "ok", {}, {})


# -- partials ----------------------------------------------------------------------------------


def test_upsert_partials_merges_existing_and_inserts_new(store: Store) -> None:
    with store.transaction() as session:
        store.partials.upsert(session, "svc", [partial(0, {"ok": 2}), partial(5, {"ok": 1})], merge_counts)
    with store.transaction() as session:
        store.partials.upsert(
            session, "svc",
            [
                partial(0, {"ok": 3, "error": 1}),
                partial(0, {"timeout": 1}),  # same key twice in one batch: merged too
                partial(10, {"ok": 4}),
                partial(0, {"ok": 7}, segment="eu"),  # another segment is another key
            ],
            merge_counts,
        )
        store.partials.upsert(session, "other", [partial(0, {"ok": 100})], merge_counts)
    with store.transaction() as session:
        got = store.partials.load(session, "svc", T0, T0 + timedelta(hours=1))
    assert [(p.bucket_start, p.segment, p.rows, json.loads(p.payload)) for p in got] == [
        (T0, "", 7, {"error": 1, "ok": 5, "timeout": 1}),
        (T0, "eu", 7, {"ok": 7}),
        (T0 + timedelta(minutes=5), "", 1, {"ok": 1}),
        (T0 + timedelta(minutes=10), "", 4, {"ok": 4}),
    ]


def test_upsert_partials_batch_of_2000(store: Store) -> None:
    versions, segments = ("v1", "v2"), ("", "eu", "us", "apac", "latam")
    batch = [
        partial(5 * i, {"ok": 1}, version=v, segment=s)
        for i in range(200) for v in versions for s in segments
    ]
    assert len(batch) == 2000
    start = time.perf_counter()
    with store.transaction() as session:
        store.partials.upsert(session, "svc", batch, merge_counts)
    with store.transaction() as session:
        store.partials.upsert(session, "svc", batch, merge_counts)  # all 2000 are updates now
    elapsed = time.perf_counter() - start
    with store.transaction() as session:
        got = store.partials.load(session, "svc", T0, T0 + timedelta(days=2))
    assert len(got) == 2000
    assert {(p.rows, p.payload) for p in got} == {(2, b'{"ok": 2}')}
    assert elapsed < 20, f"2 x 2000-row upserts took {elapsed:.1f}s"


def test_upsert_partials_issues_a_constant_number_of_statements(store: Store) -> None:
    from sqlalchemy import event

    statements: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement)

    batch = [partial(5 * i, {"ok": 1}) for i in range(500)]
    with store.transaction() as session:
        store.partials.upsert(session, "svc", batch[:250], merge_counts)
    event.listen(store.engine, "before_cursor_execute", count)
    try:
        with store.transaction() as session:
            store.partials.upsert(session, "svc", batch, merge_counts)
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
    data_statements = [s for s in statements if s.lstrip().upper().startswith(("SELECT", "UPDATE", "INSERT"))]
    # One SELECT, one (executemany) UPDATE, and INSERTs batched by the driver/insertmanyvalues.
    assert len(data_statements) <= 4, data_statements


def test_transaction_durable_false_skips_the_disk_wait_of_its_own_commit_only(store: Store) -> None:
    sqlite = store.engine.dialect.name == "sqlite"

    def level(session) -> object:
        sql = "PRAGMA synchronous" if sqlite else "SHOW synchronous_commit"
        return session.connection().exec_driver_sql(sql).scalar()

    seen = []
    for durable in (False, True, False, True):  # the pooled connection is reused: the level is set each time
        with store.transaction(durable=durable) as session:
            seen.append(level(session))
            store.partials.upsert(session, "svc", [partial(5 * len(seen), {"ok": 1})], merge_counts)
    fast, full = (1, 2) if sqlite else ("off", "on")  # SQLite: NORMAL, FULL
    assert seen == [fast, full, fast, full]
    with store.transaction() as session:
        assert len(store.partials.load(session, "svc", T0, T0 + timedelta(hours=1))) == 4


def test_load_partials_filters(store: Store) -> None:
    rows = [
        partial(0, {"ok": 1}),
        partial(5, {"ok": 1}),
        partial(60, {"ok": 1}),  # == until: excluded
        partial(5, {"ok": 1}, version="v2"),
        partial(0, {"ok": 1}, seconds=3600),
        partial(5, {"ok": 1}, segment="eu"),
    ]
    with store.transaction() as session:
        store.partials.upsert(session, "svc", rows, merge_counts)
        window = (T0, T0 + timedelta(minutes=60))
        assert len(store.partials.load(session, "svc", *window)) == 5
        assert len(store.partials.load(session, "svc", T0 + timedelta(minutes=1), window[1])) == 3
        assert [p.model_version for p in store.partials.load(session, "svc", *window, model_version="v2")] == [
            "v2"
        ]
        assert [p.bucket_seconds for p in store.partials.load(session, "svc", *window, bucket_seconds=3600)] == [
            3600
        ]
        assert len(store.partials.load(session, "svc", *window, bucket_seconds=300, segment="")) == 3
        assert store.partials.load(session, "nobody", *window) == []


# -- quarantine --------------------------------------------------------------------------------


def test_quarantine_bulk_insert_and_counts(store: Store) -> None:
    reasons = ("missing_field", "wrong_type", "bad_timestamp", "unknown_status")
    with store.transaction() as session:
        tick = store.ticks.start(session, "svc", T0)
    rows = [
        {
            "tick_id": tick if i % 2 == 0 else None, "service": "svc", "kind": "predictions",
            "source": "preds", "position": f"file.jsonl:{i}", "reason": reasons[i % 4],
            "excerpt": "x" * 2000,
        }
        for i in range(10_000)
    ]
    start = time.perf_counter()
    with store.transaction() as session:
        store.quarantine.add(session, rows)
    elapsed = time.perf_counter() - start
    with store.transaction() as session:
        assert store.quarantine.counts(session, "svc") == dict.fromkeys(reasons, 2500)
        assert store.quarantine.counts(session, "svc", tick_id=tick) == {
            "missing_field": 2500, "bad_timestamp": 2500,
        }
        assert store.quarantine.counts(session, "other") == {}
        excerpt_len = session.execute(text("SELECT max(length(excerpt)) FROM quarantine")).scalar()
    assert excerpt_len == 512
    assert elapsed < 20, f"10k quarantine rows took {elapsed:.1f}s"


# -- join buffer -------------------------------------------------------------------------------


def test_replace_pending(store: Store) -> None:
    with store.transaction() as session:
        assert store.pending.load(session, "svc", "timings") == []
        store.pending.replace(session, "svc", "timings", b"PAR1-first", 3)
        store.pending.replace(session, "svc", "labels", b"PAR1-labels", 1)
    with store.transaction() as session:
        assert store.pending.load(session, "svc", "timings") == [b"PAR1-first"]
        store.pending.replace(session, "svc", "timings", b"PAR1-second\x00\xff", 2)
    with store.transaction() as session:
        assert store.pending.load(session, "svc", "timings") == [b"PAR1-second\x00\xff"]
        store.pending.replace(session, "svc", "timings", None, 0)
    with store.transaction() as session:
        assert store.pending.load(session, "svc", "timings") == []
        assert store.pending.load(session, "svc", "labels") == [b"PAR1-labels"]


# -- findings ----------------------------------------------------------------------------------


def finding(**over) -> dict:
    base = {
        "service": "svc", "check": "latency_p99", "model_version": "v1",
        "window_start": T0, "window_end": T0 + timedelta(hours=1),
        "labels": {"stage": "model", "segment": "eu"}, "status": "fail",
        "value": 812.5, "baseline": 400.0, "effect": 2.03, "interval_low": 700.0, "interval_high": 900.0,
        "p_value": 0.001, "n": 1200, "detail": {"bins": [1, 2, 3]},
    }
    return {**base, **over}


def test_findings_upsert_is_idempotent(store: Store) -> None:
    with store.transaction() as session:
        tick = store.ticks.start(session, "svc", T0)
        store.findings.upsert(session, [finding(tick_id=tick), finding(check="error_rate", value=0.02)])
    with store.transaction() as session:
        first = store.findings.load(session, "svc")
        # Same identity (labels in another order) rewritten, plus one new window.
        store.findings.upsert(
            session,
            [
                finding(labels={"segment": "eu", "stage": "model"}, value=900.0, tick_id=tick),
                finding(window_start=T0 + timedelta(hours=1), window_end=T0 + timedelta(hours=2)),
            ],
        )
        store.findings.upsert(session, [finding(labels={"segment": "eu", "stage": "model"}, value=900.0,
                                                tick_id=tick)])
    with store.transaction() as session:
        got = store.findings.load(session, "svc")
        total = session.scalar(select(FindingRow.id).order_by(FindingRow.id.desc()).limit(1))
    assert len(first) == 2 and len(got) == 3 and total <= 3
    by_check = {(f["check"], f["window_start"]): f for f in got}
    latency = by_check[("latency_p99", T0)]
    assert latency["value"] == 900.0 and latency["tick_id"] == tick
    assert latency["labels"] == {"segment": "eu", "stage": "model"}
    assert latency["labels_key"] == '{"segment":"eu","stage":"model"}'
    assert latency["id"] == next(f["id"] for f in first if f["check"] == "latency_p99")
    assert latency["created_at"] == next(f["created_at"] for f in first if f["check"] == "latency_p99")
    assert latency["detail"] == {"bins": [1, 2, 3]} and latency["n"] == 1200


def test_load_findings_filters_and_nan(store: Store) -> None:
    with store.transaction() as session:
        store.findings.upsert(
            session,
            [
                finding(),
                finding(check="drift_psi", model_version="v2", value=float("nan"), labels=None),
                finding(window_start=T0 + timedelta(hours=1), window_end=T0 + timedelta(hours=2)),
            ],
        )
        assert len(store.findings.load(session, "svc", since=T0 + timedelta(hours=1))) == 1
        assert len(store.findings.load(session, "svc", until=T0 + timedelta(hours=1))) == 2
        [drift] = store.findings.load(session, "svc", check="drift_psi")
        assert drift["value"] is None and drift["labels_key"] == "{}"
        assert len(store.findings.load(session, "svc", model_version="v1")) == 2
        with pytest.raises(ValueError, match="unknown fields"):
            store.findings.upsert(session, [finding(colour="red")])


def test_load_findings_by_segment_in_sql(store: Store) -> None:
    # All traffic has no segment key; a label value that spells a segment key (escaped in the stored JSON)
    # or a key of another case is not one.
    labels = [{"stage": "model"}, {"stage": "model", "segment": "eu"}, {"stage": "model", "segment": "eu-west"},
              {"field": 'a"segment":"eu"'}, {"field": "Segment"}, None]
    with store.transaction() as session:
        store.findings.upsert(session, [finding(labels=lab) for lab in labels])
        def keys(segment):
            return sorted(f["labels_key"] for f in store.findings.load(session, "svc", segment=segment))
        assert keys("all") == keys("") == sorted(
            ['{"stage":"model"}', '{"field":"a\\"segment\\":\\"eu\\""}', '{"field":"Segment"}', "{}"])
        assert keys("eu") == ['{"segment":"eu","stage":"model"}']
        assert len(keys(None)) == len(labels)


# -- datetimes ---------------------------------------------------------------------------------


def test_datetimes_round_trip_as_aware_utc(store: Store) -> None:
    ist = timezone(timedelta(hours=5, minutes=30))
    local = datetime(2025, 3, 1, 17, 30, 0, 123456, tzinfo=ist)  # == T0 + 123456 µs
    with store.transaction() as session:
        tick_id = store.ticks.start(session, "svc", local)
    with store.transaction() as session:
        stored = session.get(Tick, tick_id)
        assert stored.now == T0 + timedelta(microseconds=123456)
        assert stored.now.utcoffset() == timedelta(0) and stored.now.tzinfo is not None
        assert stored.started_at.tzinfo is not None
        # Comparisons in SQL use the same instant, whatever zone the bound value is in.
        assert session.scalar(select(Tick.id).where(Tick.now == T0 + timedelta(microseconds=123456))) == tick_id
        assert session.scalar(select(Tick.id).where(Tick.now >= local)) == tick_id


def test_naive_datetimes_are_refused(store: Store) -> None:
    with pytest.raises(Exception, match="naive datetime"):
        with store.transaction() as session:
            store.ticks.start(session, "svc", datetime(2025, 3, 1, 12, 0))


# -- secrets -----------------------------------------------------------------------------------

CANARY = "canary-S3cret-pw"


def _all_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + repr(exc.__cause__) + repr(exc.__context__)


@pytest.mark.parametrize(
    "url, password",
    [
        ("postgresql+psycopg://tw@127.0.0.1:1/test", CANARY),
        (f"postgresql+psycopg://tw:{CANARY}@127.0.0.1:1/test", None),
    ],
)
def test_password_never_in_repr_or_errors(url: str, password: str | None) -> None:
    store = Store(url, password=password)
    assert CANARY not in repr(store) and "***" in repr(store)
    assert store.url.password == CANARY  # it is used, just never shown
    for action in (store.upgrade, store.current_revision, store.ensure_current, lambda: store.transaction().__enter__()):
        with pytest.raises(StoreError) as err:
            action()
        assert CANARY not in _all_text(err.value)
        assert "127.0.0.1:1" in str(err.value) and "***" in str(err.value)
    store.dispose()


def test_unparseable_url_does_not_echo_it() -> None:
    with pytest.raises(StoreError) as err:
        Store(f"not a url {CANARY}")
    assert CANARY not in _all_text(err.value)


# -- SQLite specifics --------------------------------------------------------------------------


def test_sqlite_relative_path_wal_and_foreign_keys(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = Store("sqlite:///tailwatch.db")
    try:
        store.upgrade()
        store.ensure_current()
        assert (tmp_path / "tailwatch.db").exists()
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() > 0
    finally:
        store.dispose()


def test_sqlite_creates_parent_directory(tmp_path) -> None:
    store = Store(f"sqlite:///{tmp_path}/a/b/tw.db")
    try:
        store.upgrade()
        assert (tmp_path / "a" / "b" / "tw.db").exists()
    finally:
        store.dispose()


def test_reference_profile_round_trip_and_replace(store):
    with store.transaction() as s:
        assert store.profiles.load(s, "churn") is None
        store.profiles.save(s, "churn", "abc", "ref.parquet", 10, '{"rows": 10}')
    with store.transaction() as s:
        store.profiles.save(s, "churn", "def", "ref2.parquet", 20, '{"rows": 20}')
    with store.transaction() as s:
        row = store.profiles.load(s, "churn")
        assert (row.fingerprint, row.source, row.rows, row.profile) == ("def", "ref2.parquet", 20, '{"rows": 20}')
