"""The checks across one service's sections: a name one section uses that another must declare (an
acceptance rule's group, a `values:` map's field or target), a column read twice (by a `columns:` mapping
and as a schema field, or listed twice), and what is configured but never read; and `metrics.groups`
against the services' quality groups. `errors` are config errors
(what they name can never be read or run); `warnings` are printed by every command that loads the config."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any

from monitor.classes import class_name
from monitor.contract import STATUSES, VALUE_FIELDS, RecordKind

Service = Any  # monitor.config.service.Service, which calls these checks while it is validated

_KINDS = (RecordKind.predictions, RecordKind.timings, RecordKind.labels)


def nearest(name: str, known: Iterable[str]) -> str:
    """"; did you mean 'x'?" for the known name most like `name` (case aside), else ""."""
    by_case = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(by_case), n=1, cutoff=0.6)
    return f"; did you mean {by_case[close[0]]!r}?" if close else ""


def length_buckets(text: str, edges: list[float]) -> list[tuple[str, float, float]]:
    """A text feature's length buckets as (group name, lowest length, length it stays below), in
    characters: `notes_length<512` (-inf, 512), `notes_length>=512` (512, inf)."""
    bounds = [-math.inf, *edges, math.inf]
    return [(f"{text}_length<{hi:g}" if lo == -math.inf else f"{text}_length>={lo:g}" if hi == math.inf
             else f"{lo:g}<={text}_length<{hi:g}", lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def length_groups(text: str, edges: list[float]) -> list[str]:
    """The group names of a text feature's length buckets (`notes_length<512`, `notes_length>=512`)."""
    return [name for name, _, _ in length_buckets(text, edges)]


def group_names(service: Service) -> list[str]:
    """Every quality group name known from the config alone: `all`, `*`, the configured groups and length
    buckets (segment groups, `column=value`, are known only from the data)."""
    q = service.quality
    if q is None:
        return ["all", "*"]
    return ["all", "*", *q.groups, *(g for text, edges in q.length_buckets.items() for g in length_groups(text, edges))]


def cross_errors(service: Service) -> list[str]:
    """What in `service`'s config can never be read or run, one line each, starting with its path."""
    return _duplicates(service) + _read_twice(service) + _maps(service) + _rule_groups(service)


def metrics_errors(groups: list[str], services: list[Service]) -> list[str]:
    """`metrics.groups` naming a group no service's quality section scores (`all`, a `quality.groups` name, a
    length bucket, `<segment>=<value>`): its series would never be exported. One line each, with its path."""
    scored = [s for s in services if s.quality is not None]
    known = list(dict.fromkeys(g for s in scored for g in group_names(s) if g != "*"))
    segments = list(dict.fromkeys(seg for s in scored for seg in s.schema_.segments))
    out = []
    for i, group in enumerate(groups):
        column, eq, _ = group.partition("=")
        if group in known or (eq and column in segments):
            continue
        where = f"metrics.groups[{i}]: {group!r}"
        if not scored:
            out.append(f"{where}: no service has a `quality:` section, so no group is scored")
        elif eq:
            out.append(f"{where}: {column!r} is not a segment of a service with a quality section"
                       f"{nearest(column, segments)} (segments: {', '.join(segments) or 'none'})")
        else:
            names = known + [f"{seg}=<value>" for seg in segments]
            out.append(f"{where} is not a quality group{nearest(group, names)} (groups: {', '.join(names)}); "
                       f"its series would never be exported")
    return out


def cross_warnings(service: Service) -> list[str]:
    """What `service`'s config sets up that nothing reads."""
    if service.sources.labels is not None and service.quality is None:
        return ["sources.labels is configured but never read: labels are scored only with a `quality:` section "
                "(`quality: {}` takes every default; docs/quality.md); add one or remove the source"]
    return []


def _duplicates(service: Service) -> list[str]:
    """A column listed twice in one list, or declared as two kinds that read it differently."""
    schema = service.schema_
    out = []
    for name in ("segments", "signals", "fold_case"):
        listed = getattr(schema, name)
        twice = sorted({c for c in listed if listed.count(c) > 1})
        if twice:
            out.append(f"schema.{name}: {', '.join(twice)} listed twice")
    for seg in dict.fromkeys(schema.segments):
        kind = schema.features.get(seg)
        if kind in ("numeric", "text"):
            out.append(f"schema: {seg} is a segment (split by its values as text) and a {kind} feature; "
                       f"a segment may also be a categorical feature (group a numeric one under quality.groups)")
        if seg in schema.signals:
            out.append(f"schema: {seg} is both a segment (text) and a signal (a number); declare it once")
    for sig in dict.fromkeys(schema.signals):
        kind = schema.features.get(sig)
        if kind in ("categorical", "text"):
            out.append(f"schema: {sig} is a signal (a number) and a {kind} feature; declare it once")
    return out


def _read_twice(service: Service) -> list[str]:
    """A column a `columns:` mapping reads as a contract field that the schema also declares by its own
    name: the mapping renames it, so the schema's field would be missing from every row."""
    schema = service.schema_
    declared = {**{n: "segment" for n in schema.segments}, **{n: "signal" for n in schema.signals},
                **{n: "feature" for n in schema.features}}
    shapes = [(f"sources.{k.value}", getattr(service.sources, k.value)) for k in (RecordKind.predictions,)]
    if service.reference is not None:
        shapes.append(("reference", service.reference))
    out = []
    for where, shape in shapes:
        for field, column in shape.columns.items():
            if column != field and column in declared:
                out.append(f"{where}.columns: column {column!r} is read as {field} and is also declared as schema "
                           f"{declared[column]} {column!r}: a column is read once, so that {declared[column]} "
                           f"would be missing from every row. Use the field's name ({field}) in the schema, "
                           f"or drop `{field}: {column}`")
    return out


def _maps(service: Service) -> list[str]:
    """`values:` maps: each keyed by a field whose values can be respelled, each status target a status,
    each class target a declared class; the reference's `columns:` keyed by fields it can hold."""
    schema = service.schema_
    categorical = [n for n, k in schema.features.items() if k == "categorical"] + list(schema.segments)
    out = []
    shapes = [(f"sources.{k.value}", k, getattr(service.sources, k.value)) for k in _KINDS]
    if service.reference is not None:
        shapes.append(("reference", RecordKind.reference, service.reference))
    for where, kind, shape in shapes:
        if shape is None:
            continue
        allowed = list(VALUE_FIELDS[kind]) + (categorical if kind in (RecordKind.predictions,
                                                                      RecordKind.reference) else [])
        for field, mapping in shape.values.items():
            if field not in allowed:
                out.append(f"{where}.values: {field!r} is not a field whose values map{nearest(field, allowed)} "
                           f"(here: {', '.join(dict.fromkeys(allowed))})")
                continue
            if field == "status":
                out += [f"{where}.values.status: {written!r} -> {meant!r}: not a status{nearest(meant, STATUSES)} "
                        f"(statuses: {', '.join(STATUSES)})" for written, meant in mapping.items()
                        if meant is not None and meant not in STATUSES]
            if field in ("label", "prediction") and schema.classes:
                out += [f"{where}.values.{field}: {written!r} -> {meant!r}: not one of schema.classes "
                        f"{schema.classes}{nearest(meant, schema.classes)}" for written, meant in mapping.items()
                        if meant is not None and class_name(meant, schema.classes) not in schema.classes]
    if service.reference is not None:
        fields = ["label", "prediction", *schema.features, *schema.segments,
                  *(schema.score_column(c) for c in schema.classes)]
        out += [f"reference.columns: {field!r} is not a field of the reference{nearest(field, fields)} "
                f"(label, prediction, the schema's features, segments and score columns)"
                for field in service.reference.columns if field not in fields and not field.startswith("score_")]
    return out


def _rule_groups(service: Service) -> list[str]:
    """Acceptance rules naming a group the config does not define: such a rule would never be decided."""
    q = service.quality
    if q is None:
        return []
    known = group_names(service)
    segments = service.schema_.segments
    out = []
    for i, rule in enumerate(q.rules):
        group = rule.group
        column, eq, _ = group.partition("=")
        if group in known or (eq and column in segments):
            continue
        if eq:
            out.append(f"quality.rules[{i}].group: {group!r}: {column!r} is not a segment"
                       f"{nearest(column, segments)} (segments: {', '.join(segments) or 'none'})")
            continue
        names = known + [f"{s}=<value>" for s in segments]
        out.append(f"quality.rules[{i}].group: {group!r} is not a group{nearest(group, names)} "
                   f"(groups: {', '.join(names)}); the rule would never be decided")
    return out
