"""The scoring stages of a tick: the closed windows it touched scored against their baselines, and label
quality scored for the windows that got labels or predictions; each stores its findings."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from checks.base import Finding
from checks.evaluate import compare_with
from monitor.aggregate.profile import Profile
from monitor.config import Config, Service
from monitor.ingest.quarantine import printable
from monitor.verdicts.evidence import named_labels, text
from monitor.verdicts.quality import score_service, windows_holding
from monitor.verdicts.windows import Anchors, score, store_scored, windows_for
from storage.store import Store


@dataclass
class WindowsScored:
    """What scoring a tick's windows stored."""

    findings: int = 0  # findings written for the windows scored
    breaches: list[str] = field(default_factory=list)  # one line per breaching finding, worst windows last


@dataclass
class QualityScored:
    """What scoring a tick's quality windows stored."""

    quality_windows: int = 0  # (window, model version) pairs quality was scored for
    quality_findings: int = 0
    quality_breaches: list[str] = field(default_factory=list)


def score_windows(service: Service, store: Store, now: datetime, tick_id: int, profile: Profile | None,
                  touched: tuple[datetime, datetime] | None) -> WindowsScored:
    """Score the closed windows at `now` that the rows folded this tick (event times `touched`, earliest and
    latest) completed or added to, and store their findings."""
    # Every length's windows in one call: they share the stored buckets it reads and decodes.
    windows = [w for size in service.buckets.windows for w in windows_for(now, size, touched)]
    ref = service.reference
    params = compare_with(service.check_params(), service.checks, ref.compare_with if ref else "reference")
    scored = score(store, service.name, profile, windows, params=params, baseline_kind=service.baseline,
                   accepted=ref.accepted if ref else None, anchors=load_anchors(service, store))
    return WindowsScored(findings=store_scored(store, service.name, scored, tick_id),
                         breaches=[breach(s.start, s.end, s.model_version, f)
                                   for s in scored for f in s.findings if f.status == "breach"])


def score_quality(config: Config, service: Service, store: Store, now: datetime, tick_id: int,
                  labelled_at: list[datetime], touched: tuple[datetime, datetime] | None) -> QualityScored:
    """Score quality for the windows holding `labelled_at` (prediction times of requests labelled this tick)
    or the event times `touched` by this tick's predictions, and the last closed ones; store the findings."""
    sizes = service.quality.windows
    times = list(labelled_at)
    if touched is not None:
        lo, hi = touched
        step = min(sizes)
        times += [lo + i * step for i in range(int((hi - lo) / step) + 1)] + [hi]
    windows = windows_holding(times, sizes, now, service.quality.tick_windows)
    scored = score_service(config, service, store, now, windows, tick_id)
    return QualityScored(quality_windows=len(scored), quality_findings=sum(len(w.findings) for w in scored),
                         quality_breaches=[breach(w.start, w.end, w.model_version, f)
                                           for w in scored for f in w.findings if f.status == "breach"])


def load_anchors(service: Service, store: Store) -> Anchors:
    """What holds `service`'s baselines (windows.Anchors): its accepted versions (config and `tailwatch
    accept`), every version value's first sighting, and the onsets of its open incidents."""
    with store.transaction() as session:
        accepted = store.versions.load_accepted(session, service.name)
        sightings = store.versions.load(session, service.name)
        incidents = store.incidents.load(session, service.name, status="open")
    listed = set(service.accepted_versions) | {a["value"] for a in accepted}
    if service.quality is not None and service.quality.accepted_version:
        listed.add(service.quality.accepted_version)
    return Anchors(accepted=frozenset(listed),
                   sightings=tuple((v["kind"], v["value"], v["first_seen"]) for v in sightings),
                   incidents=tuple((i["model_version"], i["first_window_start"]) for i in incidents
                                   if i["first_window_start"] is not None),
                   soak=service.soak, lag=service.baseline_lag)


def breach(start: datetime, end: datetime, model_version: str, finding: Finding) -> str:
    """One line for a breaching finding of a window: start+minutes, version, then the finding worded as every
    evidence line is (`evidence.text`: its value in its unit, an acceptance rule against its floor, n and
    interval), control characters escaped (labels come from the logs and the line reaches a terminal)."""
    low, high = finding.interval if finding.interval is not None else (None, None)
    item = {"check": finding.check, "labels": named_labels(finding.check, finding.labels, finding.detail),
            "value": finding.value, "baseline": finding.baseline, "n": finding.n, "interval_low": low,
            "interval_high": high, "detail": finding.detail}
    return printable(f"{start:%Y-%m-%d %H:%M}+{int((end - start).total_seconds() // 60)}m {model_version} "
                     f"{text(item)}")


def describe_labels(labels: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
