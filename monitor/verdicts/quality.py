"""Score quality by prediction-time window from the stored scored predictions and their labels.

Per window and model version: label coverage and bias always, the CBPE estimate always, and once the
window has matured (labelled share >= coverage_threshold, or maturity_horizon after its end) the
labelled quality per class and group, the acceptance rules and the pairwise version comparison. Findings
are upserted on their identity, so re-scoring as labels land rewrites them in place.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from checks.acceptance import acceptance_finding, control_fdr, wilson_figure
from checks.base import Finding
from checks.contract import measured
from checks.quality import (
    MISS,
    Labelled,
    Measure,
    bias_finding,
    compare_versions,
    confusion,
    coverage_findings,
    estimate,
    estimate_findings,
    feedback_measure,
    measure,
    probabilities,
    quality_findings,
    score_classes,
    seed_of,
    window_rows,
)
from monitor.classes import class_name, class_names
from monitor.config import Config, Service
from monitor.ingest.labels import ALL_GROUP, attr_frame, feedback_scores, groups
from monitor.verdicts.accepted import AcceptedHistory, Figures, as_utc
from monitor.verdicts.windows import floor_to
from storage.store import Store

# The decisions a window's versions, classes and groups make at once: one false-discovery budget.
FAMILY = ("acceptance", "label_bias")


@dataclass(frozen=True)
class WindowQuality:
    """What scoring one window of one model version found."""

    start: datetime
    end: datetime
    model_version: str
    predictions: int  # predictions eligible for quality (ok, or every status with failed_as_miss)
    labelled: int
    matured: bool
    findings: list[Finding] = field(default_factory=list)

    @property
    def coverage(self) -> float:
        return self.labelled / self.predictions if self.predictions else 0.0


@dataclass(frozen=True)
class Reference:
    """The reference's quality per (metric, class, group), and the score calibrators CBPE uses."""

    values: dict[tuple[str, str, str], float]
    calibrators: dict[str, object]  # class -> fitted IsotonicRegression on the reference's labels
    measures: dict[tuple[str, str, str], Measure] = field(default_factory=dict)  # values with n and interval


def windows_holding(times: list[datetime], sizes: list[timedelta], now: datetime,
                    limit: int = 12) -> list[tuple[datetime, datetime]]:
    """Closed windows of each size holding any of `times`, and the last closed one; the newest `limit` per
    size (a tick's cost stays bounded; older windows touched by late labels wait for the nightly job)."""
    out = set()
    for size in sizes:
        last_end = floor_to(now, size)
        starts = {floor_to(t, size) for t in times} | {last_end - size}
        out |= {(s, s + size) for s in sorted(x for x in starts if x + size <= last_end)[-limit:]}
    return sorted(out)


def score_service(config: Config, service: Service, store: Store, now: datetime,
                  windows: list[tuple[datetime, datetime]] | None = None,
                  tick_id: int | None = None) -> list[WindowQuality]:
    """Score `windows` (default: the last closed window of each quality window length) and upsert their
    findings; nothing when the service has no quality section."""
    q = service.quality
    if q is None:
        return []
    if windows is None:
        windows = windows_holding([], q.windows, now)
    ref = reference_quality(service)
    history = AcceptedHistory(store, service.name, accepted_of(service), windows)
    scored: list[WindowQuality] = []
    for start, end in sorted(windows):
        with store.transaction() as session:
            rows = store.labels.load(session, service.name, start, end)
        found = score_window(service, rows, start, end, now, ref, history.before(start, end))
        history.add([f.to_row(service.name, w.model_version, w.start, w.end) for w in found for f in w.findings])
        scored += found
    scored, siblings = _decide_by_period(service, store, scored)
    with store.transaction() as session:
        store.findings.upsert(session, [f.to_row(service.name, w.model_version, w.start, w.end, tick_id)
                                        for w in scored for f in w.findings] + siblings)
    return scored


def _decide_by_period(service: Service, store: Store,
                      scored: list[WindowQuality]) -> tuple[list[WindowQuality], list[dict]]:
    """Re-decide acceptance by Benjamini-Hochberg over every window of one length whose start lies in the
    same `fdr_period` (epoch-aligned): the scored windows' findings and the stored ones of the others.
    Returns the scored windows and the stored rows whose decision changed (to be rewritten)."""
    q = service.quality
    blocks: dict[tuple[timedelta, datetime], list[WindowQuality]] = defaultdict(list)
    for w in scored:
        blocks[(w.end - w.start, floor_to(w.start, q.fdr_period))].append(w)
    decided: dict[int, list[tuple[int, Finding]]] = {}
    changed: list[dict] = []
    for (length, block), members in blocks.items():
        fresh = {(w.start, w.model_version) for w in members}
        with store.transaction() as session:
            stored = [r for check in FAMILY
                      for r in store.findings.load(session, service.name, block, block + q.fdr_period, check=check)
                      if as_utc(r["window_end"]) - as_utc(r["window_start"]) == length
                      and (as_utc(r["window_start"]), r["model_version"]) not in fresh]
        new = [(id(w), i, f) for w in members for i, f in enumerate(w.findings) if f.check in FAMILY]
        old = [_as_finding(r) for r in stored]
        family = control_fdr([f for _, _, f in new] + old, q.fdr_q)
        for (key, i, _), f in zip(new, family[:len(new)], strict=True):
            decided.setdefault(key, []).append((i, f))
        for row, before, after in zip(stored, old, family[len(new):], strict=True):
            if (after.status, after.detail) != (before.status, before.detail):
                changed.append(after.to_row(service.name, row["model_version"], as_utc(row["window_start"]),
                                            as_utc(row["window_end"]), row["tick_id"]))
    out = []
    for w in scored:
        findings = list(w.findings)
        for i, f in decided.get(id(w), []):
            findings[i] = f
        out.append(replace(w, findings=findings))
    return out, changed


def _control(scored: list[WindowQuality], q: float) -> list[list[Finding]]:
    """Each window's findings with its FAMILY decisions re-decided together by Benjamini-Hochberg."""
    at = [(j, i) for j, w in enumerate(scored) for i, f in enumerate(w.findings) if f.check in FAMILY]
    out = [list(w.findings) for w in scored]
    for (j, i), f in zip(at, control_fdr([scored[j].findings[i] for j, i in at], q), strict=True):
        out[j][i] = f
    return out


def _as_finding(row: dict) -> Finding:
    """A stored acceptance row as the Finding control_fdr re-decides (only status, p_value, detail count)."""
    low, high = row.get("interval_low"), row.get("interval_high")
    return Finding(row["check"], dict(row["labels"]), row["value"], row["status"], row["n"], row["baseline"],
                   row["effect"], None if low is None else (low, high), row["p_value"], dict(row["detail"] or {}))


def _frame(rows: list[tuple]) -> pd.DataFrame:
    cols = ["request_id", "model_version", "ts", "status", "prediction", "scores", "attrs", "label", "changes"]
    return pd.DataFrame.from_records(rows, columns=cols)


def _named(frame: pd.DataFrame, service: Service) -> pd.DataFrame:
    """`label` and `prediction` as class names (rows stored under an older spelling name the same class)."""
    for column in ("label", "prediction"):
        if column in frame:
            frame[column] = class_names(frame[column], service.schema_.classes)
    return frame


def _classes(service: Service, frame: pd.DataFrame) -> tuple[str, ...]:
    """The declared classes, else every class name the labels and predictions hold (sorted)."""
    if service.schema_.classes:
        return tuple(service.schema_.classes)
    seen = set(frame["label"].dropna()) | set(frame["prediction"].dropna())
    return tuple(sorted(str(x) for x in seen))


def _proba(scores: pd.Series, classes: tuple[str, ...], calibrators: dict[str, object]) -> np.ndarray:
    """Rows x classes probabilities from the stored score dicts, calibrated on the reference when it can be."""
    keys = set().union(*(s.keys() for s in scores if isinstance(s, dict)))
    renamed = {k: class_name(k, classes) for k in keys}
    if any(k != name for k, name in renamed.items()):  # keys stored under an older spelling of a class
        scores = pd.Series([{renamed[k]: v for k, v in s.items()} if isinstance(s, dict) else s for s in scores],
                           index=scores.index, dtype=object)
    present = [c for c in classes if any(isinstance(s, dict) and c in s for s in scores)]
    raw = np.array([[s.get(c, np.nan) if isinstance(s, dict) else np.nan for c in present] for s in scores],
                   dtype=float).reshape(len(scores), len(present))
    for j, c in enumerate(present):
        cal = calibrators.get(c)
        if cal is not None:
            ok = np.isfinite(raw[:, j])
            if ok.any():
                raw[ok, j] = cal.predict(raw[ok, j])
    if not present:
        return np.full((len(scores), len(classes)), np.nan)
    return probabilities(raw, classes, [classes.index(c) for c in present])


def score_window(service: Service, rows: list[tuple], start: datetime, end: datetime, now: datetime,
                 ref: Reference, accepted: Figures | None = None) -> list[WindowQuality]:
    """Findings of one window per model version (pure: the rows come from Store.labels.load). `accepted`:
    the accepted version's figures before the window (AcceptedHistory.before), the baseline of another version's
    rules when the accepted one did not serve this window; before labels mature, its estimates are judged
    against the accepted version's estimates (acceptance findings with detail `estimated`)."""
    q = service.quality
    assert q is not None
    if not rows:
        return []
    frame = _named(_frame(rows), service)
    if q.feedback is not None:
        return _feedback_window(service, frame, start, end, now, ref, accepted or {})
    classes = _classes(service, frame)
    if not classes:  # no declared classes and neither labels nor predictions name one: nothing to score
        return []
    positive = service.schema_.positive_class
    # Stored attrs already hold what attr_frame made at ingest (raw values and <text>_length).
    attrs = pd.DataFrame.from_records([a or {} for a in frame["attrs"]], index=range(len(frame)))
    masks = groups(attrs, service)
    failed = (frame["status"] != "ok").to_numpy()
    eligible = ~failed if not q.failed_as_miss else np.ones(len(frame), bool)
    known = frame["label"].isin(classes).to_numpy()
    labelled = eligible & known
    proba = _proba(frame["scores"], classes, ref.calibrators)
    whole = window_rows(frame["label"], frame["prediction"], failed, proba, classes)
    pred = whole.y_pred
    matured_by_age = now >= end + q.maturity_horizon
    statement = {"failed_as_miss": q.failed_as_miss}

    out, measured, estimated = [], {}, {}
    versions = sorted(frame["model_version"].unique())
    for version in versions:
        v = (frame["model_version"] == version).to_numpy()
        elig, lab = v & eligible, v & labelled
        n_elig, n_lab = int(elig.sum()), int(lab.sum())
        coverage = n_lab / n_elig if n_elig else 0.0
        matured = n_elig > 0 and (coverage >= q.coverage_threshold or matured_by_age)
        detail = {**statement, "coverage": round(coverage, 6), "matured": matured,
                  "label_changes": int(pd.to_numeric(frame["changes"]).fillna(0).to_numpy()[lab].sum())}
        findings = coverage_findings(pred[elig], labelled[elig], classes, q.min_n, detail)
        expected = proba[elig & ~failed]
        share = dict(zip(classes, np.nanmean(expected, axis=0).round(6).tolist(), strict=True)) \
            if np.isfinite(expected).all(axis=1).any() else None
        findings.append(bias_finding(pred[elig], labelled[elig], classes, q.min_n, q.bias_tolerance, share, detail))
        realized_all: dict[str, dict] = {}
        if matured:
            for group, mask in masks.items():
                sel = lab & mask
                data = whole.take(sel)
                ms = measure(data, positive, q.calibration_bins, q.bootstrap_samples,
                             seed_of(q.seed, service.name, start.isoformat(), end.isoformat(), version, group))
                gdetail = {**detail, "group_n": int(sel.sum())}
                qf = quality_findings(ms, group, q.min_n, ref.values, gdetail)
                if len(data):
                    for f in qf:
                        if f.labels["metric"] == "accuracy":
                            f.detail["confusion"] = confusion(data)
                findings += qf
                measured[(version, group)] = {(f.labels["metric"], f.labels["class"]): f for f in qf}
                realized_all[group] = {(m.metric, m.cls): m.value for m in ms}
        for group, mask in masks.items():
            sel = elig & ~failed & mask
            if sel.any():
                est = estimate(pred[sel], proba[sel], classes, q.bootstrap_samples,
                               seed_of(q.seed, "estimate", start.isoformat(), end.isoformat(), version, group))
                ef = estimate_findings(est, realized_all.get(group, {}), group, q.min_n,
                                       {**statement, "matured": matured}, ref.values)
                findings += ef
                estimated[(version, group)] = {(f.labels["metric"], f.labels["class"]): f for f in ef}
        out.append(WindowQuality(start, end, version, n_elig, n_lab, matured, findings))

    # The window's own decisions (versions x rules x groups, and each version's label bias) as one family;
    # score_service widens it to the windows of the same length in the same fdr_period.
    rules = {w.model_version: _acceptance(service, w.model_version, measured, masks, ref, accepted or {})
             if w.matured else _estimated_acceptance(service, w.model_version, estimated, masks, accepted or {})
             for w in out}
    for w in out:
        w.findings.extend(rules.get(w.model_version, ()))
    out = [replace(w, findings=f) for w, f in zip(out, _control(out, q.fdr_q), strict=True)]
    out = _with_comparisons(service, out, frame, whole, labelled, positive, start, end)
    return out


def _feedback_window(service: Service, frame: pd.DataFrame, start: datetime, end: datetime, now: datetime,
                     ref: Reference, accepted: Figures) -> list[WindowQuality]:
    """Feedback labels (quality.feedback) of one window per model version: label coverage always; once
    matured, the feedback rate or mean per group and the acceptance rules on it. Without predictions there
    is no estimate before labels, no label bias by predicted class and no version comparison."""
    q = service.quality
    attrs = pd.DataFrame.from_records([a or {} for a in frame["attrs"]], index=range(len(frame)))
    masks = groups(attrs, service)
    eligible = (frame["status"] == "ok").to_numpy() if not q.failed_as_miss else np.ones(len(frame), bool)
    score = feedback_scores(frame["label"], q.feedback)
    labelled = eligible & np.isfinite(score)
    changes = pd.to_numeric(frame["changes"]).fillna(0).to_numpy()
    out, measured = [], {}
    for version in sorted(frame["model_version"].unique()):
        v = (frame["model_version"] == version).to_numpy()
        elig, lab = v & eligible, v & labelled
        n_elig, n_lab = int(elig.sum()), int(lab.sum())
        coverage = n_lab / n_elig if n_elig else 0.0
        matured = n_elig > 0 and (coverage >= q.coverage_threshold or now >= end + q.maturity_horizon)
        detail = {"failed_as_miss": q.failed_as_miss, "coverage": round(coverage, 6), "matured": matured,
                  "label_changes": int(changes[lab].sum())}
        findings = coverage_findings(np.full(n_elig, None, dtype=object), labelled[elig], (), q.min_n, detail)
        for group, mask in masks.items() if matured else ():
            m = feedback_measure(score[lab & mask], q.feedback.metric, (q.feedback.min, q.feedback.max))
            qf = quality_findings([m], group, q.min_n, ref.values, {**detail, "group_n": m.n})
            findings += qf
            measured[(version, group)] = {(m.metric, m.cls): qf[0]}
        out.append(WindowQuality(start, end, version, n_elig, n_lab, matured, findings))
    for w in out:
        if w.matured:
            w.findings.extend(_acceptance(service, w.model_version, measured, masks, ref, accepted))
    return [replace(w, findings=f) for w, f in zip(out, _control(out, q.fdr_q), strict=True)]


def _acceptance(service: Service, version: str, measured: dict, masks: dict, ref: Reference,
                history: Figures) -> list[Finding]:
    """Each rule on each of its groups for one version, against the accepted version's figure in the same
    window when it has one, else its figure over its last windows (`history`), else the reference's (each
    an estimate with its n and interval)."""
    q = service.quality
    out = []
    accepted = accepted_of(service)
    for rule in q.rules:
        for group in _targets(rule, masks):
            observed = measured.get((version, group), {}).get((rule.metric, rule.class_))
            base, source = ref.measures.get((rule.metric, rule.class_, group)), "reference"
            if accepted and accepted != version:
                base, source = _accepted_base(measured, history, accepted, group, rule, False) or (base, source)
            out.append(acceptance_finding(rule, group, observed, base, source, q.min_n))
    return out


def _estimated_acceptance(service: Service, version: str, estimated: dict, masks: dict,
                          history: Figures) -> list[Finding]:
    """Before labels: each max_drop rule on a version that is not the accepted one, its estimate against the
    accepted version's estimate (the same window's, else its last windows'): the two estimates share the
    calibration, so its error cancels. Nothing for the accepted version or without its estimates."""
    q = service.quality
    accepted = accepted_of(service)
    if not accepted or accepted == version:
        return []
    out = []
    for rule in (r for r in q.rules if r.max_drop is not None):
        for group in _targets(rule, masks):
            observed = estimated.get((version, group), {}).get((rule.metric, rule.class_))
            found = _accepted_base(estimated, history, accepted, group, rule, True)
            if observed is None or found is None:
                continue
            f = acceptance_finding(rule, group, observed, found[0], found[1], q.min_n)
            out.append(replace(f, detail={**f.detail, "estimated": True}))
    return out


def accepted_of(service: Service) -> str | None:
    """The version other versions' quality is judged against: quality.accepted_version, else the last of
    the service's accepted_versions; None without either."""
    q = service.quality
    if q is not None and q.accepted_version:
        return q.accepted_version
    return service.accepted_versions[-1] if service.accepted_versions else None


def _targets(rule, masks: dict) -> list[str]:
    return [g for g in masks if g != ALL_GROUP] if rule.group == "*" else [rule.group]


def _accepted_base(same: dict, history: Figures, accepted: str, group: str, rule,
                   estimate: bool) -> tuple[Finding | Measure, str] | None:
    """The accepted version's figure for `rule` on `group`: the same window's (`same`: (version, group) ->
    figures), else its last windows' (`history`); None when it has neither."""
    other = same.get((accepted, group), {}).get((rule.metric, rule.class_))
    if other is not None and other.value is not None and other.status == "ok":
        return other, f"version {accepted}"
    return history.get((estimate, rule.metric, rule.class_, group))


def _with_comparisons(service: Service, out: list[WindowQuality], frame: pd.DataFrame, whole: Labelled,
                      labelled, positive, start, end) -> list[WindowQuality]:
    """Add `version_compare` findings to each version that shares requests with the accepted version
    (or, without one, the first version in name order)."""
    q = service.quality
    versions = [w.model_version for w in out]
    if len(versions) < 2:
        return out
    accepted = accepted_of(service)
    base = accepted if accepted in versions else versions[0]
    idx = {v: pd.Series(np.flatnonzero((frame["model_version"] == v).to_numpy()),
                        index=frame["request_id"][frame["model_version"] == v].to_numpy()) for v in versions}
    for w in out:
        if w.model_version == base or not w.matured:
            continue
        shared = idx[base].index.intersection(idx[w.model_version].index)
        if not len(shared):
            continue
        ia, ib = idx[base][shared].to_numpy(), idx[w.model_version][shared].to_numpy()
        both = labelled[ia] & labelled[ib]
        a, b, pred = whole.take(ia[both]), whole.take(ib[both]), whole.y_pred
        seed = seed_of(q.seed, service.name, start.isoformat(), end.isoformat(), base, w.model_version)
        for m in compare_versions(a, b, pred[ia], pred[ib], positive, q.bootstrap_samples, seed):
            status = measured(m.value, m.n, q.min_n)
            w.findings.append(Finding("version_compare", {"metric": m.metric, "class": m.cls, "against": base},
                                      m.value, status, m.n, interval=m.interval,
                                      detail={**m.detail, "failed_as_miss": q.failed_as_miss}))
    return out


# -- the reference ---------------------------------------------------------------------------------


def reference_quality(service: Service) -> Reference:
    """The reference's quality per group (when it holds `label` and `prediction`) and CBPE's calibrators
    (when it holds `label` and scores); empty without a reference."""
    if service.reference is None or service.quality is None:
        return Reference({}, {})
    path = service.reference.path
    try:
        stat = os.stat(path)
    except OSError:
        return Reference({}, {})
    key = (str(path), stat.st_mtime_ns, stat.st_size, service.model_dump_json())
    if key not in _REFERENCES:
        if len(_REFERENCES) >= 16:
            _REFERENCES.clear()
        _REFERENCES[key] = _reference(str(path), service)
    return _REFERENCES[key]


_REFERENCES: dict[tuple, Reference] = {}  # by file identity and service config: a tick reads it once


def _reference(path: str, service: Service) -> Reference:
    from sklearn.isotonic import IsotonicRegression

    from monitor.aggregate.profile import read_reference

    frame = read_reference(service.reference, service.schema_.fold_case)
    if "label" not in frame:
        return Reference({}, {})
    schema, q = service.schema_, service.quality
    frame = _named(frame, service)
    if q.feedback is not None:  # the reference's feedback per group: the baseline of max_drop rules
        score = feedback_scores(frame["label"], q.feedback)
        ms = {(m.metric, m.cls, g): m for g, mask in groups(attr_frame(frame, service), service).items()
              for m in [feedback_measure(score[mask], q.feedback.metric, (q.feedback.min, q.feedback.max))]
              if m.value is not None}
        return Reference({k: m.value for k, m in ms.items()}, {}, ms)
    classes = tuple(schema.classes) or tuple(sorted(frame["label"].dropna().unique()))
    y = frame["label"].where(frame["label"].notna(), "").to_numpy(dtype=object)
    calibrators = {}
    for c in score_classes(classes, schema.positive_class):
        col = schema.score_column(c)
        if col in frame:
            s = frame[col].to_numpy(float)
            ok = np.isfinite(s)
            if ok.sum() >= 2 and len(set(y[ok] == c)) == 2:
                calibrators[c] = IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1).fit(s[ok], y[ok] == c)
    values: dict[tuple[str, str, str], float] = {}
    measures: dict[tuple[str, str, str], Measure] = {}
    boot = any(not wilson_figure(r.metric, r.class_) for r in q.rules)
    if "prediction" in frame:
        present = [c for c in classes if schema.score_column(c) in frame]
        raw = frame[[schema.score_column(c) for c in present]].to_numpy(float) if present else np.zeros((len(frame), 0))
        proba = probabilities(raw, classes, [classes.index(c) for c in present]) if present \
            else np.full((len(frame), len(classes)), np.nan)
        pred = frame["prediction"].where(frame["prediction"].notna(), MISS).to_numpy(dtype=object)
        known = np.isin(y, classes)
        for group, mask in groups(attr_frame(frame, service), service).items():
            sel = known & mask
            # The reference is an estimate: Wilson intervals always, bootstrap ones when a rule compares with one.
            ms: list[Measure] = measure(Labelled(y[sel], pred[sel], proba[sel], classes), schema.positive_class,
                                        q.calibration_bins, samples=q.bootstrap_samples if boot else 0,
                                        seed=seed_of(q.seed, "reference", group))
            values |= {(m.metric, m.cls, group): m.value for m in ms if m.value is not None}
            measures |= {(m.metric, m.cls, group): m for m in ms if m.value is not None}
    return Reference(values, calibrators, measures)


def realized_error(findings: list[Finding]) -> dict[tuple[str, str], list[float]]:
    """Estimate errors (estimate - realized) of the `quality_estimate` findings, by (metric, class) of
    group `all`."""
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for f in findings:
        if f.check == "quality_estimate" and f.labels.get("group") == ALL_GROUP and f.detail.get("estimate_error") is not None:
            out[(f.labels["metric"], f.labels["class"])].append(f.detail["estimate_error"])
    return dict(out)
