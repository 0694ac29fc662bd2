"""monitor.investigate.query on a store filled by the pipeline (SQLite and PostgreSQL): filters, group-by, metrics
checked against the raw logs, ticks and quarantine."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import select
from tests_support import v2_bytes

from monitor.aggregate.codec import encode_json
from monitor.aggregate.partial import ALL, Partial, merge_all
from monitor.investigate import history
from monitor.investigate import query as q
from storage.models import BucketPartial

WINDOW = timedelta(minutes=15)


def raw_predictions(run) -> pd.DataFrame:
    frames = [pd.read_json(p, lines=True, dtype=False, convert_dates=False)
              for p in sorted((run["root"] / "generated" / "predictions").glob("*.jsonl"))]
    out = pd.concat(frames, ignore_index=True)
    out["ts"] = pd.to_datetime(out["ts"], utc=True, format="ISO8601")
    return out


def span(run):
    truth = run["truth"]
    return pd.Timestamp(truth.start).to_pydatetime(), pd.Timestamp(truth.end).to_pydatetime()


def test_findings_filters_match_a_python_filter_of_every_row(filled):
    every = q.findings(filled, "churn")
    assert len(every) > 500 and set(every.columns) == set(q.FINDING_COLUMNS)
    breaches = q.findings(filled, "churn", status="breach", segment="all")
    expected = every[(every["status"] == "breach") & np.array([("segment" not in lab) for lab in every["labels"]])]
    assert len(breaches) == len(expected) > 0
    assert breaches["id"].tolist() == expected["id"].tolist()
    # The scenario's truth: v2 loses the cache right at the onset.
    cache = breaches[breaches["check"] == "cache_hit_rate"]
    assert set(cache["model_version"]) == {"v2"} and cache["value"].max() < cache["baseline"].min()

    p99 = q.findings(filled, "churn", check="latency", labels={"stage": "batch_wait", "quantile": "p99"},
                     window=WINDOW, model_version="v1")
    direct = every[(every["check"] == "latency") & (every["model_version"] == "v1")
                   & (every["window_end"] - every["window_start"] == WINDOW)
                   & np.array([lab.get("stage") == "batch_wait" and lab.get("quantile") == "p99"
                             for lab in every["labels"]])]
    assert p99["id"].tolist() == direct["id"].tolist() and len(p99) >= 3
    segment = q.findings(filled, "churn", segment="Contract=Two year")
    assert len(segment) and all(lab["segment"] == "Contract=Two year" for lab in segment["labels"])
    # A value with LIKE wildcards matches nothing rather than everything.
    assert q.findings(filled, "churn", labels={"stage": "%"}).empty


def test_findings_time_range_is_half_open_on_window_start(filled, scenario_run):
    start, _ = span(scenario_run)
    lo, hi = start + timedelta(minutes=30), start + timedelta(hours=1)
    rows = q.findings(filled, "churn", since=lo, until=hi)
    assert len(rows) and rows["window_start"].min() >= pd.Timestamp(lo) and rows["window_start"].max() < pd.Timestamp(hi)
    assert (rows["window_start"] == pd.Timestamp(lo)).any()


def test_group_findings_counts_breaches_per_group(filled):
    frame = q.findings(filled, "churn", segment="all")
    grouped = q.group_findings(frame, ["check", "model_version"])
    row = grouped[(grouped["check"] == "cache_hit_rate") & (grouped["model_version"] == "v2")].iloc[0]
    direct = frame[(frame["check"] == "cache_hit_rate") & (frame["model_version"] == "v2")]
    assert row["windows"] == len(direct) and row["breaches"] == (direct["status"] == "breach").sum() > 0
    assert grouped["breaches"].tolist() == sorted(grouped["breaches"], reverse=True)
    by_stage = q.group_findings(frame[frame["check"] == "latency"], ["stage", "quantile"])
    assert "batch_wait" in set(by_stage["stage"])


def test_metrics_agree_with_the_raw_logs(filled, scenario_run):
    start, end = span(scenario_run)
    raw = raw_predictions(scenario_run)
    frame = history.metrics(filled, "churn", since=start, until=end + timedelta(hours=1))
    assert set(frame["model_version"]) == {"v1", "v2"}
    for version, got in frame.set_index("model_version").iterrows():
        rows = raw[raw["model_version"] == version]
        assert got["requests"] == len(rows)
        for status in ("ok", "timeout", "rejected", "error"):
            assert got[status] == (rows["status"] == status).sum()
        for label, qv in history.QUANTILES.items():
            exact = np.quantile(rows["latency_ms"].to_numpy(float), qv, method="lower")
            # DDSketch at 1% relative accuracy, plus one rank of slack.
            near = np.quantile(rows["latency_ms"].to_numpy(float), [qv - 0.002, qv + 0.002], method="lower")
            assert near[0] * 0.99 <= got[f"total_{label}_ms"] <= near[1] * 1.01, (version, label, exact)
        hits = rows["cache_hit"].astype(bool)
        assert got["cache_hit_rate"] == pytest.approx(hits.mean())
        # A batch size is a request's that reached the model: not a cache hit, a reject or an error.
        batched = rows["status"].isin(["ok", "timeout"]) & ~hits
        assert got["batch_size_mean"] == pytest.approx(rows.loc[batched, "batch_size"].mean())
        assert (rows.loc[batched, "batch_size"] > 0).all()
    v1, v2 = frame.set_index("model_version").loc["v1"], frame.set_index("model_version").loc["v2"]
    assert v2["cache_hit_rate"] < v1["cache_hit_rate"] - 0.1


def test_metrics_per_period_and_segment(filled, scenario_run):
    start, end = span(scenario_run)
    half = history.metrics(filled, "churn", since=start, until=end, every=timedelta(minutes=30), group_by=())
    assert len(half) == 4 and half["period_start"].tolist() == [pd.Timestamp(start) + timedelta(minutes=30 * i)
                                                               for i in range(4)]
    whole = history.metrics(filled, "churn", since=start, until=end, group_by=())
    assert half["requests"].sum() == whole["requests"].iloc[0]
    seg = history.metrics(filled, "churn", since=start, until=end, segment="*", group_by=["segment"])
    assert ALL not in set(seg["segment"]) and seg["requests"].sum() == whole["requests"].iloc[0]
    with pytest.raises(q.QueryError):
        history.metrics(filled, "churn", since=start, until=end, group_by=["replica"])


def test_metrics_read_partials_as_the_full_merge_does(filled, scenario_run):
    """metrics decodes only the counts and sketches it reads, summing bins with numpy: the same figures, to
    the bit, as decoding every partial whole and merging with merge_all; also for JSON and TWP2 payloads."""
    start, end = span(scenario_run)
    for segment, every, group_by in ((ALL, None, ("model_version",)), ("*", timedelta(minutes=15), ("segment",)),
                                     (ALL, timedelta(minutes=5), ("model_version", "segment"))):
        kw = dict(since=start, until=end, segment=segment, every=every, group_by=group_by)
        fast = history.merged_partials(filled, "churn", health_only=True, **kw)
        full = history.merged_partials(filled, "churn", **kw)
        assert [k for k, _ in fast] == [k for k, _ in full] and len(fast) > 1
        for (_, a), (_, b) in zip(fast, full, strict=True):
            assert a.counts == {k: v for k, v in b.counts.items() if k in history.HEALTH_COUNTS}
            assert a.sketches == {k: v for k, v in b.sketches.items() if history._health_sketch(k)}
            assert history.partial_metrics(a) == history.partial_metrics(b)
    with filled.transaction() as session:
        payloads = session.scalars(select(BucketPartial.payload).where(BucketPartial.segment == ALL)).all()
    parts = [Partial.from_bytes(p) for p in payloads[:20]]
    acc = history._HealthSum()
    for i, part in enumerate(parts):  # every serialized form, interleaved: TWP3, JSON, and TWP2 as stored before
        acc.add((part.to_bytes(), encode_json(part.counts, part.hists, part.sketches, part.unseen, part.profile), v2_bytes(part))[i % 3])
    merged, want = acc.partial(), merge_all(parts)
    assert merged.counts == {k: v for k, v in want.counts.items() if k in history.HEALTH_COUNTS}
    assert merged.sketches == {k: v for k, v in want.sketches.items() if history._health_sketch(k)}
    assert len(merged.sketches) >= 5 and merged.counts["rows"] > 0


def test_ticks_and_quarantine(filled, scenario_run):
    ticks = q.ticks(filled, "churn")
    assert len(ticks) == 9 and set(ticks["status"]) == {"ok"} and ticks["now"].is_monotonic_increasing
    assert q.ticks(filled, "churn", limit=2)["id"].tolist() == ticks["id"].tolist()[-2:]
    rows = q.quarantine(filled, "churn")
    assert len(rows) == 3 and set(rows["kind"]) == {"predictions"}
    grouped = q.quarantine(filled, "churn", group_by=["reason"])
    assert sorted(grouped["reason"]) == ["missing_field", "unknown_status", "unparseable"]
    assert grouped["rows"].tolist() == [1, 1, 1]
    assert len(q.quarantine(filled, "churn", reason="unparseable")) == 1

