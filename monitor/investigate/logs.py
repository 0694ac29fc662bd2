"""Raw-log drill-down: the slowest (or most affected) requests of a time range, read from the service's
configured sources (files of rows or OTLP spans, SQL tables) with the ingest's own readers and contract
checks, filtered in Arrow/pandas.

Output holds request ids and aggregates; raw feature values only when asked for (`features=True`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from monitor.config import FileSource, Limits, Service, SqlSource
from monitor.contract import BOOL_OPTIONAL, NUMERIC_OPTIONAL, STRING_OPTIONAL, RecordKind
from monitor.ingest.shape import to_contract
from monitor.ingest.sources import open_source
from monitor.ingest.sources.batch import FILE, LINE, Chain, Observer
from monitor.ingest.validate import validate
from monitor.investigate.ranked import Ranked
from monitor.schema import Schema

# Prediction fields that say where a request went and under which versions: what "most affected" is cut by.
DIMENSIONS = ("model_version", "status", "replica", "route", "expert", "config_hash", "preprocess_version",
              "cache_hit", "cache_version")
# Beyond the contract's own: what a drill-down row shows (never a feature value unless asked).
SHOWN = ("request_id", "ts", "model_version", "status", "latency_ms") + tuple(
    c for c in NUMERIC_OPTIONAL + STRING_OPTIONAL + BOOL_OPTIONAL if c not in ("prediction", "threshold"))
AGGREGATES = ["dimension", "value", "requests", "share", "share_of_all", "lift", "p95_ms", "others_p95_ms"]


class LogsError(ValueError):
    """A drill-down that cannot run as asked (no timings source, unknown stage...)."""


SLOWEST = 0.05  # the share of a range's requests "what they share" is about when no floor is given


@dataclass(frozen=True)
class Drill:
    """The drill-down's answer: `requests` (the top rows, slowest first), `aggregates` (per dimension
    value: matching requests, their share, the share of all requests in range, lift), and counts."""

    requests: pd.DataFrame
    aggregates: pd.DataFrame
    matched: int  # requests matching the filters
    scanned: int  # requests in the time range
    stage: str | None
    min_ms: float | None  # the floor the matches are at or above (ms): given, or that of the slowest share
    skipped: dict[str, int] = field(default_factory=dict)  # rows left out as a tick quarantines them, by reason
    slowest: float | None = None  # the share of the range's requests the floor was set at, when not given
    limited: bool = False  # the matches were more than the rows held: the slowest of them are shown


def _frames(source_cfg, name: str, kind: RecordKind, schema: Schema, limits: Limits,
            columns: set[str] | None, now: datetime, skipped: Counter, keep=None,
            observe: Observer | None = None) -> Iterator[pd.DataFrame]:
    """The valid rows of a source (files of rows or OTLP spans, or a SQL table in cursor order), one chunk
    at a time (at most `limits.chunk_rows`), typed by the contract; `keep(table)` filters in Arrow first.
    Rows the tick would quarantine are left out and counted in `skipped`, by reason code. `observe` is told
    the rows read and the rows in all (estimated from the bytes left, exact at the end)."""
    for batch in open_source(name, source_cfg, limits).read({}, observe):
        skipped.update(r.reason.value for r in batch.rejects)
        for raw in (batch.table, batch.frame):
            if raw is None or not len(raw):
                continue
            raw = to_contract(raw, source_cfg)  # the source's own column names and units, as the tick reads them
            if isinstance(raw, pd.DataFrame):
                # The rows whose types differ from their neighbours': checked as they are, in pandas (Arrow
                # cannot hold a column of numbers and text), then filtered as typed rows.
                if columns is not None:
                    raw = raw[[c for c in raw.columns if c in columns or c == LINE]]
                accepted, bad = validate(kind, raw, batch.file, schema, limits, now, source_cfg.timezone)
                if keep is not None and len(accepted):
                    accepted = accepted[_bools(keep(pa.Table.from_pandas(accepted.drop(columns=[LINE]),
                                                                         preserve_index=False)))]
            else:
                if columns is not None:
                    raw = raw.select([c for c in raw.column_names if c in columns or c == LINE])
                if keep is not None:
                    raw = raw.filter(keep(raw))
                accepted, bad = validate(kind, raw, batch.file, schema, limits, now, source_cfg.timezone)
            skipped.update(r.reason.value for r in bad)
            if len(accepted):
                yield accepted.drop(columns=[LINE, FILE], errors="ignore")


def _read(source_cfg, name: str, kind: RecordKind, schema: Schema, limits: Limits,
          columns: set[str] | None, now: datetime, skipped: Counter, keep=None,
          observe: Observer | None = None) -> pd.DataFrame:
    """Every valid row of a source at once (`_frames` concatenated)."""
    frames = list(_frames(source_cfg, name, kind, schema, limits, columns, now, skipped, keep, observe))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _bools(values) -> list[bool]:
    return pc.fill_null(values, False).to_pylist()


def drill(service: Service, limits: Limits, *, since: datetime, until: datetime, stage: str | None = None,
          min_ms: float | None = None, top: int = 20, model_version: str | None = None,
          status: str | None = None, features: bool = False, now: datetime | None = None,
          observe: Observer | None = None, slowest: float | None = None, max_rows: int | None = None) -> Drill:
    """The `top` requests with ts in [since, until) ranked by the duration of `stage` (ms; None: total
    latency_ms), keeping those at or above `min_ms` (else, with `slowest`, those at or above the quantile
    that leaves that share of the range's requests: 0.05, the slowest 5%); and how the matching requests
    split by dimension. The logs are read a chunk at a time; `max_rows` bounds the rows held (the slowest
    ones: `limited` says the matches were cut to them; the p95 per value is then within 1%), None holds every
    row of the range. `observe` is told the raw rows read (timings of the stage, then predictions) and the
    rows in all when known."""
    now = now or datetime.now(UTC)
    chain = Chain(observe) if observe is not None else None
    schema = service.schema_
    # Features are read and checked even when not shown: a row the tick quarantines for one is left out here.
    wanted = set(SHOWN) | set(schema.segments) | set(schema.signals) | set(schema.features)
    hidden = [] if features else [c for c in schema.features
                                  if c not in SHOWN and c not in schema.segments and c not in schema.signals]
    skipped: Counter = Counter()
    measure = "latency_ms" if stage is None else f"{stage}_ms"
    if stage is not None:
        if service.sources.timings is None:
            raise LogsError(f"service {service.name} has no timings source; --stage needs one")
        keys, durations = _durations(service, stage, limits, now, skipped, chain)
        if chain is not None:
            chain.next()
    ranked = Ranked(measure, [*DIMENSIONS, *schema.segments], max_rows, min_ms)
    scanned, latency = 0, False
    for preds in _frames(service.sources.predictions, f"{service.name}/predictions", RecordKind.predictions,
                         schema, limits, wanted, now, skipped, observe=chain):
        ts = preds["ts"]
        inside = (ts >= pd.Timestamp(since)) & (ts < pd.Timestamp(until))
        if model_version is not None:
            inside &= preds["model_version"].astype(str) == model_version
        if status is not None:
            inside &= preds["status"].astype(str) == status
        preds = preds[inside.to_numpy()].drop(columns=hidden, errors="ignore").reset_index(drop=True)
        scanned += len(preds)
        if not len(preds):
            continue
        if stage is None:
            latency |= "latency_ms" in preds
            ranked.add(preds.dropna(subset=["latency_ms"]) if "latency_ms" in preds else preds.iloc[:0])
            continue
        # As the join keeps them: the first timing of the stage per request.
        found = pd.util.hash_array(preds["request_id"].astype(str).to_numpy(dtype=object))
        at = np.minimum(np.searchsorted(keys, found), max(len(keys) - 1, 0))
        hit = keys[at] == found if len(keys) else np.zeros(len(preds), bool)
        ranked.add(preds[hit].assign(**{measure: durations[at[hit]]}).reset_index(drop=True))
    if not scanned:
        return _empty(stage, min_ms, skipped)
    if stage is None and not latency:
        raise LogsError("the predictions carry no latency_ms; give --stage to rank by a stage timing")
    if stage is not None and not len(keys):
        raise LogsError(f"no timing rows of stage {stage!r} in {where(service.sources.timings)}")
    rows = ranked.all()
    if rows is None:
        return _held(ranked, schema, top, min_ms, slowest, scanned, stage, skipped)
    share = None
    if min_ms is None and slowest is not None and len(rows):
        # A floor of the range's own: "what they share" compares its slowest requests with all of them.
        share, min_ms = slowest, float(np.quantile(rows[measure].to_numpy(dtype=float), 1 - slowest))
    if not len(rows):
        rows = pd.DataFrame(columns=["request_id", "ts", "model_version", "status", measure])
    matched = rows[rows[measure] >= min_ms] if min_ms is not None else rows
    ranked_rows = matched.sort_values([measure, "request_id"], ascending=[False, True], kind="stable")
    return Drill(_top(ranked_rows, measure, top), _aggregates(ranked_rows, rows, schema, measure), len(ranked_rows),
                 scanned, stage, min_ms, dict(skipped), share)


def _durations(service: Service, stage: str, limits: Limits, now: datetime, skipped: Counter,
               observe: Observer | None) -> tuple[np.ndarray, np.ndarray]:
    """The stage's duration (ms) per request, the first timing of each: its request_id's hash (sorted, 64-bit)
    and the ms beside it; 16 bytes a request, whatever the rest of the logs hold."""
    hashes, ms = [], []
    for rows in _frames(service.sources.timings, f"{service.name}/timings", RecordKind.timings,
                        service.schema_, limits, {"request_id", "stage", "duration_ms"}, now, skipped,
                        keep=lambda t: pc.fill_null(pc.equal(pc.cast(t["stage"], pa.string()), stage), False)
                        if "stage" in t.column_names else pa.array([False] * t.num_rows), observe=observe):
        hashes.append(pd.util.hash_array(rows["request_id"].astype(str).to_numpy(dtype=object)))
        ms.append(rows["duration_ms"].to_numpy(dtype=float))
    if not hashes:
        return np.array([], "uint64"), np.array([], float)
    keys, values = np.concatenate(hashes), np.concatenate(ms)
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    first = np.r_[True, keys[1:] != keys[:-1]]
    return keys[first], values[first]


def _top(ranked: pd.DataFrame, measure: str, top: int) -> pd.DataFrame:
    first = ["request_id", "ts", "model_version", "status", measure]
    rest = [c for c in ranked.columns if c not in first]
    return ranked.head(top)[first + rest].reset_index(drop=True)


def _held(ranked: Ranked, schema: Schema, top: int, min_ms: float | None, slowest: float | None, scanned: int,
          stage: str | None, skipped: Counter) -> Drill:
    """The answer from the rows held under a row limit: exact rows and floor while the matches fit the
    limit; else the slowest `limit` rows (`limited`), their floor and share of the range's requests."""
    measure, held = ranked.measure, ranked.held()
    if not len(held):
        return Drill(pd.DataFrame(columns=["request_id", "ts", "model_version", "status", measure]),
                     pd.DataFrame(columns=AGGREGATES), 0, scanned, stage, min_ms, dict(skipped))
    share, limited = None, False
    if min_ms is None and slowest is not None:
        share, min_ms = slowest, ranked.floor(slowest)
        if min_ms is None:  # more matches than the limit: the slowest `limit` of them
            min_ms, share, limited = float(held[measure].iloc[-1]), len(held) / ranked.rows, True
    matched = held[held[measure] >= min_ms] if min_ms is not None else held
    count = len(matched)
    if ranked.min_ms is not None:
        limited, count = ranked.at_least > len(held), ranked.at_least
    elif min_ms is None:
        limited, count = ranked.rows > len(held), ranked.rows
    rows = []
    for dim in ranked.dims:
        if dim not in matched or not ranked.values[dim]:
            continue
        p95 = ranked.p95(dim)
        for value, k in matched[dim].astype(str).value_counts().items():
            part, base = k / len(matched), ranked.values[dim].get(value, 0) / ranked.rows
            mine, others = p95.get(value, (None, None))
            rows.append({"dimension": dim, "value": value, "requests": int(k), "share": part, "share_of_all": base,
                         "lift": part / base if base else None, "p95_ms": mine, "others_p95_ms": others})
    aggregates = pd.DataFrame(rows, columns=AGGREGATES).sort_values(["lift", "requests"], ascending=False,
                                                                    kind="stable", ignore_index=True)
    return Drill(_top(matched, measure, top), aggregates, count, scanned, stage, min_ms, dict(skipped), share,
                 limited)


def where(source: FileSource | SqlSource) -> str:
    """A source as a person names it: its directory, or its SQL table."""
    return str(source.path) if isinstance(source, FileSource) else f"SQL table {source.table}"


def _aggregates(matched: pd.DataFrame, timed: pd.DataFrame, schema: Schema, measure: str) -> pd.DataFrame:
    """Per dimension value: matching requests, their share among matches and among the requests in range
    that carry the measure (`timed`, whatever the floor: the population the matches are drawn from), lift;
    and the p95 of `measure` (ms) of the requests with that value beside that of the others."""
    rows = []
    for dim in [*DIMENSIONS, *schema.segments]:
        if dim not in timed or dim not in matched:
            continue
        all_counts = timed[dim].astype(str).value_counts()
        hit_counts = matched[dim].astype(str).value_counts()
        p95 = _p95_by_value(timed[dim].astype(str).to_numpy(dtype=object), timed[measure].to_numpy(dtype=float))
        for value, k in hit_counts.items():
            share = k / len(matched)
            base = all_counts.get(value, 0) / len(timed)
            mine, others = p95.get(value, (None, None))
            rows.append({"dimension": dim, "value": value, "requests": int(k), "share": share,
                         "share_of_all": base, "lift": share / base if base else None,
                         "p95_ms": mine, "others_p95_ms": others})
    frame = pd.DataFrame(rows, columns=AGGREGATES)
    return frame.sort_values(["lift", "requests"], ascending=False, kind="stable", ignore_index=True)


def _p95_by_value(values: np.ndarray, ms: np.ndarray) -> dict[str, tuple[float | None, float | None]]:
    """Per value: the p95 (ms) of the requests with it and of those without it (None: no such request)."""
    def p95(x: np.ndarray) -> float | None:
        return float(np.quantile(x, 0.95)) if len(x) else None

    codes, uniques = pd.factorize(values)
    return {str(u): (p95(ms[codes == i]), p95(ms[codes != i])) for i, u in enumerate(uniques)}


def _empty(stage: str | None, min_ms: float | None, skipped: Counter) -> Drill:
    return Drill(pd.DataFrame(columns=["request_id", "ts", "model_version", "status"]),
                 pd.DataFrame(columns=AGGREGATES), 0, 0, stage, min_ms, dict(skipped))


@dataclass(frozen=True)
class ByValue:
    """Per stage (`total`: latency_ms), the p50 / p95 (ms) of the requests whose `field` is `value` and of
    the others, before and during; `requests`: how many of each the figures rest on."""

    field: str
    value: str
    stages: pd.DataFrame
    requests: dict[str, int]

    def as_dict(self) -> dict:
        return {"field": self.field, "value": self.value, "requests": self.requests,
                "stages": self.stages.to_dict("records")}


def stages_by_value(service: Service, limits: Limits, *, field: str, value: str,
                    before: tuple[datetime, datetime], during: tuple[datetime, datetime],
                    model_version: str | None = None, now: datetime | None = None) -> ByValue:
    """The per-stage latency of routing `field` = `value` against the other values' in [before) and
    [during) (during: of `model_version` only, when given), read from the raw logs: the stored partials
    keep latency per routing value for the total only. Empty stages when the logs no longer hold the rows."""
    now = now or datetime.now(UTC)
    schema, skipped = service.schema_, Counter()
    wanted = set(SHOWN) | set(schema.segments) | set(schema.signals) | set(schema.features)
    preds = _read(service.sources.predictions, f"{service.name}/predictions", RecordKind.predictions,
                  schema, limits, wanted, now, skipped)
    columns = ["stage", "p95_before", "p95_during", "others_p95_before", "others_p95_during", "p50_before",
               "p50_during", "others_p50_before", "others_p50_during"]
    if preds.empty or field not in preds:
        return ByValue(field, value, pd.DataFrame(columns=columns), {})
    ts = preds["ts"]
    spans = {"before": (ts >= pd.Timestamp(before[0])) & (ts < pd.Timestamp(before[1])),
             "during": (ts >= pd.Timestamp(during[0])) & (ts < pd.Timestamp(during[1]))}
    if model_version is not None:
        spans["during"] &= preds["model_version"].astype(str) == model_version
    preds = preds[(spans["before"] | spans["during"]).to_numpy()]
    span = np.where(spans["during"][preds.index].to_numpy(), "during", "before")
    frame = pd.DataFrame({"request_id": preds["request_id"].astype(str).to_numpy(), "span": span,
                          "hot": (preds[field].astype(str) == value).to_numpy(),
                          "total": pd.to_numeric(preds.get("latency_ms"), errors="coerce").to_numpy()
                          if "latency_ms" in preds else np.nan})
    timings = service.sources.timings
    if timings is not None and len(frame):
        rows = _read(timings, f"{service.name}/timings", RecordKind.timings, schema, limits,
                     {"request_id", "stage", "duration_ms"}, now, skipped)
        if len(rows):
            rows = rows.drop_duplicates(["request_id", "stage"], keep="first")  # as the join keeps them
            wide = rows.assign(request_id=rows["request_id"].astype(str)).pivot(
                index="request_id", columns="stage", values="duration_ms")
            frame = frame.join(wide, on="request_id")
    stages = ["total"] + sorted(c for c in frame.columns if c not in ("request_id", "span", "hot", "total"))
    out = []
    for stage in stages:
        row: dict = {"stage": stage}
        for who, hot in (("", True), ("others_", False)):
            for name in ("before", "during"):
                ms = frame.loc[(frame["hot"] == hot) & (frame["span"] == name), stage].dropna().to_numpy(dtype=float)
                for q, at in (("p50", 0.5), ("p95", 0.95)):
                    row[f"{who}{q}_{name}"] = float(np.quantile(ms, at)) if len(ms) else None
        if any(v is not None for k, v in row.items() if k != "stage"):
            out.append(row)
    requests = {f"{who}{name}": int(((frame["hot"] == hot) & (frame["span"] == name)).sum())
                for who, hot in (("", True), ("others_", False)) for name in ("before", "during")}
    return ByValue(field, value, pd.DataFrame(out, columns=columns), requests)
