"""Fuzzed input through a whole tick: whatever the bytes, no crash, and every row read ends up accepted or
quarantined with a reason (accepted + quarantined = read); a second tick reads nothing new.

Each test records what it tried as pytest user properties (`rel_inputs`, `rel_rows_lost`, ...), which
`make reliability` sums into its summary table.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import shutil
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests_support import stored_rows, valid_row

from monitor import config as config_mod
from monitor.contract import Reason
from monitor.daemon.runner import tick
from storage.store import Store

pytestmark = pytest.mark.reliability

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
# Seeded and sized for CI; TAILWATCH_FUZZ_EXAMPLES=1000 TAILWATCH_FUZZ_RANDOM=1 digs deeper.
EXAMPLES = int(os.environ.get("TAILWATCH_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("TAILWATCH_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
_names = itertools.count()

# --- what a hostile or broken producer writes -------------------------------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
FIELDS = ["request_id", "ts", "model_version", "status", "tenure", "Contract", "notes", "latency_ms"]
ABSURD_TS = [-1, 0, 12, 1e18, -1e18, "1969-07-20T20:17:00Z", "9999-12-31T23:59:59Z", "2026-13-45T99:00:00Z",
             "2026-11-02T10:00:00", "2026-11-02 10:00:00+05:00", "", "NaN"]


@st.composite
def mutated_row(draw) -> bytes:
    """A valid row with one field removed, retyped, made absurd, huge or deeply nested."""
    row = valid_row(draw(st.integers(0, 10_000)))
    field = draw(st.sampled_from(FIELDS))
    how = draw(st.sampled_from(["drop", "value", "ts", "huge", "deep", "nan", "dup_id", "null"]))
    if how == "drop":
        row.pop(field)
    elif how == "value":
        row[field] = draw(json_values)
    elif how == "ts":
        row["ts"] = draw(st.sampled_from(ABSURD_TS))
    elif how == "huge":
        row[field] = "x" * draw(st.sampled_from([70_000, 300_000]))
    elif how == "deep":
        nested: object = 1
        for _ in range(draw(st.integers(50, 3000))):
            nested = [nested]
        row[field] = nested
    elif how == "nan":
        row[field] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    elif how == "dup_id":
        row["request_id"] = "req-000001"
    else:
        row[field] = None
    try:
        return json.dumps(row).encode()
    except RecursionError:  # json itself refuses the nesting: write it by hand
        return b'{"request_id": "deep", "ts": 1, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"


def encoded(draw_row: bytes, how: str) -> bytes:
    if how == "bom":
        return b"\xef\xbb\xbf" + draw_row
    if how == "latin1":
        return draw_row.decode("utf-8", "replace").replace("call", "caf\u00e9").encode("latin-1", "replace")
    if how == "utf16":
        return draw_row.decode("utf-8", "replace").encode("utf-16")
    return draw_row


@st.composite
def lines(draw) -> list[bytes]:
    """Lines of a JSONL file: valid rows, mutated rows, random bytes, truncations, odd encodings."""
    out = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["valid", "valid", "mutated", "mutated", "bytes", "truncated", "encoding"]))
        if kind == "valid":
            out.append(json.dumps(valid_row(draw(st.integers(0, 10_000)))).encode())
        elif kind == "mutated":
            out.append(draw(mutated_row()))
        elif kind == "bytes":
            out.append(draw(st.binary(max_size=200)).replace(b"\n", b" "))
        elif kind == "truncated":
            full = json.dumps(valid_row(draw(st.integers(0, 10_000)))).encode()
            out.append(full[: draw(st.integers(0, len(full) - 1))])
        else:
            row = json.dumps(valid_row(draw(st.integers(0, 10_000)))).encode()
            out.append(encoded(row, draw(st.sampled_from(["bom", "latin1", "utf16"]))).replace(b"\n", b" "))
    return out


# --- the harness ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory):
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('fuzzdb') / 'tw.db'}")
    store.upgrade()
    yield store
    store.dispose()


def service_config(root: Path, name: str, *, timings: bool = False, fmt: str = "auto") -> config_mod.Config:
    sources = {"predictions": {"kind": "files", "path": str(root / "p"), "format": fmt}}
    if timings:
        sources["timings"] = {"kind": "files", "path": str(root / "t")}
    return config_mod.parse({"services": [{
        "name": name, "sources": sources,
        "schema": {"features": {"tenure": "numeric", "Contract": "categorical", "notes": "text"},
                   "segments": ["Contract"]},
        "join": {"lateness": "0s"}}]})


def tick_and_account(store: Store, cfg: config_mod.Config, kind: str = "predictions") -> dict:
    """Two ticks; asserts the invariants and returns the first tick's accounting."""
    service = cfg.services[0].name
    [report] = tick(cfg, store, NOW)
    assert report.status == "ok", report.error
    read, accepted, quarantined = report.read[kind], report.accepted[kind], sum(report.quarantined.values())
    assert read == accepted + quarantined, report.as_dict()
    assert set(report.quarantined) <= {r.value for r in Reason}
    if kind == "predictions":
        # Every accepted prediction is folded once (duplicates are counted, the first wins).
        assert report.folded + report.duplicates + report.pending_predictions == accepted
        assert stored_rows(store, service) == report.folded
    with store.transaction() as s:
        assert sum(store.quarantine.counts(s, service).values()) == quarantined
    [again] = tick(cfg, store, NOW + timedelta(minutes=1))
    assert again.status == "ok" and sum(again.read.values()) == 0, again.as_dict()
    return {"read": read, "accepted": accepted, "quarantined": quarantined,
            "duplicates": report.duplicates + report.duplicate_timings}


class Tally:
    """Per-test totals reported to the reliability summary."""

    def __init__(self, record_property):
        self.record = record_property
        self.inputs = self.rows = self.lost = 0

    def add(self, accounting: dict) -> None:
        self.inputs += 1
        self.rows += accounting["read"]
        self.lost += accounting["read"] - accounting["accepted"] - accounting["quarantined"]

    def flush(self) -> None:
        self.record("rel_inputs", self.inputs)
        self.record("rel_rows", self.rows)
        self.record("rel_rows_lost", self.lost)
        self.record("rel_duplicates", 0)


@pytest.fixture
def tally(record_property):
    t = Tally(record_property)
    yield t
    t.flush()


def fresh_dir() -> Path:
    root = Path(tempfile.mkdtemp(prefix="twfuzz-"))
    (root / "p").mkdir()
    (root / "t").mkdir()
    return root


# --- the tests --------------------------------------------------------------------------------------------


@FUZZ
@given(body=lines(), tail=st.sampled_from([b"\n", b"", b"\r\n"]), gz=st.booleans())
def test_fuzzed_jsonl(fuzz_store, tally, body, tail, gz):
    root = fresh_dir()
    try:
        data = b"\n".join(body) + tail
        name = "fuzz.jsonl.gz" if gz else "fuzz.jsonl"
        if gz:
            import gzip

            data = gzip.compress(data if data.endswith(b"\n") else data + b"\n")
        (root / "p" / name).write_bytes(data)
        tally.add(tick_and_account(fuzz_store, service_config(root, f"j{next(_names)}")))
    finally:
        shutil.rmtree(root)


def _as_dict(line: bytes) -> dict:
    try:
        return json.loads(line) if line[:1] == b"{" else {}
    except RecursionError:
        return {}


@FUZZ
@given(rows=st.lists(st.one_of(st.builds(valid_row, st.integers(0, 10_000)),
                               mutated_row().map(_as_dict)),
                     min_size=1, max_size=30),
       junk=st.lists(st.binary(max_size=80).map(lambda b: b.replace(b"\n", b" ")), max_size=5))
def test_fuzzed_csv(fuzz_store, tally, rows, junk):
    root = fresh_dir()
    try:
        frame = pd.DataFrame([{k: (json.dumps(v) if isinstance(v, list | dict) else v) for k, v in r.items()}
                              for r in rows])
        buf = io.StringIO()
        frame.to_csv(buf, index=False)
        data = buf.getvalue().encode() + b"".join(j + b"\n" for j in junk)
        (root / "p" / "fuzz.csv").write_bytes(data)
        tally.add(tick_and_account(fuzz_store, service_config(root, f"c{next(_names)}")))
    finally:
        shutil.rmtree(root)


@FUZZ
@given(rows=st.lists(st.builds(valid_row, st.integers(0, 10_000)), min_size=1, max_size=30),
       column=st.sampled_from(FIELDS), values=st.lists(json_scalars, min_size=1, max_size=30),
       corrupt=st.sampled_from(["none", "none", "bytes", "truncated"]))
def test_fuzzed_parquet(fuzz_store, tally, rows, column, values, corrupt):
    root = fresh_dir()
    try:
        frame = pd.DataFrame(rows)
        # One column holds arbitrary values of one random type (Parquet columns are typed).
        picked = [values[i % len(values)] for i in range(len(frame))]
        kinds = {type(v) for v in picked if v is not None}
        if len(kinds) > 1:
            picked = [None if v is None else str(v) for v in picked]
        frame[column] = pd.Series(picked, dtype=object)
        path = root / "p" / "fuzz.parquet"
        try:
            pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            frame[column] = frame[column].map(lambda v: None if v is None else str(v))
            pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
        if corrupt == "bytes":
            path.write_bytes(b"PAR1" + bytes(range(256)) * 3)
        elif corrupt == "truncated":
            path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
        cfg = service_config(root, f"q{next(_names)}")
        if corrupt == "none":
            tally.add(tick_and_account(fuzz_store, cfg))
        else:
            # A broken file is waited for once (it may still be being written), then quarantined once.
            [first] = tick(cfg, fuzz_store, NOW)
            assert first.status == "ok" and sum(first.quarantined.values()) == 0
            accounting = tick_and_account(fuzz_store, cfg)
            assert accounting == {"read": 1, "accepted": 0, "quarantined": 1, "duplicates": 0}
            tally.add(accounting)
    finally:
        shutil.rmtree(root)


@st.composite
def otlp_documents(draw) -> bytes:
    spans = []
    for _ in range(draw(st.integers(0, 6))):
        span = {"traceId": draw(st.sampled_from(["a" * 32, "zz", "", "0" * 32])),
                "spanId": "b" * 16, "name": draw(st.sampled_from(["parse", "model", "", "batch_wait"])),
                "startTimeUnixNano": draw(st.one_of(st.integers(-(2**64), 2**64), st.text(max_size=20))),
                "endTimeUnixNano": draw(st.one_of(st.integers(-(2**64), 2**64), st.text(max_size=20))),
                "attributes": draw(st.one_of(st.just([{"key": "request_id", "value": {"stringValue": "req-1"}}]),
                                             json_values))}
        if draw(st.booleans()):
            span.pop(draw(st.sampled_from(list(span))))
        spans.append(span)
    doc = {"resourceSpans": [{"resource": draw(json_values), "scopeSpans": [{"spans": spans}]}]}
    if draw(st.booleans()):
        doc = draw(json_values)  # not OTLP at all
    return json.dumps(doc).encode()


@FUZZ
@given(docs=st.lists(otlp_documents(), min_size=1, max_size=5))
def test_fuzzed_otlp_timings(fuzz_store, tally, docs):
    root = fresh_dir()
    try:
        (root / "p" / "p.jsonl").write_text("".join(json.dumps(valid_row(i)) + "\n" for i in range(3)))
        (root / "t" / "spans.json").write_bytes(b"\n".join(docs) + b"\n")
        cfg = config_mod.parse({"services": [{
            "name": f"o{next(_names)}",
            "sources": {"predictions": {"kind": "files", "path": str(root / "p")},
                        "timings": {"kind": "files", "path": str(root / "t"), "format": "otlp"}},
            "join": {"lateness": "0s"}}]})
        tally.add(tick_and_account(fuzz_store, cfg, kind="timings"))
    finally:
        shutil.rmtree(root)


yaml_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(
        st.sampled_from(["services", "name", "sources", "predictions", "kind", "path", "schema", "features",
                         "storage", "url", "password", "env", "file", "limits", "buckets", "size", "windows",
                         "join", "lateness", "reference", "segments", "classes", "x"]), inner, max_size=4)),
    max_leaves=15)


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.one_of(yaml_values, st.binary(max_size=200)))
def test_fuzzed_config_gives_a_clear_error_or_a_config(tmp_path_factory, record_property, doc):
    record_property("rel_inputs", 1)
    path = tmp_path_factory.mktemp("cfg") / "tailwatch.yaml"
    path.write_bytes(doc if isinstance(doc, bytes) else yaml.safe_dump(doc).encode())
    try:
        config_mod.load(path)
    except config_mod.ConfigError as exc:
        message = str(exc)
        assert message and "Traceback" not in message
