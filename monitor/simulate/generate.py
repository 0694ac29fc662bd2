"""Generate one scenario's logs chunk by chunk: arrivals, inputs, cache, service, scores, labels."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from . import text
from .model import ChurnModel, train
from .scenarios import (
    ALL_SCENARIOS,
    MISSING_FIELD,
    TENURE_BUG_BELOW,
    TENURE_BUG_FACTOR,
    TRUNCATE_CHARS,
    UNSEEN_CONTRACT,
    incident,
)
from .service import DEADLINE_MS, MAX_QUEUE, REPLICAS, ReplicaState, serve_chunk
from .write import STAGES, jsonl, otlp_spans, rfc3339_ms

DEFAULT_START = datetime(2026, 11, 2, tzinfo=UTC)

# Traffic and noise parameters (documented in the README of the lead; kept here as constants).
DAILY_AMPLITUDE = 0.35  # rate(t) = rate_per_s * (1 + A sin(2 pi (hour - 9) / 24)): low at 03:00, high at 15:00
WEEKEND_FACTOR = 0.55  # weekly scenarios: Saturday and Sunday (UTC) carry this share of a weekday's traffic
GROUP_SHARE = 0.3  # requests that come in a client's fan-out (a CRM page scoring a list of customers):
GROUP_MEAN = 6.0  # ... groups of 2 + Poisson(GROUP_MEAN - 2) requests on one keep-alive connection, so
GROUP_SPREAD_S = 0.025  # ... one replica, arriving within 25 ms: what fills micro-batches at a low rate
BURSTS_PER_HOUR = 2.0  # a client replays a backlog: a burst on one connection (replica) within 20 ms
BURST_MEDIAN_PER_RPS = 15.0  # burst size median = this * rate_per_s
CLIENT_BUCKET = 8  # the gateway's per-client token bucket: a burst's first 8 requests pass, the rest are
# rejected at admission (after parse). So replays cause rejections without queueing dozens of requests
# on one replica, and the latency tail stays made of many independent slow requests (long notes,
# fan-out groups) rather than of a handful of bursts.
DUP_SHARE = 0.25  # requests that repeat an earlier request's input (retries, page reloads)
DUP_LOOKBACK = 400  # ... one of the last this many requests
REPLAY_SHARE = 0.3  # of repeats: byte-identical replays of the raw body
CACHE_TTL_S = 900.0
FEATURE_MS = 1.0  # preprocess fetches the customer's account features: lognormal, median 1 ms, sigma 0.7,
FEATURE_SIGMA = 0.7  # ... for every request, so the latency tail is made of many independent requests
ERROR_SHARE = 0.001
CHARGES_NOISE = 0.01  # relative sd of a customer's bill between requests (was 0.03: pushed ~1.3% of the
# bills outside the reference's range, 9x what a sample of the same distribution does)
NOTES_MEDIAN = 120.0
LONG_SHARE = 0.03
LONG_NOTES_MEDIAN = 400.0
LONG_NOTES_SHARE = 0.4
TRUNCATION_KEEP = 0.3  # a truncated input's log-odds keep this share of their distance from the base rate
LABEL_SHARE = {1: 0.95, 0: 0.70}  # share of labels that ever arrive, by class
LABEL_MEDIAN_H = {1: 8.0, 0: 40.0}  # median delay, hours (lognormal, sigma 0.7)


@dataclass(frozen=True)
class GroundTruth:
    scenario: str
    seed: int
    start: str
    end: str
    onset: str | None  # when the fault starts (null when the run has none)
    fault_end: str | None  # when it ends (rollback or fix); null when it lasts to the end of the run
    verdict: str
    what_changed: str
    model_versions: dict
    affected: dict
    expected_findings: list
    labels_after_onset: bool
    events: list = field(default_factory=list)  # what happens that should not page: [{kind, at, text, ...}]
    counts: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    segment: str | None = None  # a fault in one segment only (`lang=de`): what its incident must name


def _iso(d: datetime) -> str:
    return d.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"


def _config_hash(max_batch: int, max_wait: float) -> str:
    key = json.dumps({"max_batch": max_batch, "max_wait_ms": max_wait, "deadline_ms": DEADLINE_MS,
                      "max_queue": MAX_QUEUE, "replicas": REPLICAS}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:12]


class _Carry:
    """What crosses a chunk boundary: the replicas' queues and the last requests (for repeats)."""

    def __init__(self) -> None:
        self.replicas = [ReplicaState() for _ in range(REPLICAS)]
        self.tail: dict[str, np.ndarray] | None = None
        self.next_index = 0
        self.deck = np.zeros(0, dtype=np.int64)

    def deal(self, rng: np.random.Generator, n: int, customers: int) -> np.ndarray:
        """Customers in rounds: each held-out customer once per shuffled round (every customer is
        scored about equally often), so a window's customer mix is nearly exact."""
        while len(self.deck) < n:
            self.deck = np.concatenate([self.deck, rng.permutation(customers)])
        out, self.deck = self.deck[:n], self.deck[n:]
        return out


def reference_frame(seed: int) -> pd.DataFrame:
    """The validation split with synthesized notes, label, and the model's prediction and score."""
    tr = train()
    m = tr.model
    va = tr.valid
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 99])))
    lens = text.lengths(rng, len(va), LONG_SHARE, NOTES_MEDIAN)
    notes = text.texts(rng, lens)
    # the offline evaluation scores: the tabular model on the validation inputs (notes were not part of
    # that evaluation), i.e. exactly the scores the threshold was chosen on
    score = m.score(va["tenure"].to_numpy(float), va["MonthlyCharges"].to_numpy(float),
                    m.codes("Contract", va["Contract"].tolist()),
                    m.codes("InternetService", va["InternetService"].tolist()))
    return pd.DataFrame({
        "tenure": va["tenure"].to_numpy(np.int64), "MonthlyCharges": va["MonthlyCharges"].to_numpy(float),
        "Contract": va["Contract"].to_numpy(object), "InternetService": va["InternetService"].to_numpy(object),
        "notes": np.asarray(notes, dtype=object), "label": va["Churn"].to_numpy(object),
        "prediction": np.where(score >= m.threshold, "Yes", "No").astype(object),
        "score_Yes": np.round(score, 4),
    })


def _score(m: ChurnModel, tenure, charges, contract, internet, lens) -> np.ndarray:
    z = m.logit(tenure, charges, contract, internet)
    base = math.log(m.base_rate / (1 - m.base_rate))
    z = np.where(lens > TRUNCATE_CHARS, base + TRUNCATION_KEEP * (z - base), z)
    return 1.0 / (1.0 + np.exp(-z))


def on_curve(g: np.random.Generator, hour0: float, t: np.ndarray, weekday0: int | None = None) -> np.ndarray:
    """Thinning: keep an event at second `t` with probability rate(t) / rate_max on the daily curve, times
    WEEKEND_FACTOR on Saturdays and Sundays when `weekday0` (the start's weekday, Monday 0) is given."""
    hr = hour0 + t / 3600.0
    keep = 1 + DAILY_AMPLITUDE * np.sin(2 * np.pi * (hr - 9) / 24)
    if weekday0 is not None:
        keep = keep * np.where((weekday0 + np.floor(hr / 24)) % 7 >= 5, WEEKEND_FACTOR, 1.0)
    return g.random(len(t)) * (1 + DAILY_AMPLITUDE) < keep


def generate(scenario: str, out_dir: Path, *, seed: int = 7, start: datetime = DEFAULT_START,
             hours: float = 12, rate_per_s: float = 3.0, onset_hours: float | None = None,
             fault_end_hours: float | None = None, chunk_rows: int = 200_000, otlp: bool = True) -> GroundTruth:
    """Write scenario `scenario`'s logs into `out_dir` (replacing what its subfolders held) and return
    the ground truth, also written as ground_truth.json. The fault is on from `onset_hours` (default: half
    way) until `fault_end_hours` (a rollback or fix: the `before` regime returns; default: to the end)."""
    if scenario not in ALL_SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; one of {ALL_SCENARIOS}")
    if start.tzinfo is None:
        raise ValueError("start must be timezone-aware (UTC)")
    out_dir = Path(out_dir)
    inc = incident(scenario)
    deploy = next((e for e in inc.events if e.kind == "deploy"), None)
    if deploy is not None and (onset_hours is not None or fault_end_hours is not None):
        raise ValueError(f"{scenario}: its regime switch is the deploy at {deploy.at_hours:g} h; "
                         "onset_hours and fault_end_hours do not apply")
    # A run with events switches regime at its (equivalent) deploy: no fault, so no onset in the truth.
    onset_h = deploy.at_hours if deploy is not None else hours / 2 if onset_hours is None else onset_hours
    if fault_end_hours is not None and not onset_h < fault_end_hours <= hours:
        raise ValueError(f"fault_end_hours must be after the onset ({onset_h:g} h) and within the run "
                         f"({hours:g} h), got {fault_end_hours:g}")
    dur_s = hours * 3600.0
    onset_s = onset_h * 3600.0
    end_s = math.inf if fault_end_hours is None else fault_end_hours * 3600.0
    events = [e for e in inc.events if e.at_hours < hours]
    restarts = [e.at_hours * 3600.0 for e in events if e.kind == "cache_restart"]
    spikes = [(e.at_hours * 3600.0, (e.at_hours + e.hours) * 3600.0, e.factor) for e in events
              if e.kind == "traffic_spike"]
    weekday0 = start.weekday() if inc.weekly else None
    start_us = int(round(start.timestamp() * 1e6))
    for sub in ("predictions", "timings", "spans", "labels"):
        shutil.rmtree(out_dir / sub, ignore_errors=True)
        if sub != "spans" or otlp:
            (out_dir / sub).mkdir(parents=True)

    ss = np.random.SeedSequence(seed)
    g_arr, g_in, g_svc, g_lab = (np.random.Generator(np.random.PCG64(s)) for s in ss.spawn(4))

    tr = train()
    m = tr.model
    test = tr.test
    cust_tenure = test["tenure"].to_numpy(np.int64)
    known = pd.concat([tr.train, tr.valid, test])
    data_tenure_max = int(known["tenure"].max())
    data_charges = (float(known["MonthlyCharges"].min()), float(known["MonthlyCharges"].max()))
    cust_charges = test["MonthlyCharges"].to_numpy(float)
    cust_contract = m.codes("Contract", test["Contract"].tolist())
    cust_internet = m.codes("InternetService", test["InternetService"].tolist())
    cust_label = (test["Churn"] == "Yes").to_numpy()
    contract_names = np.asarray(m.categories["Contract"] + (UNSEEN_CONTRACT,), dtype=object)
    # the service imputes a missing InternetService from MonthlyCharges (nearest training median)
    med = tr.train.groupby("InternetService")["MonthlyCharges"].median()
    med = np.asarray([med[c] for c in m.categories["InternetService"]])
    order_m = np.argsort(med)
    cuts = (med[order_m][1:] + med[order_m][:-1]) / 2

    def impute_internet(ch: np.ndarray) -> np.ndarray:
        return order_m[np.searchsorted(cuts, ch)]

    internet_names = np.asarray(m.categories["InternetService"] + (None,), dtype=object)

    rate_max = rate_per_s * (1 + DAILY_AMPLITUDE)
    burst_median = max(BURST_MEDIAN_PER_RPS * rate_per_s, 2.0)
    slice_s = max(chunk_rows / (rate_max * 1.05 + BURSTS_PER_HOUR / 3600 * burst_median * 1.2), 1.0)
    hour0 = (start - start.replace(hour=0, minute=0, second=0, microsecond=0)).total_seconds() / 3600

    cfg_before = (inc.before.max_batch, inc.before.max_wait_ms)
    cfg_after = (inc.after.max_batch, inc.after.max_wait_ms)
    carry = _Carry()
    counts = {"predictions": 0, "timings": 0, "spans": 0, "labels": 0, "parts": 0}
    status_counts = {"ok": 0, "timeout": 0, "rejected": 0, "error": 0}

    part = 0
    t0 = 0.0
    while t0 < dur_s:
        t1 = min(t0 + slice_s, dur_s)
        # --- arrivals: thinned Poisson on the daily curve (single requests and fan-out groups), plus
        # bursts pinned to one replica
        nc = int(g_arr.poisson(rate_max * (1 - GROUP_SHARE) * (t1 - t0)))
        tc = np.sort(g_arr.uniform(t0, t1, nc))
        ta = tc[on_curve(g_arr, hour0, tc, weekday0)]
        rep = g_arr.integers(0, REPLICAS, len(ta))
        ng = int(g_arr.poisson(rate_max * GROUP_SHARE / GROUP_MEAN * (t1 - t0)))
        g_start = g_arr.uniform(t0, t1, ng)
        g_size = 2 + g_arr.poisson(GROUP_MEAN - 2, ng)
        g_rep = g_arr.integers(0, REPLICAS, ng)
        g_keep = on_curve(g_arr, hour0, g_start, weekday0)
        g_start, g_size, g_rep = g_start[g_keep], g_size[g_keep], g_rep[g_keep]
        tg = np.minimum(np.repeat(g_start, g_size) + g_arr.uniform(0, GROUP_SPREAD_S, int(g_size.sum())),
                        np.nextafter(t1, t0))
        ta = np.concatenate([ta, tg])
        rep = np.concatenate([rep, np.repeat(g_rep, g_size)])
        nb = int(g_arr.poisson(BURSTS_PER_HOUR * (1 + DAILY_AMPLITUDE) * (t1 - t0) / 3600))
        b_start = g_arr.uniform(t0, t1, nb)
        b_keep = on_curve(g_arr, hour0, b_start, weekday0)
        b_size = np.maximum(np.rint(burst_median * np.exp(0.5 * g_arr.standard_normal(nb))), 1).astype(np.int64)
        b_rep = g_arr.integers(0, REPLICAS, nb)
        b_start, b_size, b_rep = b_start[b_keep], b_size[b_keep], b_rep[b_keep]
        tb = np.repeat(b_start, b_size) + g_arr.uniform(0, 0.02, int(b_size.sum()))
        tb = np.minimum(tb, np.nextafter(t1, t0))
        b_id = np.repeat(np.arange(len(b_size)), b_size)
        b_ord = np.lexsort((tb, b_id))  # by burst, then by arrival
        b_rank = np.empty(len(tb), dtype=np.int64)
        b_rank[b_ord] = np.arange(len(tb)) - np.repeat(np.cumsum(b_size) - b_size, b_size)
        for s0, s1, factor in spikes:
            lo, hi = max(s0, t0), min(s1, t1)
            if lo < hi:  # extra single requests on the same daily curve while the spike lasts
                ts = g_arr.uniform(lo, hi, int(g_arr.poisson(rate_max * (factor - 1) * (hi - lo))))
                ts = np.sort(ts[on_curve(g_arr, hour0, ts, weekday0)])
                ta = np.concatenate([ta, ts])
                rep = np.concatenate([rep, g_arr.integers(0, REPLICAS, len(ts))])
        t = np.concatenate([ta, tb])
        rep = np.concatenate([rep, np.repeat(b_rep, b_size)])
        throttled = np.concatenate([np.zeros(len(ta), dtype=bool), b_rank >= CLIENT_BUCKET])
        order = np.argsort(t, kind="stable")
        t, rep, throttled = t[order], rep[order], throttled[order]
        t0 = t1
        n = len(t)
        if n == 0:
            continue
        after = (t >= onset_s) & (t < end_s)
        gidx = carry.next_index + np.arange(n, dtype=np.int64)
        carry.next_index += n

        # --- inputs: a held-out customer with noise, or a repeat of a recent request
        cust = carry.deal(g_in, n, len(test))
        # Noise as a customer's record really moves: a few more months of tenure, a bill a little up or
        # down (add-ons, taxes); never beyond what the data ever held (Telco tenure stops at 72 months,
        # the cheapest and dearest plans bound the bill): a healthy input stays inside the training range.
        tenure = np.minimum(cust_tenure[cust] + np.where(g_in.random(n) < 0.15, g_in.integers(0, 3, n), 0),
                            data_tenure_max)
        raw_charges = cust_charges[cust]
        charges = np.round(raw_charges * (1 + CHARGES_NOISE * g_in.standard_normal(n)), 2)
        charges = np.where((charges < data_charges[0]) | (charges > data_charges[1]), raw_charges, charges)
        contract = cust_contract[cust].copy()
        internet = cust_internet[cust].copy()
        u_unseen, u_over, over_f = g_in.random(n), g_in.random(n), 1.15 + 0.4 * g_in.random(n)
        u_missing = g_in.random(n)
        long_share = np.where(after & inc.after.long_notes, LONG_NOTES_SHARE, LONG_SHARE)
        median = np.where(after & inc.after.long_notes, LONG_NOTES_MEDIAN, NOTES_MEDIAN)
        lens = text.lengths(g_in, n, long_share, median)
        notes = np.asarray(text.texts(g_in, lens), dtype=object)
        if inc.after.unseen_contract_share:
            contract = np.where(after & (u_unseen < inc.after.unseen_contract_share), len(contract_names) - 1,
                                contract)
            over = after & (u_over < inc.after.charges_over_range_share)
            charges = np.where(over, np.round(m.train_max["MonthlyCharges"] * over_f, 2), charges)
        if inc.after.missing_share:
            internet = np.where(after & (u_missing < inc.after.missing_share), len(internet_names) - 1, internet)
        is_dup = g_in.random(n) < DUP_SHARE
        back = g_in.integers(1, DUP_LOOKBACK + 1, n)
        replay = g_in.random(n) < REPLAY_SHARE
        root_t = t.copy()
        cols = {"cust": cust, "tenure": tenure, "charges": charges, "contract": contract,
                "internet": internet, "lens": lens, "notes": notes, "root_t": root_t}
        cols = _apply_repeats(cols, is_dup, back, carry)
        cust, tenure, charges = cols["cust"], cols["tenure"], cols["charges"]
        contract, internet, lens, notes, root_t = (cols[k] for k in ("contract", "internet", "lens", "notes",
                                                                   "root_t"))
        gap = t - root_t
        regime_of_root = (root_t >= onset_s) & (root_t < end_s)
        same_version = (regime_of_root == after) | (inc.before.model_version == inc.after.model_version)
        fresh = is_dup & (gap >= 0.05) & (gap <= CACHE_TTL_S)
        for at in restarts:  # entries cached before a restart are gone after it
            fresh &= ~((root_t < at) & (t >= at))
        if inc.after.cache_key_has_version:
            hit = fresh & same_version
            cache_from_after = after
        else:
            hit = np.where(after, fresh & replay, fresh & same_version)
            cache_from_after = np.where(after & hit, regime_of_root, after)

        # --- service: stage costs, then the replicas' batchers
        ms_t = t * 1000.0
        parse = (0.15 + 0.0004 * lens) * np.exp(0.25 * g_svc.standard_normal(n))
        prep = (0.4 + 0.003 * lens) * np.exp(0.25 * g_svc.standard_normal(n))
        prep += FEATURE_MS * np.exp(FEATURE_SIGMA * g_svc.standard_normal(n))
        post = 0.2 * np.exp(0.25 * g_svc.standard_normal(n))
        lookup = 0.05 * np.exp(0.25 * g_svc.standard_normal(n))
        exec_noise = np.exp(0.1 * g_svc.standard_normal(n))
        error = g_svc.random(n) < ERROR_SHARE
        ready = ms_t + parse + prep
        tokens = np.minimum(lens, TRUNCATE_CHARS).astype(float)
        throttled &= ~error
        bwait, model_ms, bsize, depth, rejected = serve_chunk(
            ready, rep, hit & ~error, ~error & ~throttled, tokens, exec_noise, onset_s * 1000.0, end_s * 1000.0, cfg_before,
            cfg_after, carry.replicas)
        rejected |= throttled
        hit = hit & ~error & ~rejected
        model_ms = np.where(hit, lookup, model_ms)

        dur = np.stack([parse, prep, bwait, model_ms, post], axis=1)
        dur[rejected, 1:] = 0.0
        dur[error, 2:] = 0.0
        present = np.ones((n, 5), dtype=bool)
        present[rejected, 1:] = False
        present[error, 2:] = False
        rel_start = np.concatenate([np.zeros((n, 1)), np.cumsum(dur, axis=1)[:, :-1]], axis=1)
        total = dur.sum(axis=1)
        timeout = ~rejected & ~error & (total > DEADLINE_MS)
        cut = timeout[:, None] & (rel_start >= DEADLINE_MS)
        present &= ~cut
        dur = np.where(timeout[:, None], np.clip(DEADLINE_MS - rel_start, 0.0, dur), dur)
        latency = np.where(timeout, DEADLINE_MS, total)
        status = np.full(n, "ok", dtype=object)
        status[timeout] = "timeout"
        status[rejected] = "rejected"
        status[error] = "error"
        ok = status == "ok"

        # --- scores
        version_after = after if inc.after.cache_key_has_version else np.where(hit, cache_from_after, after)
        tenure_in = tenure.astype(float)
        if inc.after.tenure_bug:
            tenure_in = np.where(after & (tenure < TENURE_BUG_BELOW), TENURE_BUG_FACTOR * tenure_in, tenure_in)
        contract_code = np.where(contract >= len(m.categories["Contract"]), -1, contract)
        internet_code = np.where(internet >= len(m.categories["InternetService"]),
                                 impute_internet(charges), internet)
        score = _score(m, tenure_in, charges, contract_code, internet_code, lens)
        thr = np.where(after, m.threshold + inc.after.threshold_shift, m.threshold + inc.before.threshold_shift)
        pred = np.where(score >= thr, "Yes", "No").astype(object)

        mv = np.where(after, inc.after.model_version, inc.before.model_version).astype(object)
        cv = np.where(version_after, inc.after.model_version, inc.before.model_version).astype(object)
        pv = np.where(after, inc.after.preprocess_version, inc.before.preprocess_version).astype(object)
        ch = np.where(after, _config_hash(*cfg_after), _config_hash(*cfg_before)).astype(object)
        rid = np.asarray([f"req-{seed}-{i:010d}" for i in gidx.tolist()], dtype=object)
        arrival_us = start_us + np.rint(t * 1e6).astype(np.int64)

        preds = pd.DataFrame({
            "request_id": rid,
            "ts": rfc3339_ms(arrival_us).astype(object),
            "model_version": mv,
            "status": status,
            "tenure": tenure.astype(np.int64),
            "MonthlyCharges": np.round(charges, 2),
            "Contract": contract_names[contract],
            "InternetService": internet_names[internet],
            "notes": notes,
            "prediction": np.where(ok, pred, None),
            "score_Yes": np.where(ok, np.round(score, 4), np.nan),
            "threshold": np.round(thr, 4),
            "latency_ms": np.round(latency, 3),
            "cache_hit": hit,
            "cache_version": cv,
            "preprocess_version": pv,
            "config_hash": ch,
            "replica": np.asarray([f"r{i}" for i in range(REPLICAS)], dtype=object)[rep],
            "batch_size": bsize,
            "queue_depth": depth,
        })
        name = f"part-{part:05d}"
        counts["predictions"] += jsonl(out_dir / "predictions" / f"{name}.jsonl", preds)
        for s, c in zip(*np.unique(status.astype(str), return_counts=True), strict=True):
            status_counts[str(s)] += int(c)
        del preds

        # --- timings, rows and spans
        ri, si = np.nonzero(present)
        start_abs_us = arrival_us[ri] + np.rint(rel_start[ri, si] * 1000).astype(np.int64)
        dur_r = np.round(dur[ri, si], 3)
        timings = pd.DataFrame({
            "request_id": rid[ri],
            "stage": np.asarray(STAGES, dtype=object)[si],
            "duration_ms": dur_r,
            "start_ts": rfc3339_ms(start_abs_us).astype(object),
        })
        counts["timings"] += jsonl(out_dir / "timings" / f"{name}.jsonl", timings)
        del timings
        if otlp:
            counts["spans"] += otlp_spans(out_dir / "spans" / f"{name}.json", rid[ri], gidx[ri], si,
                                          start_abs_us, np.rint(dur_r * 1000).astype(np.int64), seed)

        # --- delayed labels, by class
        y = cust_label[cust]
        arrives = g_lab.random(n) < np.where(y, LABEL_SHARE[1], LABEL_SHARE[0])
        delay_h = np.where(y, LABEL_MEDIAN_H[1], LABEL_MEDIAN_H[0]) * np.exp(0.7 * g_lab.standard_normal(n))
        write = ok & arrives & (inc.labels_after_onset | ~after)
        label_us = arrival_us + np.rint(delay_h * 3600e6).astype(np.int64)
        li = np.flatnonzero(write)
        li = li[np.argsort(label_us[li], kind="stable")]
        labels = pd.DataFrame({
            "request_id": rid[li],
            "label": np.where(y[li], "Yes", "No").astype(object),
            "label_ts": rfc3339_ms(label_us[li]).astype(object),
        })
        counts["labels"] += jsonl(out_dir / "labels" / f"{name}.jsonl", labels)
        part += 1

    counts["parts"] = part
    counts["status"] = status_counts
    ref = reference_frame(seed)
    ref.to_parquet(out_dir / "reference.parquet", index=False)
    counts["reference"] = len(ref)

    end = start + timedelta(seconds=dur_s)
    onset = start + timedelta(seconds=onset_s)
    fault_end = None if fault_end_hours is None else _iso(start + timedelta(hours=fault_end_hours))
    gt = GroundTruth(
        scenario=scenario, seed=seed, start=_iso(start), end=_iso(end),
        onset=None if deploy is not None else _iso(onset), fault_end=fault_end,
        verdict=inc.verdict, what_changed=inc.what_changed,
        model_versions={"before": inc.before.model_version, "after": inc.after.model_version},
        affected=inc.affected, expected_findings=list(inc.expected_findings),
        labels_after_onset=inc.labels_after_onset, counts=counts,
        events=[{"kind": e.kind, "at": _iso(start + timedelta(hours=e.at_hours)), "text": e.text}
                | ({"until": _iso(start + timedelta(hours=e.at_hours + e.hours)), "factor": e.factor}
                   if e.kind == "traffic_spike" else {}) for e in events],
        params={"hours": hours, "rate_per_s": rate_per_s, "onset_hours": onset_h,
                "fault_end_hours": fault_end_hours, "weekly": inc.weekly, "chunk_rows": chunk_rows,
                "otlp": otlp, "threshold_before": round(m.threshold + inc.before.threshold_shift, 4),
                "threshold_after": round(m.threshold + inc.after.threshold_shift, 4),
                "config_before": {"max_batch": cfg_before[0], "max_wait_ms": cfg_before[1],
                                  "config_hash": _config_hash(*cfg_before)},
                "config_after": {"max_batch": cfg_after[0], "max_wait_ms": cfg_after[1],
                                 "config_hash": _config_hash(*cfg_after)},
                "deadline_ms": DEADLINE_MS, "max_queue": MAX_QUEUE, "replicas": REPLICAS,
                "truncate_chars": TRUNCATE_CHARS, "missing_field": MISSING_FIELD},
    )
    with open(out_dir / "ground_truth.json", "w", encoding="utf-8", newline="\n") as fh:
        json.dump(asdict(gt), fh, indent=2)
        fh.write("\n")
    return gt


def _apply_repeats(cols: dict[str, np.ndarray], is_dup: np.ndarray, back: np.ndarray, carry: _Carry
                   ) -> dict[str, np.ndarray]:
    """Copy each repeat's input from the request `back` places earlier (possibly in an earlier chunk);
    chains of repeats resolve to their first request, whose arrival time is `root_t`."""
    n = len(is_dup)
    tail = carry.tail
    nt = 0 if tail is None else len(tail["cust"])
    ext = {k: (np.concatenate([tail[k], v]) if nt else v) for k, v in cols.items()}
    pos = nt + np.arange(n)
    src = np.where(is_dup & (pos - back >= 0), pos - back, pos)
    src_full = np.concatenate([np.arange(nt), src])
    # pointer jumping: follow repeat chains to the request that was not a repeat
    for _ in range(64):
        nxt = src_full[src_full]
        if np.array_equal(nxt, src_full):
            break
        src_full = nxt
    src = src_full[nt:]
    out = {k: v[src] for k, v in ext.items()}
    keep = min(DUP_LOOKBACK, nt + n)
    carry.tail = {k: np.concatenate([ext[k][:nt], out[k]])[-keep:] for k in cols}
    return out
