import copy
import json

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.contract import STAGES, Reason
from monitor.ingest.otlp import COLUMNS, Reject, parse_otlp

T0 = 1_717_243_200_000_000_000  # 2024-06-01T12:00:00Z in ns
MS = 1_000_000


def attr(key, **value):
    return {"key": key, "value": value}


def span(name, start, end, *, trace="5B8EFFF798038103D269B633813FC60C", attrs=None, **extra):
    out = {
        "traceId": trace,
        "spanId": "EEE19B7EC3C1B174",
        "name": name,
        "kind": 1,
        "startTimeUnixNano": start,
        "endTimeUnixNano": end,
    }
    if attrs is not None:
        out["attributes"] = attrs
    out.update(extra)
    return out


def doc(*resources):
    return {"resourceSpans": list(resources)}


def resource(*scopes, attrs=(), key="scopeSpans"):
    return {
        "resource": {"attributes": [attr("service.name", stringValue="churn-api"), *attrs]},
        key: list(scopes),
    }


def scope(name, *spans):
    return {"scope": {"name": name, "version": "1.4.0"}, "spans": list(spans)}


def encode(value) -> bytes:
    return json.dumps(value).encode()


# (stage, offset ms, duration ms); the server scope times parse..batch_wait, the model scope the rest.
PLAN = [("parse", 0, 0.4), ("preprocess", 0.4, 2.1), ("batch_wait", 2.5, 7.0), ("model", 9.5, 31.25),
        ("postprocess", 40.75, 0.5)]


def request_spans(request_id, t0, trace, as_string):
    spans = []
    for stage, offset, duration in PLAN:
        start = t0 + int(offset * MS)
        end = start + int(duration * MS)
        spans.append(span(stage, str(start) if as_string else start, str(end) if as_string else end,
                          trace=trace, attrs=[attr("request_id", stringValue=request_id),
                                              attr("http.status_code", intValue="200")]))
    return spans[:3], spans[3:]


def realistic():
    """Two replicas, each exporting a server scope and a model scope, two requests per replica."""
    resources = []
    for r, replica in enumerate(["api-0", "api-1"]):
        server, model = [], []
        for q in range(2):
            rid = f"req-{r}{q}"
            trace = f"{r}{q}" * 16
            head, tail = request_spans(rid, T0 + (2 * r + q) * 100 * MS, trace, as_string=(r == 0))
            server += head
            model += tail
        resources.append(resource(scope("tailwatch.server", *server), scope("tailwatch.model", *model),
                                  attrs=[attr("replica", stringValue=replica)]))
    return doc(*resources)


def check_frame(frame):
    assert list(frame.columns) == list(COLUMNS)
    assert frame["duration_ms"].dtype == "float64"
    assert str(frame["start_ts"].dtype) == "datetime64[ns, UTC]"
    assert frame["request_id"].map(type).eq(str).all()
    assert frame["stage"].map(type).eq(str).all()


def test_realistic_document_two_resources_multi_scope():
    frame, rejects = parse_otlp(encode(realistic()), source="spans.json")
    assert rejects == []
    check_frame(frame)
    assert len(frame) == 4 * 5
    assert sorted(frame["request_id"].unique()) == ["req-00", "req-01", "req-10", "req-11"]
    for _, group in frame.groupby("request_id"):
        assert sorted(group["stage"]) == sorted(STAGES)
    model = frame[(frame["request_id"] == "req-11") & (frame["stage"] == "model")].iloc[0]
    assert model["duration_ms"] == pytest.approx(31.25)
    assert model["start_ts"] == pd.Timestamp(T0 + 300 * MS + int(9.5 * MS), unit="ns", tz="UTC")


def test_string_and_number_nanos_agree():
    as_number = doc(resource(scope("s", span("model", T0, T0 + 12_345_678))))
    as_string = doc(resource(scope("s", span("model", str(T0), str(T0 + 12_345_678)))))
    a, _ = parse_otlp(encode(as_number), source="a")
    b, _ = parse_otlp(encode(as_string), source="b")
    pd.testing.assert_frame_equal(a, b)
    assert a["duration_ms"].iloc[0] == pytest.approx(12.345678)
    assert a["start_ts"].iloc[0] == pd.Timestamp("2024-06-01T12:00:00Z")


def test_request_id_from_span_attribute_wins_over_resource():
    d = doc(resource(scope("s", span("model", T0, T0 + MS, attrs=[attr("request_id", intValue="42")])),
                     attrs=[attr("request_id", stringValue="from-resource")]))
    frame, rejects = parse_otlp(encode(d), source="x")
    assert rejects == []
    assert frame["request_id"].tolist() == ["42"]


def test_request_id_from_resource_attribute():
    d = doc(resource(scope("s", span("parse", T0, T0 + MS), span("model", T0 + MS, T0 + 3 * MS)),
                     attrs=[attr("request_id", stringValue="req-7")]))
    frame, _ = parse_otlp(encode(d), source="x")
    assert frame["request_id"].tolist() == ["req-7", "req-7"]


def test_request_id_falls_back_to_lowercase_trace_id():
    d = doc(resource(scope("s", span("model", T0, T0 + MS, attrs=[attr("user", stringValue="u1")]))))
    frame, _ = parse_otlp(encode(d), source="x")
    assert frame["request_id"].tolist() == ["5b8efff798038103d269b633813fc60c"]


def test_empty_request_id_attribute_falls_back():
    d = doc(resource(scope("s", span("model", T0, T0 + MS, trace="AB" * 16,
                                     attrs=[attr("request_id", stringValue="")]))))
    frame, _ = parse_otlp(encode(d), source="x")
    assert frame["request_id"].tolist() == ["ab" * 16]


def test_legacy_instrumentation_library_spans():
    d = doc(resource({"instrumentationLibrary": {"name": "old"}, "spans": [span("model", T0, T0 + MS)]},
                     key="instrumentationLibrarySpans"))
    frame, rejects = parse_otlp(encode(d), source="x")
    assert (len(frame), rejects) == (1, [])


def test_json_lines_of_documents():
    lines = [
        json.dumps(doc(resource(scope("s", span("parse", T0, T0 + MS))))),
        "",
        json.dumps(doc(resource(scope("s", span("model", T0, T0 + 2 * MS), span("postprocess", T0, T0))))),
        "not json at all",
    ]
    frame, rejects = parse_otlp(("\r\n".join(lines) + "\n").encode(), source="spans.jsonl")
    assert frame["stage"].tolist() == ["parse", "model", "postprocess"]
    assert frame["duration_ms"].tolist() == [1.0, 2.0, 0.0]
    assert rejects == [Reject("spans.jsonl:line 4", Reason.unparseable, "not json at all")]


def test_json_lines_positions_name_the_line_and_span():
    lines = [json.dumps(doc(resource(scope("s", span("a", T0, T0 + MS))))),
             json.dumps(doc(resource(scope("s", span("a", T0, T0 + MS), span("b", T0 + MS, T0)))))]
    _, rejects = parse_otlp("\n".join(lines).encode(), source="f")
    assert [(r.position, r.reason) for r in rejects] == [("f:line 2:span 2", Reason.bad_duration)]


def test_bom_is_stripped():
    data = b"\xef\xbb\xbf" + encode(doc(resource(scope("s", span("model", T0, T0 + MS)))))
    frame, rejects = parse_otlp(data, source="x")
    assert (len(frame), rejects) == (1, [])


def one_span(**fields):
    base = span("model", T0, T0 + MS)
    base.update(fields)
    return encode(doc(resource(scope("s", {k: v for k, v in base.items() if v is not ...}))))


@pytest.mark.parametrize(("data", "reason"), [
    (b"\xff\xfe{}", Reason.invalid_encoding),
    (b'{"resourceSpans": [', Reason.unparseable),
    (b"", Reason.unparseable),
    (b'{"resource_spans": []}', Reason.unparseable),
    (b"[1, 2]", Reason.unparseable),
    (encode(doc(["not a resource"])), Reason.unparseable),
    (encode(doc({"scopeSpans": {"spans": []}})), Reason.unparseable),
    (encode(doc(resource(scope("s", "not a span")))), Reason.unparseable),
    (one_span(name=...), Reason.missing_field),
    (one_span(name=""), Reason.missing_field),
    (one_span(startTimeUnixNano=...), Reason.missing_field),
    (one_span(endTimeUnixNano=None), Reason.missing_field),
    (one_span(endTimeUnixNano="0"), Reason.missing_field),
    (one_span(traceId=...), Reason.missing_field),
    (one_span(name=7), Reason.wrong_type),
    (one_span(startTimeUnixNano=1.7e18), Reason.wrong_type),
    (one_span(startTimeUnixNano="1.7e18"), Reason.wrong_type),
    (one_span(endTimeUnixNano=True), Reason.wrong_type),
    (one_span(endTimeUnixNano=-5), Reason.wrong_type),
    (one_span(endTimeUnixNano=str(2**64)), Reason.wrong_type),
    (one_span(traceId="not-hex"), Reason.wrong_type),
    (one_span(attributes=[attr("request_id", doubleValue=1.5)]), Reason.wrong_type),
    (one_span(attributes={"request_id": "r1"}), Reason.wrong_type),
    (one_span(endTimeUnixNano=T0 - 1), Reason.bad_duration),
])
def test_each_reject_reason(data, reason):
    frame, rejects = parse_otlp(data, source="src")
    assert frame.empty
    check_frame(frame)
    assert [r.reason for r in rejects] == [reason]
    assert rejects[0].position.startswith("src:")


def test_missing_is_reported_before_wrong_type():
    _, rejects = parse_otlp(one_span(name=7, endTimeUnixNano=...), source="x")
    assert [r.reason for r in rejects] == [Reason.missing_field]


def test_bad_span_does_not_stop_the_rest():
    d = realistic()
    spans = d["resourceSpans"][1]["scopeSpans"][0]["spans"]
    spans[1]["endTimeUnixNano"] = spans[1]["startTimeUnixNano"] - 1
    del spans[2]["name"]
    frame, rejects = parse_otlp(encode(d), source="s.json")
    assert len(frame) == 18
    # spans are numbered across the document: 10 in the first resource, then 2 and 3 of the second
    assert [(r.position, r.reason) for r in rejects] == [
        ("s.json:span 12", Reason.bad_duration), ("s.json:span 13", Reason.missing_field)]
    assert rejects[1].excerpt.startswith('{"traceId":"10101010101010101010101010101010","spanId":"EEE1')


def test_excerpt_is_truncated_to_200_chars():
    _, rejects = parse_otlp(one_span(name=None, padding="x" * 1000), source="x")
    assert len(rejects[0].excerpt) == 200


def test_pretty_printed_broken_document_is_one_reject():
    text = json.dumps(realistic(), indent=2)
    broken = text[: len(text) // 2]
    frame, rejects = parse_otlp(broken.encode(), source="p.json")
    assert frame.empty
    assert len(rejects) == 1 and rejects[0].reason == Reason.unparseable


def test_invalid_utf8_line_in_json_lines():
    good = encode(doc(resource(scope("s", span("model", T0, T0 + MS)))))
    frame, rejects = parse_otlp(good + b"\n" + b'{"resourceSpans": "\xc3("}\n' + good, source="f")
    assert len(frame) == 2
    assert [(r.position, r.reason) for r in rejects] == [("f:line 2", Reason.invalid_encoding)]


def test_empty_scope_and_resource_are_valid():
    d = doc(resource(), resource({"scope": {"name": "s"}}, {"spans": None}),
            resource(scope("s", span("model", T0, T0 + MS))))
    frame, rejects = parse_otlp(encode(d), source="x")
    assert (len(frame), rejects) == (1, [])


# --- property: whatever the bytes, no exception, every span or document is accounted for ---

def spans_in(value) -> int:
    """Span slots in a parsed document, counted the way an OTLP reader walks it."""
    if not isinstance(value, dict) or not isinstance(value.get("resourceSpans"), list):
        return 1
    total = 0
    for rs in value["resourceSpans"]:
        scopes = (rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans")) if isinstance(rs, dict) else 1
        if not isinstance(scopes, list):
            total += 1 if scopes else 0
            continue
        for ss in scopes:
            spans = (ss.get("spans") or []) if isinstance(ss, dict) else None
            total += len(spans) if isinstance(spans, list) else 1
    return total


def check_invariants(data: bytes):
    frame, rejects = parse_otlp(data, source="prop")
    check_frame(frame)
    assert all(isinstance(r, Reject) and r.reason in set(Reason) for r in rejects)
    assert all(len(r.excerpt) <= 200 and r.position.startswith("prop:") for r in rejects)
    assert (frame["duration_ms"] >= 0).all()
    return len(frame), len(rejects)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_random_bytes_never_raise(data):
    accepted, rejected = check_invariants(data)
    assert accepted + rejected >= 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats()
    | st.text(max_size=12) | st.sampled_from(["", "0", "12", str(T0), "-1", "ff" * 16]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, (*prefix, i))


@st.composite
def mutated_documents(draw):
    d = copy.deepcopy(realistic())
    for _ in range(draw(st.integers(1, 4))):
        all_paths = list(paths(d))
        path = draw(st.sampled_from(all_paths))
        if not path:
            d = draw(json_values)
            continue
        parent = d
        for step in path[:-1]:
            parent = parent[step]
        if draw(st.booleans()):
            parent[path[-1]] = draw(json_values)
        elif isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent.pop(path[-1])
    return d


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_documents())
def test_mutated_documents_account_for_every_span(d):
    accepted, rejected = check_invariants(encode(d))
    assert accepted + rejected >= min(spans_in(d), 1)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_byte_mutations_of_a_valid_document(data):
    raw = bytearray(encode(realistic()))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw)))
        op = data.draw(st.sampled_from(["flip", "insert", "truncate", "newline"]))
        if op == "flip" and i < len(raw):
            raw[i] = data.draw(st.integers(0, 255))
        elif op == "insert":
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=4))
        elif op == "truncate":
            del raw[i:]
        else:
            raw[i:i] = b"\n"
    accepted, rejected = check_invariants(bytes(raw))
    assert accepted + rejected >= 1
