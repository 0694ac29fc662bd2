"""Writers with fixed formatting, so the same arrays always give the same bytes.

JSON Lines through pandas' C encoder (floats pre-rounded, then printed with at most 4 decimals);
OTLP-JSON spans assembled from the same encoder's output. Large chunks are written in slices so the
formatted text never holds a whole chunk.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

SLICE_ROWS = 50_000
STAGES = ("parse", "preprocess", "batch_wait", "model", "postprocess")


def rfc3339_ms(epoch_us: np.ndarray) -> np.ndarray:
    """UTC RFC 3339 with milliseconds and Z ("2026-11-02T00:00:00.123Z"), from integer microseconds
    since the epoch (truncated to the millisecond). Returns an object array of str."""
    ms = np.asarray(epoch_us, dtype=np.int64) // 1000
    sec = ms // 1000
    uniq, inv = np.unique(sec, return_inverse=True)
    base = np.datetime_as_string(uniq.astype("datetime64[s]"), unit="s").astype("S19")
    out = np.empty((len(ms), 24), dtype=np.uint8)
    out[:, :19] = base.view(np.uint8).reshape(-1, 19)[inv]
    out[:, 19] = ord(".")
    out[:, 20:23] = _digits(ms % 1000, 3)
    out[:, 23] = ord("Z")
    return out.view("S24").ravel().astype("U24").astype(object)


def _digits(x: np.ndarray, width: int, base: int = 10) -> np.ndarray:
    """ASCII codes of the zero-padded digits of non-negative ints, shape (n, width)."""
    x = np.asarray(x, dtype=np.int64)
    out = np.empty((len(x), width), dtype=np.uint8)
    for i in range(width - 1, -1, -1):
        out[:, i] = _ALPHABET[x % base]
        x = x // base
    return out


_ALPHABET = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _fixed(x: np.ndarray, width: int, base: int = 10) -> np.ndarray:
    """Zero-padded fixed-width strings of non-negative ints, as an object array."""
    return _digits(x, width, base).view(f"S{width}").ravel().astype(f"U{width}").astype(object)


def _trace_ids(seed: int, g: np.ndarray) -> np.ndarray:
    """32 hex digits: the seed's low 32 bits, then the request's global index + 1."""
    d = np.empty((len(g), 32), dtype=np.uint8)
    d[:, :8] = _digits(np.array([seed & 0xFFFFFFFF]), 8, 16)
    d[:, 8:] = _digits(g, 24, 16)
    return d.view("S32").ravel().astype("U32").astype(object)


def jsonl(path: Path, df: pd.DataFrame) -> int:
    """Write `df` as JSON Lines, columns in order. Uses the array encoder and splits records at
    '},{"<first column>"', which is safe because no simulated string contains that sequence."""
    first = df.columns[0]
    sep = '},{"' + first + '"'
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for a in range(0, len(df), SLICE_ROWS):
            part = df.iloc[a:a + SLICE_ROWS]
            if not len(part):
                continue
            text = part.to_json(orient="records", double_precision=4)
            fh.write(text[1:-1].replace(sep, '}\n{"' + first + '"'))
            fh.write("\n")
    return len(df)


_HEAD = ('{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":'
         '"churn-api"}}]},"scopeSpans":[{"scope":{"name":"tailwatch-sim"},"spans":[')
_TAIL = "]}]}]}\n"


def otlp_spans(path: Path, request_id: np.ndarray, gidx: np.ndarray, stage: np.ndarray,
               start_us: np.ndarray, dur_us: np.ndarray, seed: int) -> int:
    """One OTLP-JSON document per part: one span per timing row; traceId from the request's global
    index, spanId from (index, stage); request_id as a span attribute."""
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(_HEAD)
        first = True
        for a in range(0, len(request_id), SLICE_ROWS):
            sl = slice(a, a + SLICE_ROWS)
            g = gidx[sl] + 1
            start_ns = start_us[sl] * 1000
            df = pd.DataFrame({
                "traceId": _trace_ids(seed, g),
                "spanId": _fixed(g * 256 + stage[sl] + 1, 16, 16),
                "name": np.asarray(STAGES, dtype=object)[stage[sl]],
                "startTimeUnixNano": _fixed(start_ns, 19),
                "endTimeUnixNano": _fixed(start_ns + dur_us[sl] * 1000, 19),
                "rid": request_id[sl],
            })
            text = df.to_json(orient="records")
            # the last field is the request id: turn it into an OTLP attribute list
            text = text[1:-1].replace(',"rid":"', ',"attributes":[{"key":"request_id","value":{"stringValue":"')
            text = text.replace('"},{"traceId"', '"}}]},{"traceId"') + "}]}"
            if not first:
                fh.write(",")
            fh.write(text)
            first = False
        fh.write(_TAIL)
    return len(request_id)
