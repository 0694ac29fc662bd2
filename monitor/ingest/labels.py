"""Delayed labels: what each prediction keeps until its label arrives, the label rows of a batch, the groups
quality is scored per (segments, input-length buckets, expressions), and the stage reading the label source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pandas as pd

from monitor.aggregate.profile import lengths
from monitor.classes import class_names
from monitor.config import Config, Service, expression_columns
from monitor.config.crosscheck import length_buckets
from monitor.contract import Reason, RecordKind, Reject, excerpt
from monitor.ingest.accept import Intake, Rejected, quarantine_rows
from monitor.ingest.sources import open_source
from monitor.ingest.sources.batch import LINE
from storage.store import Store

ALL_GROUP = "all"
LENGTH_SUFFIX = "_length"


@dataclass(frozen=True)
class LabelBatch:
    """The labels of one batch to store (in arrival order) and the rows refused."""

    rows: list[dict]
    rejects: list[Reject]


def attr_columns(service: Service) -> tuple[list[str], list[str]]:
    """(raw columns, text features whose length is kept) that the service's quality groups read."""
    q = service.quality
    raw = list(service.schema_.segments)
    texts = [f for f, k in service.schema_.features.items() if k == "text"]
    needed_len = set(q.length_buckets) if q else set()
    for expression in (q.groups.values() if q else ()):
        for name in sorted(expression_columns(expression)):
            if name.endswith(LENGTH_SUFFIX) and name[: -len(LENGTH_SUFFIX)] in texts:
                needed_len.add(name[: -len(LENGTH_SUFFIX)])
            elif name not in raw:
                raw.append(name)
    return raw, [t for t in texts if t in needed_len]


def attr_frame(frame: pd.DataFrame, service: Service) -> pd.DataFrame:
    """The columns quality groups read, from prediction or reference rows: raw values, and the length in
    characters of text features (`<feature>_length`)."""
    raw, texts = attr_columns(service)
    out = pd.DataFrame(index=frame.index)
    for name in raw:
        if name in frame:
            col = frame[name]
            out[name] = col.astype(object).where(col.notna(), None) if not pd.api.types.is_numeric_dtype(col) else col
    for name in texts:
        if name in frame:
            out[name + LENGTH_SUFFIX] = lengths(frame[name])[0]  # NaN where missing
    return out


def scored_rows(frame: pd.DataFrame, service: Service) -> list[dict]:
    """What quality keeps of each accepted prediction row: ids, time, status, prediction, class scores and
    the group attributes (only those the config's groups read)."""
    if frame is None or frame.empty or "request_id" not in frame:
        return []
    schema = service.schema_
    scores = {c: frame[schema.score_column(c)].to_numpy(dtype=float)
              for c in schema.classes if schema.score_column(c) in frame}
    attrs = attr_frame(frame, service)
    attr_records = attrs.to_dict("records") if len(attrs.columns) else [None] * len(frame)
    pred = class_names(frame["prediction"], schema.classes).to_numpy() if "prediction" in frame \
        else [None] * len(frame)
    ts = frame["ts"].to_numpy(dtype=object)  # Timestamps: Store converts them to plain UTC datetimes
    ids, versions, status = (frame[c].astype(object).to_numpy() for c in ("request_id", "model_version", "status"))
    out = []
    for i in range(len(frame)):
        row_scores = {c: float(v[i]) for c, v in scores.items() if math.isfinite(v[i])}
        rec = attr_records[i]
        if rec is not None:
            rec = {k: _plain(v) for k, v in rec.items() if _plain(v) is not None}
        out.append({"request_id": str(ids[i]), "model_version": str(versions[i]), "ts": ts[i],
                    "status": str(status[i]), "prediction": pred[i],
                    "scores": row_scores or None, "attrs": rec or None})
    return out


def _plain(value):
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def feedback_scores(labels: pd.Series, feedback) -> np.ndarray:
    """Each label's feedback score (a quality.feedback section): 1 for a positive label, 0 for a negative
    one; or the number a numeric label holds, within the section's min and max. NaN for any other label."""
    names = class_names(labels, []).to_numpy(dtype=object)
    if feedback.positive:
        positive, negative = set(feedback.positive), set(feedback.negative)
        return np.array([1.0 if x in positive else 0.0 if x in negative else np.nan for x in names], dtype=float)
    values = pd.to_numeric(pd.Series(names, dtype=object), errors="coerce").to_numpy(dtype=float)
    lo = -np.inf if feedback.min is None else feedback.min
    hi = np.inf if feedback.max is None else feedback.max
    return np.where(np.isfinite(values) & (values >= lo) & (values <= hi), values, np.nan)


def label_batch(accepted: pd.DataFrame, service: Service) -> LabelBatch:
    """Accepted label rows as dicts in arrival (line) order, labels as class names (monitor.classes); a
    label that is not a declared class (or, for feedback labels, not one of the section's values) is
    refused as `unknown_label`."""
    if accepted is None or accepted.empty:
        return LabelBatch([], [])
    feedback = service.quality.feedback if service.quality is not None else None
    classes = set(service.schema_.classes) if feedback is None else set()
    rows, rejects = [], []
    has_ts = "label_ts" in accepted
    names = class_names(accepted["label"], service.schema_.classes if feedback is None else [])
    known = np.ones(len(names), bool) if feedback is None else np.isfinite(feedback_scores(names, feedback))
    for i, (rid, label) in enumerate(zip(accepted["request_id"].astype(object), names, strict=True)):
        if label is None or (classes and label not in classes) or not known[i]:
            reason = Reason.missing_field if label is None else Reason.unknown_label
            rejects.append(Reject(f"{accepted['_source'].iat[i]}:{accepted[LINE].iat[i]}", reason,
                                  excerpt(f'{{"request_id": "{rid}", "label": "{label}"}}'), "label"))
            continue
        ts = accepted["label_ts"].iat[i] if has_ts else None
        rows.append({"request_id": str(rid), "label": label,
                     "label_ts": None if ts is None or pd.isna(ts) else ts.to_pydatetime()})
    return LabelBatch(rows, rejects)


def orphan_reject(label: dict) -> Reject:
    """The quarantine entry of a label whose prediction never arrived within quality.label_horizon."""
    ts = label["label_ts"].isoformat() if isinstance(label.get("label_ts"), datetime) else None
    text = f'{{"request_id": "{label["request_id"]}", "label": "{label["label"]}", "label_ts": "{ts}"}}'
    return Reject(f"labels:{label['request_id']}", Reason.orphan_label, excerpt(text))


def groups(attrs: pd.DataFrame, service: Service) -> dict[str, np.ndarray]:
    """Row masks of every group quality is scored on: `all`, each segment value (`column=value`), each
    input-length bucket, and each configured expression (pandas eval on the declared columns only)."""
    n = len(attrs)
    out = {ALL_GROUP: np.ones(n, bool)}
    q = service.quality
    for seg in service.schema_.segments:
        if seg in attrs:
            values = attrs[seg]
            for v in sorted({str(x) for x in values.dropna().unique()}):
                out[f"{seg}={v}"] = (values.astype(str) == v).to_numpy() & values.notna().to_numpy()
    for text, edges in (q.length_buckets.items() if q else ()):
        col = attrs[text + LENGTH_SUFFIX].to_numpy(float) if text + LENGTH_SUFFIX in attrs else np.full(n, np.nan)
        for name, lo, hi in length_buckets(text, edges):
            out[name] = (col >= lo) & (col < hi)
    for name, expression in (q.groups.items() if q else ()):
        out[name] = _eval(attrs, expression)
    return out


def _eval(attrs: pd.DataFrame, expression: str) -> np.ndarray:
    """An expression checked by config.expression_columns, evaluated by pandas on `attrs` (a missing
    column or value makes its rows False)."""
    missing = expression_columns(expression) - set(attrs.columns)
    if missing or not len(attrs):
        return np.zeros(len(attrs), bool)
    frame = attrs.copy()
    for col in frame.columns:
        if frame[col].dtype == object:
            numeric = pd.to_numeric(frame[col], errors="coerce")
            if numeric.notna().sum() == frame[col].notna().sum():
                frame[col] = numeric
    try:
        result = frame.eval(expression, engine="python")
    except Exception:  # a type mismatch (text compared with a number): no row is in the group
        return np.zeros(len(attrs), bool)
    return np.asarray(pd.Series(result, index=frame.index).fillna(False), dtype=bool)


def unmatched(frame: pd.DataFrame, service: Service, where: str) -> list[str]:
    """What the config names that no row of `frame` (reference or log rows, as validated or as read) holds,
    one line each: a quality group, a segment column, a declared class, an acceptance rule's group or class;
    each with the values the columns it reads hold. `where` names the rows ("the reference")."""
    if frame is None or not len(frame):
        return []
    q, schema = service.quality, service.schema_
    attrs = attr_frame(frame, service)
    out = []
    masks = groups(attrs, service)
    for name, expression in (q.groups.items() if q else ()):
        if not masks[name].any():
            held = "; ".join(_holds(attrs, c) for c in sorted(expression_columns(expression)))
            out.append(f"group {name} ({expression}) matches no row of {where}; {held}")
    for seg in schema.segments:
        if seg not in attrs or not attrs[seg].notna().any():
            out.append(f"segment {seg} matches no row of {where}: {_holds(attrs, seg)}")
    seen = {c for col in ("label", "prediction") if col in frame
            for c in class_names(frame[col], schema.classes).dropna().unique()}
    named = [col for col in ("label", "prediction") if col in frame]
    if named:
        for c in schema.classes:
            if c not in seen:
                out.append(f"class {c} matches no {' or '.join(named)} of {where}; "
                           + "; ".join(_holds(frame, col) for col in named))
    for rule in (q.rules if q else ()):
        title = f"rule {rule.name or rule.metric}"
        if rule.group not in ("all", "*") and (rule.group not in masks or not masks[rule.group].any()):
            out.append(f"{title}: group {rule.group} matches no row of {where}"
                       + ("" if rule.group in masks else f" (groups: {', '.join(sorted(masks))})"))
        if named and rule.class_ not in ("macro", "weighted", "all") and rule.class_ not in seen:
            out.append(f"{title}: class {rule.class_} matches no {' or '.join(named)} of {where}")
    return out


def _holds(frame: pd.DataFrame, column: str, most: int = 8) -> str:
    """`column holds 1, 2, 3 (integers)`: its distinct present values, the first `most` in order, and
    their type; or that it is absent or empty."""
    if column not in frame:
        return f"no column {column}"
    distinct = pd.Series(frame[column].dropna().unique())
    if not len(distinct):
        return f"{column} holds no value"
    kind = pd.api.types.infer_dtype(distinct, skipna=True)
    kind = {"integer": "integers", "floating": "floats", "mixed-integer-float": "numbers", "boolean": "booleans",
            "string": "text"}.get(kind, kind)
    try:
        distinct = distinct.sort_values()
    except TypeError:  # mixed types: in order of appearance
        pass
    shown = ", ".join(str(v) for v in distinct.iloc[:most])
    more = f", ... ({len(distinct)} values)" if len(distinct) > most else ""
    return f"{column} holds {shown}{more} ({kind})"


@dataclass
class Labelled(Intake):
    """What the label stage read and stored in one tick; counts are requests."""

    labels_new: int = 0  # requests labelled for the first time
    labels_changed: int = 0  # labels that said something else than the stored one (the latest wins)
    labels_repeated: int = 0  # labels repeating the stored one
    labels_expired: int = 0  # labels quarantined: no prediction within quality.label_horizon
    labelled_at: list[datetime] = field(default_factory=list)  # prediction times of the requests (re)labelled


def ingest_labels(config: Config, service: Service, store: Store, now: datetime, tick_id: int,
                  counts: Labelled | None = None) -> Labelled:
    """Read new labels, store them (latest wins, changes counted), quarantine labels whose prediction did
    not arrive within quality.label_horizon. `counts` (returned) is filled as batches commit."""
    counts = Labelled() if counts is None else counts
    name = service.name
    source = open_source(f"{name}/labels", service.sources.labels, config.limits)
    with store.transaction() as session:
        offsets = store.offsets.load(session, source.name)
    relabelled: list[str] = []
    for batch in source.read(offsets):
        rejects: list[Rejected] = []
        accepted = counts.accept(batch, RecordKind.labels, service, config, now, rejects)
        labels = label_batch(accepted, service)
        rejects += [(RecordKind.labels, batch.source, r) for r in labels.rejects]
        counts.accepted[RecordKind.labels.value] -= len(labels.rejects)
        with store.transaction() as session:
            store.quarantine.add(session, quarantine_rows(rejects, tick_id, name, now))
            fresh, changed, repeated = store.labels.upsert(session, name, labels.rows, now)
            store.offsets.save(session, source.name, batch.offsets)
        counts.count(rejects)
        counts.labels_new += len(fresh)
        counts.labels_changed += len(changed)
        counts.labels_repeated += repeated
        relabelled += fresh + changed
    with store.transaction() as session:
        expired = store.labels.expire(session, name, now - service.quality.label_horizon)
        store.quarantine.add(session, quarantine_rows(
            [(RecordKind.labels, source.name, orphan_reject(e)) for e in expired], tick_id, name, now))
        counts.labelled_at = store.labels.prediction_times(session, name, relabelled)
    counts.labels_expired += len(expired)
    counts.quarantined["orphan_label"] += len(expired)
    if not counts.quarantined["orphan_label"]:
        del counts.quarantined["orphan_label"]
    return counts
