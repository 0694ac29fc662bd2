"""OTLP-JSON trace spans read as stage timings: one span = one (request_id, stage, duration_ms) row.

Accepts one ExportTraceServiceRequest in the OTLP/HTTP JSON encoding, or JSON Lines of them. Pure: no I/O.
"""

from __future__ import annotations

import json
import string
from typing import Any

import pandas as pd

from monitor.contract import EXCERPT_CHARS, Reason, Reject

COLUMNS = ("request_id", "stage", "duration_ms", "start_ts")
_BOM = b"\xef\xbb\xbf"
_INT64_MAX = 2**63 - 1  # the last nanosecond datetime64[ns] can hold (2262-04-11)
_HEX = frozenset(string.hexdigits)
_REASON_ORDER = {r: i for i, r in enumerate(Reason)}
# proto3 JSON: the old and the new name of the same repeated field.
_SCOPE_KEYS = ("scopeSpans", "instrumentationLibrarySpans")


class _Bad(Exception):
    def __init__(self, reason: Reason) -> None:
        super().__init__(reason)
        self.reason = reason


def parse_otlp(data: bytes, *, source: str) -> tuple[pd.DataFrame, list[Reject]]:
    """Stage timings (duration_ms in milliseconds, start_ts in UTC) from OTLP-JSON bytes, plus rejects.

    Every span seen is either a row or a Reject; input where no document parses counts one Reject.
    """
    rows: list[tuple[str, str, float, int]] = []
    rejects: list[Reject] = []
    if data.startswith(_BOM):
        data = data[len(_BOM):]

    doc: Any = None
    text: str | None = None
    whole_error: Reject | None = None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        whole_error = Reject(f"{source}:line {line}", Reason.invalid_encoding, _excerpt_bytes(data))
    if text is not None:
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as e:
            line = e.lineno if isinstance(e, json.JSONDecodeError) else 1
            whole_error = Reject(f"{source}:line {line}", Reason.unparseable, _excerpt(text))

    if whole_error is None:
        _read_document(doc, text or "", source, f"{source}:line 1", rows, rejects)
    elif _looks_like_json_lines(data):
        for number, raw in enumerate(data.split(b"\n"), start=1):
            if raw.strip():
                _read_line(raw, source, number, rows, rejects)
    else:
        # One broken document (possibly pretty-printed over many lines) is one reject, not one per line.
        rejects.append(whole_error)
    return _frame(rows), rejects


def span_end(span: Any) -> int | None:
    """A span's end (`endTimeUnixNano`) in nanoseconds since the Unix epoch; None when it has no readable one."""
    try:
        return _nanos(span.get("endTimeUnixNano")) if isinstance(span, dict) else None
    except _Bad:
        return None


def _looks_like_json_lines(data: bytes) -> bool:
    """True when some line on its own is an OTLP document, which a broken pretty-printed one never has."""
    for raw in data.split(b"\n"):
        if b'"resourceSpans"' not in raw:
            continue  # cheap filter: a broken multi-megabyte document is not parsed line by line
        try:
            value = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict) and "resourceSpans" in value:
            return True
    return False


def _read_line(raw: bytes, source: str, number: int, rows: list, rejects: list[Reject]) -> None:
    position = f"{source}:line {number}"
    try:
        text = raw.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError:
        rejects.append(Reject(position, Reason.invalid_encoding, _excerpt_bytes(raw)))
        return
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        rejects.append(Reject(position, Reason.unparseable, _excerpt(text)))
        return
    _read_document(doc, text, position, position, rows, rejects)


def _read_document(doc: Any, text: str, prefix: str, doc_position: str, rows: list,
                   rejects: list[Reject]) -> None:
    if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans"), list):
        rejects.append(Reject(doc_position, Reason.unparseable, _excerpt(text)))
        return
    ordinal = 0
    for r_index, resource_spans in enumerate(doc["resourceSpans"], start=1):
        r_position = f"{prefix}:resource {r_index}"
        if not isinstance(resource_spans, dict):
            rejects.append(Reject(r_position, Reason.unparseable, _excerpt_json(resource_spans)))
            continue
        resource = resource_spans.get("resource")
        resource_attrs = resource.get("attributes") if isinstance(resource, dict) else None
        try:
            scopes = _scopes(resource_spans, resource)
        except _Bad as bad:
            rejects.append(Reject(r_position, bad.reason, _excerpt_json(resource_spans)))
            continue
        for s_index, scope_spans in enumerate(scopes, start=1):
            spans = scope_spans.get("spans") if isinstance(scope_spans, dict) else None
            if not isinstance(spans, list):
                if isinstance(scope_spans, dict) and spans is None:
                    continue  # proto3 JSON omits an empty repeated field (or writes null)
                position = f"{r_position}:scope {s_index}"
                rejects.append(Reject(position, Reason.unparseable, _excerpt_json(scope_spans)))
                continue
            for span in spans:
                ordinal += 1
                position = f"{prefix}:span {ordinal}"
                try:
                    rows.append(_span_row(span, resource_attrs))
                except _Bad as bad:
                    rejects.append(Reject(position, bad.reason, _excerpt_json(span)))


def _scopes(resource_spans: dict, resource: Any) -> list:
    """The scope entries of one resource; the legacy key is read only when the new one is empty."""
    if resource is not None and not isinstance(resource, dict):
        raise _Bad(Reason.unparseable)
    for key in _SCOPE_KEYS:
        value = resource_spans.get(key)
        if value is None:
            continue
        if not isinstance(value, list):
            raise _Bad(Reason.unparseable)
        if value:
            return value
    return []


def _span_row(span: Any, resource_attrs: Any) -> tuple[str, str, float, int]:
    if not isinstance(span, dict):
        raise _Bad(Reason.unparseable)
    failures: list[Reason] = []
    name = _attempt(failures, _name, span)
    start = _attempt(failures, _nanos, span.get("startTimeUnixNano"))
    end = _attempt(failures, _nanos, span.get("endTimeUnixNano"))
    request_id = _attempt(failures, _request_id, span, resource_attrs)
    if failures:
        raise _Bad(min(failures, key=_REASON_ORDER.__getitem__))
    if end < start:
        raise _Bad(Reason.bad_duration)
    return request_id, name, (end - start) / 1e6, start


def _attempt(failures: list[Reason], fn, *args) -> Any:
    try:
        return fn(*args)
    except _Bad as bad:
        failures.append(bad.reason)
        return None


def _name(span: dict) -> str:
    name = span.get("name")
    if name is None or name == "":
        raise _Bad(Reason.missing_field)
    if not isinstance(name, str):
        raise _Bad(Reason.wrong_type)
    return name


def _nanos(value: Any) -> int:
    """Nanoseconds since the Unix epoch from a JSON integer or decimal string; 0 means unset in OTLP."""
    if value is None or value == "":
        raise _Bad(Reason.missing_field)
    if type(value) is int:
        nanos = value
    elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        nanos = int(value)
    else:
        raise _Bad(Reason.wrong_type)
    if nanos == 0:
        raise _Bad(Reason.missing_field)
    if not 0 < nanos <= _INT64_MAX:
        raise _Bad(Reason.wrong_type)  # negative, or beyond what datetime64[ns] holds
    return nanos


def _request_id(span: dict, resource_attrs: Any) -> str:
    """The span's request_id attribute, else the resource's, else the lowercase hex trace id."""
    for attrs in (span.get("attributes"), resource_attrs):
        found = _attribute(attrs, "request_id")
        if found:
            return found
    trace_id = span.get("traceId")
    if trace_id is None or trace_id == "":
        raise _Bad(Reason.missing_field)
    if not isinstance(trace_id, str) or not _HEX.issuperset(trace_id):
        raise _Bad(Reason.wrong_type)
    if not trace_id.strip("0"):
        raise _Bad(Reason.missing_field)  # the all-zero trace id means "no trace" in OTLP
    return trace_id.lower()


def _attribute(attrs: Any, key: str) -> str | None:
    """A string or integer attribute as text; None when absent or empty, _Bad when malformed."""
    if attrs is None:
        return None
    if not isinstance(attrs, list):
        raise _Bad(Reason.wrong_type)
    for kv in attrs:
        if not isinstance(kv, dict) or kv.get("key") != key:
            continue
        value = kv.get("value")
        if value is None:
            return None
        if not isinstance(value, dict):
            raise _Bad(Reason.wrong_type)
        if "stringValue" in value:
            text = value["stringValue"]
            if not isinstance(text, str):
                raise _Bad(Reason.wrong_type)
            return text or None
        if "intValue" in value:
            number = value["intValue"]
            if type(number) is int:
                return str(number)
            digits = number.removeprefix("-") if isinstance(number, str) else ""
            if digits.isascii() and digits.isdigit() and len(digits) <= 20:
                return str(int(number))
            raise _Bad(Reason.wrong_type)
        if value:
            raise _Bad(Reason.wrong_type)  # doubleValue, boolValue, arrays: not an identifier
        return None
    return None


def _frame(rows: list[tuple[str, str, float, int]]) -> pd.DataFrame:
    request_ids, stages, durations, starts = zip(*rows, strict=True) if rows else ((), (), (), ())
    return pd.DataFrame({
        "request_id": pd.Series(request_ids, dtype=object),
        "stage": pd.Series(stages, dtype=object),
        "duration_ms": pd.Series(durations, dtype="float64"),
        "start_ts": pd.to_datetime(pd.Series(starts, dtype="int64"), unit="ns", utc=True),
    })


def _excerpt(text: str) -> str:
    return text[:EXCERPT_CHARS]


def _excerpt_bytes(data: bytes) -> str:
    return data[: EXCERPT_CHARS * 4].decode("utf-8", "backslashreplace")[:EXCERPT_CHARS]


def _excerpt_json(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (ValueError, RecursionError):
        text = repr(value)
    return text[:EXCERPT_CHARS]
