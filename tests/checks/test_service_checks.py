"""stale_cache, hotspot, oov_rate and the latency additions (ttft, tokens/s, input-length buckets,
throughput, queue trend), cold / warm cache, thresholds from config: tiny inline frames."""

from __future__ import annotations

import json
from datetime import timedelta

import numpy as np
import pandas as pd
import pytest

from checks.cache import CacheThreshold, StaleThreshold, cache_hit_rate, stale_cache
from checks.catalog import thresholds
from checks.evaluate import evaluate
from checks.latency import LatencyThreshold, latency
from checks.routing import HotspotThreshold, hotspot
from checks.vocabulary import OovThreshold, oov_rate
from monitor.aggregate.fold import fold
from monitor.aggregate.partial import ALL, Partial, merge_all
from monitor.aggregate.profile import Profile, build_profile
from monitor.config import ConfigError, parse
from monitor.schema import Schema


def find(findings, **labels):
    return next(f for f in findings if f.labels == labels)


# -- stale_cache ---------------------------------------------------------------------------------------

def test_stale_hits_breach_and_name_the_old_version(make, window):
    n = 400
    w = window(make(n, model_version=["v2"] * n, cache_hit=[True] * 200 + [False] * 200,
                    cache_version=["v1"] * 60 + ["v2"] * 140 + [None] * 200))
    [f] = stale_cache(w, None, None, StaleThreshold())
    assert f.status == "breach" and f.value == pytest.approx(0.3) and f.n == 200
    assert f.interval[0] < 0.3 < f.interval[1] and f.detail["top"] == [["v1", 60]]


def test_fresh_hits_match_model_preprocess_or_both(make, window):
    n = 300
    cached = ["v1"] * 100 + ["pp1"] * 100 + ["v1/pp1"] * 100
    w = window(make(n, cache_hit=[True] * n, cache_version=cached, preprocess_version=["pp1"] * n))
    [f] = stale_cache(w, None, None, StaleThreshold())
    assert f.status == "ok" and f.value == 0.0 and f.n == 300


def test_stale_cache_empty_single_and_unversioned(make, window):
    assert stale_cache(Partial(), None, None, StaleThreshold()) == []
    assert stale_cache(window(make(5, cache_hit=[True] * 5)), None, None, StaleThreshold()) == []  # no version
    [one] = stale_cache(window(make(1, cache_hit=[True], cache_version=["v0"])), None, None, StaleThreshold())
    assert one.status == "insufficient" and one.value == 1.0 and one.n == 1
    # misses never count, whatever their cache_version says
    assert stale_cache(window(make(3, cache_hit=[False] * 3, cache_version=["v0"] * 3)), None, None,
                       StaleThreshold()) == []


# -- hotspot -------------------------------------------------------------------------------------------

def test_even_replicas_are_ok_and_one_busy_slow_replica_breaches(make, window):
    rng = np.random.default_rng(1)
    n = 2000
    even = window(make(n, replica=rng.choice(["a", "b", "c", "d"], n), latency_ms=rng.lognormal(3, 0.3, n)))
    share, lat = hotspot(even, None, None, HotspotThreshold())
    assert share.labels == {"field": "replica", "measure": "share"} and share.status == "ok"
    assert share.baseline == 0.25 and lat.status == "ok" and lat.detail["value"] == share.detail["value"]
    replica = np.where(rng.random(n) < 0.7, "a", rng.choice(["b", "c", "d"], n))
    lat_ms = np.where(replica == "a", 3.0, 1.0) * rng.lognormal(3, 0.3, n)
    busy = window(make(n, replica=replica, latency_ms=lat_ms, expert=["e1"] * n))
    findings = hotspot(busy, None, None, HotspotThreshold())
    share, lat = find(findings, field="replica", measure="share"), find(findings, field="replica", measure="latency")
    assert share.status == "breach" and share.detail["value"] == "a" and share.effect > 2.5
    assert lat.status == "breach" and lat.effect > 2
    # one expert only: nothing to compare with
    assert {f.status for f in findings if f.labels["field"] == "expert"} == {"insufficient"}


def test_hotspot_empty_single_row_and_missing_latency(make, window):
    assert hotspot(Partial(), None, None, HotspotThreshold()) == []
    share, lat = hotspot(window(make(1, route=["x"])), None, None, HotspotThreshold())
    assert share.status == lat.status == "insufficient" and share.value == 1.0 and lat.value is None
    f = hotspot(window(make(4, route=["x", "y", None, "x"], latency_ms=[np.nan, np.inf, 1.0, 0.0])), None, None,
                HotspotThreshold())
    assert find(f, field="route", measure="share").n == 3  # the row without a route is not routed


def test_hotspot_latency_is_judged_on_all_traffic_and_a_segment_gets_the_share(make):
    # Latency by replica is folded for all traffic only: a segment's window (its latency, none by replica)
    # says how its traffic is spread, not how fast each replica served it.
    rng = np.random.default_rng(3)
    n = 3000
    replica = rng.choice(["a", "b", "c"], n)
    frame = make(n, replica=replica, latency_ms=np.where(replica == "a", 3.0, 1.0) * rng.lognormal(3, 0.3, n),
                 region=rng.choice(["eu", "us"], n))
    rows = fold(frame, timedelta(hours=1), ["region"], timed=True)
    every = merge_all(Partial.from_bytes(r.payload) for r in rows if r.segment == ALL)
    eu = merge_all(Partial.from_bytes(r.payload) for r in rows if r.segment == "region=eu")
    share, lat = hotspot(every, None, None, HotspotThreshold())
    assert share.status == "ok" and lat.status == "breach" and lat.detail["value"] == "a"
    [eu_share] = hotspot(eu, None, None, HotspotThreshold())
    assert eu_share.labels == {"field": "replica", "measure": "share"} and eu_share.status == "ok"
    assert eu_share.n == eu.rows > 1000


# -- oov_rate ------------------------------------------------------------------------------------------

WORDS = [f"word{i}" for i in range(50)]


def texts(rng, n, words=WORDS):
    return [" ".join(rng.choice(words, 6)) + f" id{i}" for i in range(n)]


@pytest.fixture(scope="module")
def text_profile() -> tuple[Schema, Profile]:
    schema = Schema(features={"t": "text"})
    rng = np.random.default_rng(5)
    return schema, build_profile(pd.DataFrame({"t": [" ".join(rng.choice(WORDS, 7)) for _ in range(3000)]}), schema)


def test_oov_of_known_words_is_ok_and_new_words_breach(make, window, text_profile):
    schema, profile = text_profile
    ref = profile.fields["t"]
    assert set(ref.vocabulary) == set(WORDS) and ref.expected_oov == 0.0
    rng = np.random.default_rng(6)
    # One unknown token in seven (the id): 1/7 out of vocabulary
    [same] = oov_rate(window(make(2000, t=texts(rng, 2000)), schema, profile), profile, None, OovThreshold())
    assert same.value == pytest.approx(1 / 7) and same.status == "breach"  # ids are new words
    known = [" ".join(rng.choice(WORDS, 7)) for _ in range(2000)]
    [ok] = oov_rate(window(make(2000, t=known), schema, profile), profile, None, OovThreshold())
    assert ok.status == "ok" and ok.value < 0.03 and 2000 / 8 / 2 < ok.n < 2000 / 8 * 2
    new = [f"nouveau{i} mot{i} " + " ".join(rng.choice(WORDS, 2)) for i in range(2000)]
    [f] = oov_rate(window(make(2000, t=new), schema, profile), profile, None, OovThreshold())
    assert f.status == "breach" and f.value == pytest.approx(0.5) and f.interval[0] > 0.4


def test_a_reference_of_many_distinct_texts_counts_its_vocabulary_over_a_hash_sample(make, window, monkeypatch):
    """Past VOCABULARY_TEXTS distinct texts the vocabulary is counted over a hash sample of them: the
    same profile in any row order, the same common words, and an expected share that estimates the
    whole reference's, so a window like the reference is judged alike."""
    from monitor.aggregate import profile as profile_mod

    schema = Schema(features={"t": "text"})
    rng = np.random.default_rng(8)
    frame = pd.DataFrame({"t": texts(rng, 4000) + [None] * 100})
    whole = build_profile(frame, schema).fields["t"]
    monkeypatch.setattr(profile_mod, "VOCABULARY_TEXTS", 256)
    sampled = build_profile(frame, schema)
    ref = sampled.fields["t"]
    assert build_profile(frame.sample(frac=1, random_state=1), schema).to_json() == sampled.to_json()
    assert whole.tokens == 4000 * 7 and whole.tokens / 32 < ref.tokens < whole.tokens / 8
    assert set(WORDS) <= set(ref.vocabulary) and ref.counts == whole.counts and ref.missing == 100
    assert whole.expected_oov == pytest.approx(1 / 7) and ref.expected_oov == pytest.approx(1 / 7)
    [f] = oov_rate(window(make(2000, t=texts(rng, 2000)), schema, sampled), sampled, None, OovThreshold())
    assert f.status == "ok" and f.baseline == pytest.approx(1 / 7)


def test_oov_empty_single_nan_and_cut_words(make, window, text_profile):
    schema, profile = text_profile
    [empty] = oov_rate(Partial(), profile, None, OovThreshold())
    assert empty.status == "insufficient" and empty.value is None
    assert oov_rate(Partial(), None, None, OovThreshold()) == []
    few = window(make(3, t=[None, np.nan, "word1 zzz"]), schema, profile)
    [f] = oov_rate(few, profile, None, OovThreshold())
    assert f.status == "insufficient" and f.n <= 1
    # A long text's cut last word is dropped, not counted as new
    from monitor.aggregate.tokens import TOKEN_CHARS, tokens
    flat, parent = tokens(np.array(["word1 " * 100, "short words"], dtype=object))
    assert set(flat.to_pylist()) == {"word1", "short", "words"} and len(flat) == TOKEN_CHARS // 6 + 2
    assert list(parent[-2:]) == [1, 1]


def test_a_profile_stored_before_vocabularies_loads_keeps_its_fingerprint_and_says_rebuild(text_profile):
    _, profile = text_profile
    raw = json.loads(profile.to_json())
    for key in ("vocabulary", "tokens", "oov_tokens", "singletons"):
        raw["fields"]["t"].pop(key, None)
    old_text = json.dumps(raw, separators=(",", ":"), sort_keys=True)
    old = Profile.from_json(old_text)
    assert old.to_json() == old_text and old.fields["t"].vocabulary == ()
    [f] = oov_rate(Partial(), old, None, OovThreshold())
    assert f.status == "insufficient" and "rebuild" in f.detail["note"]
    assert Profile.from_json(profile.to_json()) == profile


# -- latency additions ---------------------------------------------------------------------------------

def generative(n, rng, slow=1.0, decode=1.0):
    out = rng.integers(20, 200, n)
    ttft = rng.lognormal(5, 0.3, n) * slow
    return {"ttft_ms": ttft, "output_tokens": out, "input_tokens": rng.integers(10, 500, n),
            "latency_ms": ttft + out * 20.0 / decode}


def test_ttft_tokens_per_second_and_throughput(make, window):
    rng = np.random.default_rng(2)
    base = window(make(3000, **generative(3000, rng)))
    w = window(make(1500, **generative(1500, rng, slow=3.0, decode=0.5)))
    f = latency(w, None, base, LatencyThreshold())
    assert find(f, stage="ttft", quantile="p95").status == "breach"
    tps = find(f, tokens_per_s="output", quantile="p50")
    assert tps.status == "breach" and tps.detail["unit"] == "tokens/s" and 15 < tps.value < 30
    samples = find(f, throughput="samples")
    assert samples.value == pytest.approx(1500 / 3599, rel=1e-3) and samples.baseline == pytest.approx(3000 / 3599, rel=1e-3)
    assert samples.status == "ok"  # throughput is reported, not judged, by default
    strict = latency(w, None, base, LatencyThreshold(min_throughput_ratio=0.8))
    assert find(strict, throughput="samples").status == "breach"
    out_tokens = find(f, throughput="output_tokens")
    assert out_tokens.value > samples.value * 20 and find(f, throughput="input_tokens").value > 0
    healthy = latency(window(make(1500, **generative(1500, rng))), None, base, LatencyThreshold())
    assert find(healthy, tokens_per_s="output", quantile="p50").status == "ok"
    assert find(healthy, stage="ttft", quantile="p95").status == "ok"


def test_zero_latency_gives_no_tokens_per_second_and_zero_duration_spans(make, window):
    f = latency(window(make(3, latency_ms=[0.0, 0.0, 0.0], output_tokens=[5, 5, 5])), None, None, LatencyThreshold())
    # every request took 0 ms: no rate per request, but the tokens still count in throughput
    assert not [x for x in f if "tokens_per_s" in x.labels] and find(f, throughput="output_tokens").n == 3
    one = latency(window(make(1, latency_ms=[10.0])), None, None, LatencyThreshold())
    assert find(one, throughput="samples").value is None  # one arrival: no span
    assert find(one, queue="completions_vs_arrivals").status == "insufficient"


def test_queue_trend_breaches_when_completions_fall_behind(make, window):
    n = 1000
    steady = window(make(n, latency_ms=np.full(n, 20.0)))
    [ok] = [x for x in latency(steady, None, None, LatencyThreshold()) if "queue" in x.labels]
    assert ok.status == "ok" and ok.value == pytest.approx(1.0, abs=1e-4)
    # each request waits longer than the last: 15 minutes of backlog at the end of the hour
    backlog = window(make(n, latency_ms=np.linspace(0, 900_000, n)))
    [f] = [x for x in latency(backlog, None, steady, LatencyThreshold()) if "queue" in x.labels]
    assert f.status == "breach" and f.value == pytest.approx(3599 / (3599 + 900), rel=1e-3)
    assert f.baseline == pytest.approx(1.0, abs=1e-4)


def test_latency_per_input_length_bucket(make, window, schema, reference_profile, trailing, sample):
    rng = np.random.default_rng(3)
    frame = sample(3000, rng)
    words = frame["t"].str.len().to_numpy()
    frame["latency_ms"] = np.where(words >= 20, 4.0, 1.0) * frame["latency_ms"]  # long inputs got slower
    w = window(frame, schema, reference_profile)
    f = [x for x in latency(w, reference_profile, window(sample(5000, rng), schema, reference_profile),
                            LatencyThreshold()) if x.labels.get("length") == "len:t"]
    buckets = sorted({x.labels["bucket"] for x in f})
    assert len(buckets) == 4 and sum(1 for x in f if x.labels["quantile"] == "p50") == 4
    longest = [b for b in buckets if b.endswith("+")]
    assert [x.status for x in f if x.labels["bucket"] in longest and x.labels["quantile"] == "p50"] == ["breach"]
    shortest = [b for b in buckets if b.startswith("<")]
    assert [x.status for x in f if x.labels["bucket"] in shortest and x.labels["quantile"] == "p50"] == ["ok"]


# -- cache cold / warm ---------------------------------------------------------------------------------

def test_cache_hit_rate_cold_and_warm_apart(make, window):
    n = 400
    base = window(make(n, cache_hit=[True, False] * (n // 2), cache_state=["cold", "warm"] * 100 + ["warm"] * 200))
    w = window(make(n, cache_hit=[False] * 200 + [True, False] * 100, cache_state=["cold"] * 200 + ["warm"] * 200))
    f = cache_hit_rate(w, None, base, CacheThreshold())
    assert find(f, state="cold").status == "breach" and find(f, state="cold").value == 0.0
    assert find(f, state="warm").value == 0.5
    assert {x.labels.get("state") for x in cache_hit_rate(window(make(4, cache_hit=[True] * 4, cold=[True, False] * 2)),
                                                          None, None, CacheThreshold())} == {None, "cold", "warm"}


# -- thresholds from config ----------------------------------------------------------------------------

def test_thresholds_from_config_reach_evaluate(make, window, tmp_path):
    raw = {"services": [{"name": "s", "sources": {"predictions": {"kind": "files", "path": str(tmp_path)}},
                         "checks": {"stale_cache": {"max_rate": 0.5}, "latency": {"max_ratio": "3"}},
                         "baseline": "same_hour_7d"}]}
    service = parse(raw).services[0]
    params = service.check_params()
    assert params["latency"].max_ratio == 3.0 and service.baseline == "same_hour_7d"
    w = window(make(200, model_version=["v2"] * 200, cache_hit=[True] * 200, cache_version=["v1"] * 20 + ["v2"] * 180))
    assert [f.status for f in evaluate(w, None, None, only={"stale_cache"})] == ["breach"]
    assert [f.status for f in evaluate(w, None, None, params, only={"stale_cache"})] == ["ok"]


@pytest.mark.parametrize("checks, message", [
    ({"latencyy": {}}, "services[0].checks: unknown check 'latencyy'"),
    ({"latency": {"max_ratoi": 2}}, "services[0].checks: latency.max_ratoi: unknown threshold"),
    ({"hotspot": {"quantile": "high"}}, "services[0].checks: hotspot.quantile: Input should be a valid number"),
    ({"oov_rate": 1}, "services[0].checks.oov_rate: Input should be a valid dictionary"),
])
def test_bad_thresholds_are_config_errors_naming_the_path(tmp_path, checks, message):
    raw = {"services": [{"name": "s", "sources": {"predictions": {"kind": "files", "path": str(tmp_path)}},
                         "checks": checks}]}
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        parse(raw)
    with pytest.raises(ValueError):
        thresholds(checks)


def test_unknown_baseline_is_a_config_error(tmp_path):
    raw = {"services": [{"name": "s", "sources": {"predictions": {"kind": "files", "path": str(tmp_path)}},
                         "baseline": "last_week"}]}
    with pytest.raises(ConfigError, match=r"services\[0\]\.baseline"):
        parse(raw)


def test_every_latency_finding_with_a_value_has_an_interval(make, window):
    from scipy import stats

    rng = np.random.default_rng(5)
    base = window(make(3000, **generative(3000, rng)))
    w = window(make(1500, **generative(1500, rng)))
    f = latency(w, None, base, LatencyThreshold())
    lacking = [x.labels for x in f if x.value is not None and x.interval is None]
    assert not lacking
    samples = find(f, throughput="samples")
    span = samples.detail["span_s"]
    k = w.counts["status:ok"]
    assert samples.interval == pytest.approx((stats.chi2.ppf(0.025, 2 * k) / 2 / span,
                                              stats.chi2.ppf(0.975, 2 * k + 2) / 2 / span))
    for x in f:
        if x.value is not None and ("throughput" in x.labels or "queue" in x.labels):
            assert x.interval[0] <= x.value <= x.interval[1], x.labels
    assert find(f, throughput="output_tokens").interval[1] > samples.interval[1] * 20
