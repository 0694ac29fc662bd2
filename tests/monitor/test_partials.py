"""Bucket partials: what fold counts, sketch accuracy, serialization, and the merge laws (hypothesis)."""

from __future__ import annotations

import json
import math
from collections import Counter
from datetime import timedelta

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests_support import v2_bytes

from monitor.aggregate.codec import BINARY, BINARY_V2, encode_json
from monitor.aggregate.fold import fold
from monitor.aggregate.keys import LATENCY, ROUTE
from monitor.aggregate.partial import ALL, MIXED, UNSEEN_KEEP, Partial, merge_all, merge_bytes
from monitor.aggregate.profile import build_profile
from monitor.schema import Schema

T0 = pd.Timestamp("2026-03-01T00:00:00Z")
SCHEMA = Schema(features={"x": "numeric", "c": "categorical", "t": "text"}, signals=["queue_depth"],
                classes=["yes", "no"], segments=["region"])
PROFILE = build_profile(pd.DataFrame({
    "x": np.linspace(0, 100, 101), "c": ["a", "b", "c"] * 33 + ["a", "a"], "t": ["abc", "abcdef", ""] * 33 + ["", ""],
    "prediction": ["yes", "no"] * 50 + ["yes"], "score_yes": np.linspace(0, 1, 101), "input_tokens": np.arange(101)}),
    SCHEMA)


def frame(rows: list[dict]) -> pd.DataFrame:
    n = len(rows)
    f = pd.DataFrame(rows) if rows else pd.DataFrame(columns=["minute"])
    out = pd.DataFrame({
        "request_id": [f"r{i}" for i in range(n)],
        "ts": T0 + pd.to_timedelta(f["minute"].to_numpy(dtype=float), unit="min"),
        "model_version": f.get("mv", pd.Series(["v1"] * n)).to_numpy(),
        "status": f.get("status", pd.Series(["ok"] * n)).to_numpy(),
        "joined": [True] * n, "stage_rows": [1] * n,
    })
    for col in f.columns:
        if col not in ("minute", "mv", "status"):
            out[col] = f[col].to_numpy()
    return out


def by_key(rows) -> dict:
    out: dict = {}
    for r in rows:
        key = (r.model_version, r.bucket_start, r.segment)
        p = Partial.from_bytes(r.payload)
        out[key] = out[key].merge(p) if key in out else p
    return out


def _digits(x: float) -> float:
    """x to 11 significant digits (and 6 decimals): sums of epoch seconds (~1e9 each) are large."""
    return round(float(f"{x:.11g}"), 6)


def norm(p: Partial) -> tuple:
    """Everything exact, float sums rounded (addition order changes their last bits)."""
    sk = {k: (s.pos, s.neg, s.zero, s.count, s.min, s.max, _digits(s.sum), _digits(s.sumsq))
          for k, s in sorted(p.sketches.items())}
    return dict(p.counts), p.hists, sk, p.unseen, p.profile


# -- what fold counts --------------------------------------------------------------------------------

def test_fold_without_schema_keeps_counts_statuses_and_latency():
    f = frame([{"minute": m, "status": s, "latency_ms": 10.0 * (m + 1)} for m, s in
               [(0, "ok"), (1, "error"), (2, "timeout"), (7, "ok")]])
    rows = fold(f, timedelta(minutes=5), [], timed=False)
    assert [(r.rows, r.segment) for r in rows] == [(3, ALL), (1, ALL)]
    p = Partial.from_bytes(rows[0].payload)
    assert p.counts == Counter({"rows": 3, "status:ok": 1, "status:error": 1, "status:timeout": 1})
    assert p.sketches[LATENCY].count == 3 and p.sketches[LATENCY].max == 30.0 and not p.hists


def test_fold_with_profile_counts_ranges_unseen_hists_cache_stages_signals():
    f = frame([
        {"minute": 0, "x": 50.0, "c": "a", "t": "abc", "cache_hit": True, "stage.model": 0.0, "queue_depth": 3.0,
         "prediction": "yes", "score_yes": 0.9, "region": "eu"},
        {"minute": 1, "x": -1.0, "c": "zzz", "t": None, "cache_hit": False, "stage.model": 2.0, "queue_depth": None,
         "prediction": "no", "score_yes": 0.1, "region": "us"},
        {"minute": 2, "x": math.inf, "c": None, "t": "x" * 500, "cache_hit": None, "stage.model": np.nan,
         "queue_depth": 5.0, "prediction": "maybe", "score_yes": None, "region": None},
        {"minute": 3, "x": math.nan, "c": "zzz", "t": "", "cache_hit": True, "stage.model": 0.0, "queue_depth": 4.0,
         "prediction": "yes", "score_yes": 0.5, "region": "eu"},
    ])
    rows = fold(f, timedelta(minutes=5), ["region"], timed=True, schema=SCHEMA, profile=PROFILE)
    segments = {r.segment: Partial.from_bytes(r.payload) for r in rows}
    assert set(segments) == {ALL, "region=eu", "region=us", "region=<missing>"}
    p = segments[ALL]
    c = p.counts
    assert (c["missing:x"], c["missing:c"], c["missing:t"], c["missing:queue_depth"]) == (1, 1, 1, 1)
    assert (c["below:x"], c["above:x"], c["unseen:c"]) == (1, 1, 2)
    assert (c["cache:hit"], c["cache:miss"], c["joined"], c["stage_rows"]) == (2, 1, 4, 4)
    # time per cache outcome, in integer microseconds: the miss's 2 ms model stage; the hits spent 0 there
    assert (c["cache_us:hit:rows"], c["cache_us:miss:rows"], c["cache_us:miss:stage.model"]) == (2, 1, 2000)
    assert "cache_us:hit:stage.model" not in c
    assert p.unseen == {"c": Counter({"zzz": 2})}
    assert sum(p.hists["x"]) == 3 and sum(p.hists["c"]) == 3 and p.hists["c"][-1] == 2
    assert sum(p.hists["len:t"]) == 3 and sum(p.hists["prediction"]) == 4 and sum(p.hists["score:yes"]) == 3
    assert p.sketches["stage.model"].zero == 2 and p.sketches["stage.model"].count == 3
    assert p.sketches["stage.model"].quantile(0.5) == 0.0
    assert p.sketches["signal:queue_depth"].sum == 12.0 and p.profile == PROFILE.fingerprint
    assert segments["region=eu"].rows == 2 and segments["region=us"].counts["unseen:c"] == 1


def test_fold_resolves_a_reference_path(tmp_path):
    path = tmp_path / "ref.csv"
    pd.DataFrame({"x": [1.0, 2.0, 3.0], "c": ["a", "b", "a"], "t": ["x", "yy", ""]}).to_csv(path, index=False)

    class Ref:  # what config.Reference looks like to fold
        def __init__(self, p):
            self.path = p

    rows = fold(frame([{"minute": 0, "x": 9.0, "c": "q", "t": "z"}]), timedelta(minutes=5), [], False,
                schema=SCHEMA, profile=Ref(path))
    p = Partial.from_bytes(rows[0].payload)
    assert p.counts["above:x"] == 1 and p.counts["unseen:c"] == 1


def test_empty_frame_folds_to_nothing():
    assert fold(pd.DataFrame(), timedelta(minutes=5), [], False, schema=SCHEMA, profile=PROFILE) == []


def test_old_payloads_still_read():
    p = Partial.from_bytes(json.dumps({"counts": {"rows": 3, "status:ok": 3}}).encode())
    assert p.rows == 3 and p.hists == {} and p.sketches == {} and p.profile == ""


def test_payloads_are_binary_and_fall_back_to_json_past_64_bits():
    f = frame([{"minute": 0, "x": 1.0, "c": "zz", "t": "ab ab", "latency_ms": 3.0, "replica": "r1"}])
    [row] = fold(f, timedelta(minutes=5), [], False, schema=SCHEMA, profile=PROFILE)
    p = Partial.from_bytes(row.payload)
    assert row.payload[:4] == BINARY and p.to_bytes() == row.payload and Partial.from_bytes(encode_json(p.counts, p.hists, p.sketches, p.unseen, p.profile)) == p
    huge = Partial(p.counts + Counter({"rows": 2**70}), {"x": (2**70, 1)}, p.sketches, p.unseen, p.profile)
    assert huge.to_bytes()[:1] == b"{" and Partial.from_bytes(huge.to_bytes()) == huge
    for big in (2**20, 2**40):  # int32, int64
        wide = Partial(p.counts + Counter({"rows": 2**70}), {"x": (big,) * 3}, p.sketches)
        assert wide.to_bytes()[:4] == BINARY and Partial.from_bytes(wide.to_bytes()) == wide
    assert Partial.from_bytes(Partial().to_bytes()) == Partial()


def test_binary_payloads_stored_before_twp3_still_read_and_merge():
    """TWP3 moved the sketches' sums and extremes out of the JSON header into float64: the TWP2 payloads a
    database already holds read back to the same partial, and merge with new ones."""
    f = frame([{"minute": m % 5, "x": float(m), "c": "abz"[m % 3], "t": "ab " * (m % 4), "latency_ms": 1.5 + m * 0.37,
                "replica": f"r{m % 3}", "queue_depth": m % 4} for m in range(60)])
    rows = fold(f, timedelta(minutes=5), [], False, schema=SCHEMA, profile=PROFILE)
    assert rows and all(r.payload[:4] == BINARY for r in rows)
    for row in rows:
        p = Partial.from_bytes(row.payload)
        assert len(p.sketches) >= 3
        old = v2_bytes(p)
        assert old[:4] == BINARY_V2 and old != row.payload and Partial.from_bytes(old) == p
        assert Partial.from_bytes(merge_bytes(old, row.payload)) == p.merge(p)


def test_serialized_size_is_compact():
    f = frame([{"minute": i % 5, "latency_ms": float(v), "x": float(v % 100), "c": "abc"[i % 3], "t": "w" * (i % 9)}
               for i, v in enumerate(np.random.default_rng(0).lognormal(3, 1, 20000))])
    rows = fold(f, timedelta(minutes=5), [], False, schema=SCHEMA, profile=PROFILE)
    assert len(rows[0].payload) < 8000


# -- merge laws ------------------------------------------------------------------------------------

row_strategy = st.fixed_dictionaries({
    "minute": st.integers(0, 14),
    "mv": st.sampled_from(["v1", "v2"]),
    "status": st.sampled_from(["ok", "ok", "timeout", "error", "rejected"]),
    "x": st.one_of(st.none(), st.floats(-20, 120), st.sampled_from([math.inf, -math.inf, math.nan])),
    "c": st.one_of(st.none(), st.sampled_from(["a", "b", "c"]), st.text("pqrs", min_size=1, max_size=3)),
    "t": st.one_of(st.none(), st.text("abcdef ,", max_size=24)),
    "latency_ms": st.one_of(st.floats(0, 5000), st.just(math.nan)),
    "stage.model": st.one_of(st.just(0.0), st.floats(0, 100)),
    "queue_depth": st.one_of(st.none(), st.floats(-10, 10)),
    "cache_hit": st.sampled_from([True, False, None]),
    "prediction": st.sampled_from(["yes", "no"]),
    "score_yes": st.floats(0, 1),
    "region": st.sampled_from(["eu", "us", None]),
    # what stale_cache, hotspot, oov_rate and the latency additions count
    "cache_version": st.sampled_from(["v1", "v2", "pp1", "v1/pp1", None]),
    "preprocess_version": st.sampled_from(["pp1", "pp2"]),
    "replica": st.sampled_from(["r0", "r1", "r2", None]),
    "cache_state": st.sampled_from(["cold", "warm", None]),
    "ttft_ms": st.one_of(st.floats(0, 500), st.just(math.nan)),
    "output_tokens": st.one_of(st.integers(0, 300), st.just(math.nan)),
    "input_tokens": st.integers(0, 200),
})
rows_strategy = st.lists(row_strategy, min_size=1, max_size=40)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def folded(rows: list[dict]) -> dict:
    return by_key(fold(frame(rows), timedelta(minutes=5), ["region"], True, schema=SCHEMA, profile=PROFILE))


@FAST
@given(rows_strategy, st.data())
def test_folding_the_parts_of_a_split_equals_folding_the_whole(rows, data):
    cut = data.draw(st.integers(0, len(rows)))
    whole = folded(rows)
    parts = [folded(rows[:cut]), folded(rows[cut:])] if 0 < cut < len(rows) else [whole]
    merged: dict = {}
    for part in parts:
        for key, p in part.items():
            merged[key] = merged[key].merge(p) if key in merged else p
    assert set(merged) == set(whole)
    for key in whole:
        assert norm(merged[key]) == norm(whole[key])


@FAST
@given(rows_strategy)
def test_every_row_partials_summed_from_a_segmentation_equal_those_folded_from_the_rows(rows):
    # With a segment column, fold adds the ALL partials up from the segments' (_Acc.summed); without
    # one it folds them from the rows. Both must say the same, float sums to their last bits aside.
    summed = {k: p for k, p in folded(rows).items() if k[2] == ALL}
    direct = by_key(fold(frame(rows), timedelta(minutes=5), [], True, schema=SCHEMA, profile=PROFILE))
    assert set(summed) == set(direct)
    for key, p in direct.items():
        assert norm(summed[key]) == norm(p)


def test_every_row_partials_summed_from_a_segmentation_with_sketch_keys_spread_far():
    # Latencies from 1 us to 30 years in 60 buckets: too many (group, key) cells for one bincount, so the
    # sketch bins of both folds are counted by sorting (_bin_counts' other branch), the summed ones weighted.
    # Each latency twice in its segment: the segments' bins hold counts of 2, which the sum must weigh.
    latencies = np.geomspace(1e-3, 1e12, 360)
    rows = [{"minute": i * 5 // 6, "latency_ms": float(v), "region": ("eu", "us", None)[i % 3]}
            for i, v in enumerate(latencies) for _ in range(2)]
    summed = {k: p for k, p in folded(rows).items() if k[2] == ALL}
    direct = by_key(fold(frame(rows), timedelta(minutes=5), [], True, schema=SCHEMA, profile=PROFILE))
    assert len(direct) == 60 and set(summed) == set(direct)
    for key, p in direct.items():
        assert norm(summed[key]) == norm(p)


@FAST
@given(rows_strategy)
def test_latency_by_routing_value_is_folded_for_all_traffic_only(rows):
    # A segment's partials count its traffic per routing value, with no latency sketch per value; the
    # every-row partials hold those sketches, the very ones a fold without segments makes.
    direct = by_key(fold(frame(rows), timedelta(minutes=5), [], True, schema=SCHEMA, profile=PROFILE))
    for (mv, start, seg), p in folded(rows).items():
        routed = {k: s for k, s in p.sketches.items() if k.startswith(ROUTE)}
        if seg == ALL:
            assert routed == {k: s for k, s in direct[(mv, start, seg)].sketches.items() if k.startswith(ROUTE)}
        else:
            assert routed == {}


def test_segments_count_routing_values_and_all_traffic_sketches_their_latency():
    rows = [{"minute": i % 5, "latency_ms": 1.0 + i, "replica": f"r{i % 3}", "region": ("eu", "us")[i % 2]}
            for i in range(60)]
    out = folded(rows)
    every = out[("v1", T0, ALL)]
    eu = out[("v1", T0, "region=eu")]
    assert {k for k in every.sketches if k.startswith(ROUTE)} == {"route:replica=r0", "route:replica=r1",
                                                                   "route:replica=r2"}
    assert every.sketches["route:replica=r1"].count == 20 and every.sketches["route:replica=r1"].min == 2.0
    assert not any(k.startswith(ROUTE) for k in eu.sketches) and eu.sketches[LATENCY].count == 30
    assert [eu.counts[f"route:replica=r{j}"] for j in range(3)] == [10, 10, 10]


def partials() -> st.SearchStrategy[Partial]:
    return rows_strategy.map(lambda rows: merge_all(p for (_, _, s), p in folded(rows).items() if s == ALL))


@FAST
@given(partials(), partials(), partials())
def test_merge_is_associative_and_commutative_with_an_identity(a, b, c):
    assert norm(a.merge(b)) == norm(b.merge(a))
    assert norm(a.merge(b).merge(c)) == norm(a.merge(b.merge(c)))
    assert norm(a.merge(Partial())) == norm(a) == norm(Partial().merge(a))
    assert norm(Partial.from_bytes(a.to_bytes())) == norm(a)
    assert norm(Partial.from_bytes(merge_bytes(a.to_bytes(), b.to_bytes()))) == norm(a.merge(b))


@pytest.mark.parametrize("regions", [False, True], ids=["folded from rows", "summed from segments"])
def test_unseen_values_are_bounded_and_merge_exactly(regions):
    distinct = [f"new{i}" for i in range(6 * UNSEEN_KEEP)]
    values = distinct * 2
    # With regions, each holds half the values (both copies): the ALL partial adds two bounded segments
    # up, and must bound their union again to the values of the smallest hash.
    rows = [{"minute": 0, "c": v} | ({"region": "eu" if distinct.index(v) % 2 else "us"} if regions else {})
            for v in values]
    whole = folded(rows)[("v1", T0.to_pydatetime(), ALL)]
    assert len(whole.unseen["c"]) == UNSEEN_KEEP and all(n == 2 for n in whole.unseen["c"].values())
    assert whole.counts["unseen:c"] == len(values)
    if regions:
        assert whole.unseen == folded([{k: v for k, v in r.items() if k != "region"} for r in rows])[
            ("v1", T0.to_pydatetime(), ALL)].unseen
    rng = np.random.default_rng(0)
    for _ in range(5):
        order = rng.permutation(len(rows))
        chunks = np.array_split(order, 4)
        parts = [folded([rows[i] for i in chunk])[("v1", T0.to_pydatetime(), ALL)] for chunk in chunks]
        assert merge_all(parts).unseen == whole.unseen


def test_partials_from_different_profiles_drop_histograms_associatively():
    other = build_profile(pd.DataFrame({"x": [1.0, 2.0], "c": ["a", "b"], "t": ["a", "b"]}), SCHEMA)
    f = frame([{"minute": 0, "x": 1.0, "c": "a", "t": "a"}])
    a = Partial.from_bytes(fold(f, timedelta(minutes=5), [], False, schema=SCHEMA, profile=PROFILE)[0].payload)
    b = Partial.from_bytes(fold(f, timedelta(minutes=5), [], False, schema=SCHEMA, profile=other)[0].payload)
    c = Partial.from_bytes(fold(f, timedelta(minutes=5), [], False, schema=SCHEMA)[0].payload)
    assert a.merge(a).hists and a.merge(a).profile == PROFILE.fingerprint
    for x, y, z in [(a, b, c), (a, a, b), (c, a, a), (b, c, a)]:
        left, right = x.merge(y).merge(z), x.merge(y.merge(z))
        assert norm(left) == norm(right) and left.profile == MIXED and left.hists == {}
    assert a.merge(b).rows == 2 and a.merge(b).counts["missing:x"] == 0


# -- one tick through the runner with a reference configured ----------------------------------------

def test_a_tick_with_a_reference_stores_histograms_sketches_and_findings_inputs(store, tmp_path):
    from datetime import UTC, datetime

    from monitor import config as config_mod
    from monitor.daemon.runner import tick

    now = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    (tmp_path / "p").mkdir()
    rng = np.random.default_rng(0)
    lines = [json.dumps({"request_id": f"q{i}", "ts": (now - timedelta(minutes=30) + timedelta(seconds=i)).isoformat(),
                         "model_version": "v1", "status": "ok", "x": float(rng.normal(50, 10)), "c": "abc"[i % 3],
                         "t": "w" * (i % 7), "latency_ms": float(rng.lognormal(3, 0.3)), "cache_hit": i % 2 == 0,
                         "queue_depth": float(i % 5)}) for i in range(300)]
    (tmp_path / "p" / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    pd.DataFrame({"x": rng.normal(50, 10, 1000), "c": rng.choice(list("abc"), 1000),
                  "t": ["w" * k for k in rng.integers(0, 7, 1000)]}).to_csv(tmp_path / "ref.csv", index=False)
    cfg = config_mod.parse({"storage": {"url": "sqlite:///unused.db"}, "services": [{
        "name": "svc", "sources": {"predictions": {"kind": "files", "path": str(tmp_path / "p")}},
        "schema": {"features": {"x": "numeric", "c": "categorical", "t": "text"}, "signals": ["queue_depth"]},
        "reference": {"path": str(tmp_path / "ref.csv")}, "join": {"lateness": "0s"}}]})
    [report] = tick(cfg, store, now)
    assert report.status == "ok", report.error
    with store.transaction() as s:
        rows = store.partials.load(s, "svc", now - timedelta(days=1), now, segment=ALL)
    window = merge_all(Partial.from_bytes(r.payload) for r in rows)
    assert window.rows == 300 and sum(window.hists["x"]) == 300 and sum(window.hists["len:t"]) == 300
    assert window.sketches[LATENCY].count == 300 and window.sketches["signal:queue_depth"].count == 300
    assert window.counts["cache:hit"] == 150 and window.profile


# -- the fast paths agree with the straightforward computation -----------------------------------------

def _pairwise(parts) -> Partial:
    out = Partial()
    for p in parts:
        out = out.merge(p)
    return out


@FAST
@given(st.lists(partials(), max_size=6))
def test_merge_all_equals_merging_one_by_one(parts):
    many = parts * 3
    assert merge_all(many) == _pairwise(many)
    assert merge_all(many).to_bytes() == _pairwise(many).to_bytes()


def test_merge_all_of_many_sketches_unseen_and_mixed_profiles():
    rng = np.random.default_rng(3)
    rows = [{"minute": int(m), "x": float(x), "c": f"v{int(c)}", "t": "ab", "latency_ms": float(lat), "queue_depth": float(q)}
            for m, x, c, lat, q in zip(rng.integers(0, 60, 3000), rng.normal(50, 30, 3000), rng.integers(0, 200, 3000),
                                       rng.lognormal(3, 2, 3000), rng.normal(0, 5, 3000), strict=True)]
    parts = list(folded(rows).values())
    other = build_profile(pd.DataFrame({"x": [1.0, 2.0], "c": ["a", "b"], "t": ["a", "b"]}), SCHEMA)
    odd = Partial.from_bytes(fold(frame(rows[:5]), timedelta(minutes=5), [], False, schema=SCHEMA, profile=other)[0].payload)
    for seq in (parts, parts + [odd], [odd] + parts, [Partial()] + parts[:3] + [Partial()]):
        assert merge_all(seq) == _pairwise(seq)


def test_large_object_columns_bin_like_the_plain_lookups():
    from monitor.aggregate.profile import FieldProfile, as_category, lengths
    from monitor.values import category_values

    rng = np.random.default_rng(4)
    pool = np.array(["a", "b", "ccc", None, float("nan"), "", "a" * 40], dtype=object)
    values = pd.Series(pool[rng.integers(0, len(pool), 20000)], dtype=object)
    values[::7] = pd.Series([f"s{i % 300}" for i in range(len(values[::7]))], dtype=object).to_numpy()  # distinct objects
    ref = FieldProfile("categorical", 0, 0, (0, 0, 0, 0), categories=("a", "s1", "ccc"))
    plain = pd.Categorical(values, categories=list(ref.categories)).codes.astype("int64")
    plain[(plain < 0) & values.notna().to_numpy()] = 3
    assert np.array_equal(ref.bin_index(values), plain)
    v, missing = lengths(values)
    expected = values.where(values.notna(), None).str.len().to_numpy(dtype=float, na_value=np.nan)
    assert np.array_equal(v, expected, equal_nan=True) and np.array_equal(missing, values.isna().to_numpy())
    profile = build_profile(pd.DataFrame({"c": values}), Schema(features={"c": "categorical"})).fields["c"]
    named = category_values(values)  # the reference's categories are read as serving rows are: "" is missing
    counts = as_category(named).dropna().value_counts()
    assert profile.missing == int(named.isna().sum()) == int(values.isna().sum() + (values == "").sum())
    assert dict(zip(profile.categories, profile.counts, strict=False)) == {c: int(counts[c]) for c in profile.categories}


def test_profile_edges_and_counts_match_numpy_quantiles():
    from monitor.aggregate.profile import N_BINS

    rng = np.random.default_rng(5)
    for values in (rng.normal(size=5001), rng.integers(0, 4, 3000).astype(float), np.r_[rng.lognormal(0, 3, 999), np.inf, -np.inf, np.nan]):
        p = build_profile(pd.DataFrame({"x": values}), Schema(features={"x": "numeric"})).fields["x"]
        finite = values[np.isfinite(values)]
        edges = np.unique(np.quantile(finite, np.linspace(0, 1, N_BINS + 1)[1:-1]))
        assert p.edges == tuple(float(e) for e in edges)
        idx = np.searchsorted(edges, values, side="right")
        idx[np.isnan(values)] = -1
        assert p.counts == tuple(int(c) for c in np.bincount(idx[idx >= 0], minlength=len(edges) + 1))
        assert np.array_equal(p.bin_index(pd.Series(values)), idx)


def test_texts_read_row_by_row_fold_as_each_distinct_text_once(monkeypatch):
    """A text column of mostly distinct texts is read row by row (no hash of every text to find the
    distinct ones): the same partials as the distinct-text path, missing values, repeats, Unicode and
    control characters included; a column holding a non-text value keeps the distinct-text path."""
    from monitor.aggregate import tokens

    schema = Schema(features={"t": "text"})
    rng = np.random.default_rng(3)
    words = np.array(["Alpha", "beta,", "gamma!", "caf\u00e9", "tab\tsep", "x" * 300, "id"], dtype=object)
    texts = [" ".join(rng.choice(words, int(rng.integers(0, 6)))) + f" #{i}" for i in range(3000)]
    texts[::7] = [None] * len(texts[::7])
    texts[1::31] = ["the same text"] * len(texts[1::31])
    texts[5] = math.nan
    ref = build_profile(pd.DataFrame({"t": [f"alpha beta {i % 50}" for i in range(500)]}), schema)
    frame = pd.DataFrame({"t": np.array(texts, dtype=object),
                          "ts": pd.Timestamp("2026-01-01", tz="UTC") + pd.to_timedelta(np.arange(3000), unit="s"),
                          "model_version": "v1", "status": "ok"})

    def payloads(f: pd.DataFrame) -> list[bytes]:
        return [p.payload for p in fold(f, timedelta(minutes=5), [], timed=False, schema=schema, profile=ref)]

    whole = payloads(frame)
    assert tokens.text_rows(frame["t"]) is None  # fewer than ROWS_MIN rows
    monkeypatch.setattr(tokens, "ROWS_MIN", 100)
    assert tokens.text_rows(frame["t"]) is not None
    assert payloads(frame) == whole
    odd = frame.assign(t=frame["t"].where(frame.index != 9, 42))
    assert tokens.text_rows(odd["t"]) is None
