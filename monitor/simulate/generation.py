"""A text-generation service: requests in several languages (the `lang` segment), input and output tokens,
time to first token, decode time, a prefix-cache hit flag, the speculative-decoding accept rate, stage
timings, daily traffic, and thumbs up / down feedback that arrives minutes to hours later.

`generate_generation(scenario, out_dir)` writes the same layout as the churn simulator (generate.py):
predictions/, timings/ and labels/ part files, reference.parquet and ground_truth.json.
"""

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

from .generate import DAILY_AMPLITUDE, DEFAULT_START, GroundTruth, on_curve
from .write import jsonl, rfc3339_ms

GENERATION_SCENARIOS: tuple[str, ...] = ("generation-slower-de", "generation-healthy-2d", "generation-worse-ja")
SERVICE = "chat"  # the service name its config uses
MODEL_VERSION = "llm-8b-v1"
STAGES = ("queue", "prefill", "decode", "postprocess")
UP, DOWN = "up", "down"  # the feedback labels

# (lang, share of traffic, mean spec_accept, share of feedback that is thumbs up, tokens per word):
# shares as a multilingual assistant's; CJK text takes more tokens per word and drafts worse.
LANGS = (
    ("en", 0.50, 0.74, 0.84, 1.0),
    ("es", 0.12, 0.72, 0.82, 1.3),
    ("de", 0.10, 0.71, 0.80, 1.4),
    ("fr", 0.09, 0.72, 0.81, 1.3),
    ("ja", 0.08, 0.66, 0.77, 2.0),
    ("pt", 0.06, 0.70, 0.81, 1.3),
    ("zh", 0.05, 0.65, 0.76, 1.9),
)
LANG_NAMES = tuple(x[0] for x in LANGS)
ACCEPT_CONCENTRATION = 40.0  # a request's accept rate ~ Beta(mean * c, (1 - mean) * c): sd about 0.07
DRAFT_TOKENS = 3  # speculated tokens per step: a step yields (1 - a^(k+1)) / (1 - a) tokens at accept rate a
STEP_MS = 22.0  # one target-model decode step, median (lognormal, sigma 0.1) ...
LOAD_SLOWDOWN = 0.25  # ... times 1 + this x load (0 at the daily low, 1 at the peak): batches are larger
INPUT_MEDIAN, INPUT_SIGMA = 350.0, 0.9  # prompt words (system prompt, history, question)
OUTPUT_MEDIAN, OUTPUT_SIGMA = 180.0, 0.8  # output tokens; at most MAX_OUTPUT (`length` stop)
MAX_OUTPUT = 2048
PREFILL_MS, PREFILL_PER_TOKEN = 6.0, 0.04  # prefill: fixed cost + per uncached prompt token
PREFIX_HIT = 0.45  # requests whose prompt prefix (system prompt, earlier turns) is in the KV cache ...
HIT_UNCACHED = (0.05, 0.35)  # ... leaving this share of the prompt to prefill (uniform)
QUEUE_MS, QUEUE_SIGMA = 5.0, 0.8  # waiting for a batch slot, median at the daily low; x (1 + 2 load^2)
DEADLINE_MS = 30_000.0
REJECT_SHARE = 0.003  # rate-limited at the gateway: no tokens, a queue stage only
ERROR_SHARE = 0.001  # failed after prefill (an out-of-memory retry that gave up)
FEEDBACK_SHARE = 0.12  # completed requests whose user clicks thumbs up or down ...
FEEDBACK_MEDIAN_S, FEEDBACK_SIGMA = 900.0, 1.0  # ... this long after the answer (lognormal)
REFERENCE_ROWS = 6000
SLOW_LANG, SLOW_ACCEPT, TTFT_FACTOR = "de", 0.22, 1.4
WORSE_LANG, WORSE_UP = "ja", 0.45


@dataclass(frozen=True)
class GenRegime:
    """What serves requests in one part of a run: the draft model, the prompt template, and what they do
    to one language."""

    draft: str = "draft-1b-a"
    template: str = "t1"
    accept: dict = field(default_factory=dict)  # lang -> mean spec_accept, where it differs from LANGS
    ttft_factor: dict = field(default_factory=dict)  # lang -> multiplier of time to first token
    thumbs_up: dict = field(default_factory=dict)  # lang -> share of thumbs up, where it differs

    @property
    def config_hash(self) -> str:
        key = json.dumps({"draft": self.draft, "template": self.template, "deadline_ms": DEADLINE_MS}, sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class GenIncident:
    before: GenRegime
    after: GenRegime
    verdict: str
    what_changed: str
    affected: dict
    expected_findings: tuple[str, ...] = ()


def gen_incident(name: str) -> GenIncident:
    """The before/after regimes and ground truth of generation scenario `name`."""
    base = GenRegime()
    if name == "generation-slower-de":
        after = GenRegime(draft="draft-1b-b", accept={SLOW_LANG: SLOW_ACCEPT}, ttft_factor={SLOW_LANG: TTFT_FACTOR})
        return GenIncident(
            base, after, "slower",
            f"the draft model for speculative decoding is replaced (draft-1b-a -> draft-1b-b, config_hash "
            f"changes): its tokenizer merges fewer German compounds, so spec_accept for lang={SLOW_LANG} collapses "
            f"0.71 -> {SLOW_ACCEPT} and its decode is about 2x slower (fewer accepted tokens per step); its prefill "
            f"chunks wait behind those longer decodes, time to first token +{TTFT_FACTOR - 1:.0%}. Every other "
            "language is unchanged, and so are the answers (speculative decoding is lossless)",
            {"segment": {"lang": SLOW_LANG}, "stage": "decode",
             "signal": {"spec_accept": [0.71, SLOW_ACCEPT]}, "ttft_factor": TTFT_FACTOR, "decode_factor": 2.0},
            ("latency", "signal"))
    if name == "generation-healthy-2d":
        return GenIncident(base, base, "healthy",
                           "nothing: two days of daily traffic (the peak at 15:00 UTC carries about twice the "
                           "03:00 low; decode steps and queueing slow a little with load)", {}, ())
    if name == "generation-worse-ja":
        after = GenRegime(template="t2", thumbs_up={WORSE_LANG: WORSE_UP})
        return GenIncident(
            base, after, "worse",
            f"a new prompt template (t1 -> t2, config_hash changes) drops the instruction to answer in the "
            f"user's language: Japanese users get English answers and their thumbs-up share falls 0.77 -> "
            f"{WORSE_UP}; latency unchanged",
            {"segment": {"lang": WORSE_LANG}, "feedback": {"thumbs_up": [0.77, WORSE_UP]}}, ("acceptance",))
    raise ValueError(f"unknown generation scenario {name!r}; one of {GENERATION_SCENARIOS}")


def _iso(d: datetime) -> str:
    return d.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"


def _per_lang(lang: np.ndarray, column: int, override: dict) -> np.ndarray:
    values = np.array([override.get(x[0], x[column]) for x in LANGS])
    return values[lang]


def _requests(g: np.random.Generator, lang: np.ndarray, load: np.ndarray, regime_of: list[GenRegime],
              after: np.ndarray) -> dict[str, np.ndarray]:
    """Tokens, cache, accept rate and stage durations (ms) of requests in languages `lang` (indexes into
    LANGS) at `load` (0..1), each served by regime_of[after]."""
    n = len(lang)
    before, later = regime_of
    accept_mean = np.where(after, _per_lang(lang, 2, later.accept), _per_lang(lang, 2, before.accept))
    c = ACCEPT_CONCENTRATION
    accept = g.beta(accept_mean * c, (1 - accept_mean) * c)
    words = np.exp(np.log(INPUT_MEDIAN) + INPUT_SIGMA * g.standard_normal(n))
    input_tokens = np.clip(np.rint(words * _per_lang(lang, 4, {})), 8, 16_000).astype(np.int64)
    output_tokens = np.clip(np.rint(np.exp(np.log(OUTPUT_MEDIAN) + OUTPUT_SIGMA * g.standard_normal(n))),
                            1, MAX_OUTPUT).astype(np.int64)
    hit = g.random(n) < PREFIX_HIT
    uncached = np.where(hit, g.uniform(*HIT_UNCACHED, n), 1.0) * input_tokens
    step = STEP_MS * (1 + LOAD_SLOWDOWN * load) * np.exp(0.1 * g.standard_normal(n))
    queue = QUEUE_MS * (1 + 2 * load ** 2) * np.exp(QUEUE_SIGMA * g.standard_normal(n))
    prefill = (PREFILL_MS + PREFILL_PER_TOKEN * uncached) * np.exp(0.15 * g.standard_normal(n)) + step
    factor = np.where(after, _factor(lang, later.ttft_factor), _factor(lang, before.ttft_factor))
    # A slower first token is a longer wait: prefill chunks share steps with the replica's decodes.
    queue = queue + (factor - 1) * (queue + prefill)
    per_step = (1 - accept ** (DRAFT_TOKENS + 1)) / (1 - accept)
    decode = (output_tokens - 1) / per_step * step
    post = (1.5 + 0.004 * output_tokens) * np.exp(0.2 * g.standard_normal(n))
    return {"accept": accept, "input_tokens": input_tokens, "output_tokens": output_tokens, "hit": hit,
            "queue": queue, "prefill": prefill, "decode": decode, "post": post}


def _factor(lang: np.ndarray, override: dict) -> np.ndarray:
    """Each request's multiplier: its language's in `override`, else 1."""
    return np.array([override.get(name, 1.0) for name in LANG_NAMES])[lang]


def _load(hour0: float, t: np.ndarray) -> np.ndarray:
    """0 at the daily low (03:00 UTC), 1 at the peak (15:00): the curve arrivals follow (generate.on_curve)."""
    hr = hour0 + t / 3600.0
    return (1 + np.sin(2 * np.pi * (hr - 9) / 24)) / 2


def _langs(g: np.random.Generator, n: int) -> np.ndarray:
    return g.choice(len(LANGS), n, p=np.array([x[1] for x in LANGS]))


def generation_reference(seed: int) -> pd.DataFrame:
    """Feedback and inputs of the healthy service (an earlier week's logs): `lang`, `input_tokens`,
    `output_tokens` and `label` (thumbs up / down), REFERENCE_ROWS rows."""
    g = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 98])))
    lang = _langs(g, REFERENCE_ROWS)
    base = GenRegime()
    r = _requests(g, lang, g.random(REFERENCE_ROWS), [base, base], np.zeros(REFERENCE_ROWS, bool))
    up = g.random(REFERENCE_ROWS) < _per_lang(lang, 3, {})
    return pd.DataFrame({"lang": np.asarray(LANG_NAMES, dtype=object)[lang], "input_tokens": r["input_tokens"],
                         "output_tokens": r["output_tokens"], "label": np.where(up, UP, DOWN).astype(object)})


def generate_generation(scenario: str, out_dir: Path, *, seed: int = 7, start: datetime = DEFAULT_START,
                        hours: float | None = None, rate_per_s: float = 2.0, onset_hours: float | None = None,
                        fault_end_hours: float | None = None) -> GroundTruth:
    """Write one generation scenario's logs under `out_dir` (one part file per hour) and return its ground
    truth: `hours` long (default 48 for the healthy run, else 6), `rate_per_s` requests a second on
    average over the day, the fault from `onset_hours` (default half way) to `fault_end_hours` (None: the end)."""
    inc = gen_incident(scenario)
    hours = (48.0 if inc.verdict == "healthy" else 6.0) if hours is None else hours
    faulty = inc.verdict != "healthy"
    onset_h = (hours / 2 if onset_hours is None else onset_hours) if faulty else math.inf
    if faulty and fault_end_hours is not None and not onset_h < fault_end_hours <= hours:
        raise ValueError(f"fault_end_hours must be after the onset ({onset_h:g} h) and within the run "
                         f"({hours:g} h), got {fault_end_hours:g}")
    end_h = math.inf if fault_end_hours is None else fault_end_hours
    for sub in ("predictions", "timings", "labels"):
        shutil.rmtree(out_dir / sub, ignore_errors=True)
        (out_dir / sub).mkdir(parents=True)
    g_arr, g_req, g_lab = (np.random.Generator(np.random.PCG64(s)) for s in np.random.SeedSequence(seed).spawn(3))
    hour0 = start.hour + start.minute / 60 + start.second / 3600
    start_us = int(round(start.timestamp() * 1e6))
    rate_max = rate_per_s * (1 + DAILY_AMPLITUDE)
    counts = {"predictions": 0, "timings": 0, "labels": 0}
    status_counts: dict[str, int] = {}
    up_counts: dict[str, list[int]] = {}
    part, index = 0, 0
    for h0 in range(int(math.ceil(hours))):
        t0, t1 = h0 * 3600.0, min(hours, h0 + 1) * 3600.0
        t = np.sort(g_arr.uniform(t0, t1, int(g_arr.poisson(rate_max * (t1 - t0)))))
        t = t[on_curve(g_arr, hour0, t)]
        n = len(t)
        if not n:
            continue
        after = (t >= onset_h * 3600.0) & (t < end_h * 3600.0)
        lang = _langs(g_req, n)
        r = _requests(g_req, lang, _load(hour0, t), [inc.before, inc.after], after)
        rejected = g_req.random(n) < REJECT_SHARE
        error = ~rejected & (g_req.random(n) < ERROR_SHARE)
        dur = np.stack([r["queue"], r["prefill"], r["decode"], r["post"]], axis=1)
        present = np.ones(dur.shape, bool)
        dur[rejected, 0] = np.exp(0.3 * g_req.standard_normal(int(rejected.sum())))  # the gateway's answer
        present[rejected, 1:] = False
        present[error, 2:] = False
        dur = np.where(present, dur, 0.0)
        rel = np.concatenate([np.zeros((n, 1)), np.cumsum(dur, axis=1)[:, :-1]], axis=1)
        total = dur.sum(axis=1)
        timeout = ~rejected & ~error & (total > DEADLINE_MS)
        present &= ~(timeout[:, None] & (rel >= DEADLINE_MS))
        dur = np.where(timeout[:, None], np.clip(DEADLINE_MS - rel, 0.0, dur), dur)
        latency = np.minimum(total, DEADLINE_MS)
        status = np.full(n, "ok", dtype=object)
        status[timeout], status[rejected], status[error] = "timeout", "rejected", "error"
        served = ~rejected & ~error
        ttft = r["queue"] + r["prefill"]
        # A timed-out answer streamed until the deadline: the tokens decoded by then.
        decoded = np.where(timeout, np.clip(dur[:, 2] / np.maximum(r["decode"], 1e-9), 0, 1), 1.0)
        out_tokens = np.where(served, np.maximum(1, np.rint(1 + (r["output_tokens"] - 1) * decoded)), 0)
        regime = np.where(after, 1, 0)
        hashes = np.asarray([inc.before.config_hash, inc.after.config_hash], dtype=object)[regime]
        rid = np.asarray([f"gen-{seed}-{i:010d}" for i in range(index, index + n)], dtype=object)
        index += n
        arrival_us = start_us + np.rint(t * 1e6).astype(np.int64)
        preds = pd.DataFrame({
            "request_id": rid, "ts": rfc3339_ms(arrival_us), "model_version": MODEL_VERSION, "status": status,
            "lang": np.asarray(LANG_NAMES, dtype=object)[lang],
            "input_tokens": r["input_tokens"], "output_tokens": out_tokens.astype(np.int64),
            "ttft_ms": np.where(served, np.round(np.minimum(ttft, DEADLINE_MS), 3), np.nan),
            "latency_ms": np.round(latency, 3),
            "cache_hit": np.where(rejected, False, r["hit"]),
            "spec_accept": np.where(served, np.round(r["accept"], 4), np.nan),
            "config_hash": hashes,
        })
        name = f"part-{part:05d}"
        counts["predictions"] += jsonl(out_dir / "predictions" / f"{name}.jsonl", preds)
        for s, c in zip(*np.unique(status.astype(str), return_counts=True), strict=True):
            status_counts[str(s)] = status_counts.get(str(s), 0) + int(c)
        ri, si = np.nonzero(present)
        timings = pd.DataFrame({
            "request_id": rid[ri], "stage": np.asarray(STAGES, dtype=object)[si],
            "duration_ms": np.round(dur[ri, si], 3),
            "start_ts": rfc3339_ms(arrival_us[ri] + np.rint(rel[ri, si] * 1000).astype(np.int64)),
        })
        counts["timings"] += jsonl(out_dir / "timings" / f"{name}.jsonl", timings)
        # Feedback on completed answers, by language and regime; it arrives after the answer.
        gives = (status == "ok") & (g_lab.random(n) < FEEDBACK_SHARE)
        p_up = np.where(after, _per_lang(lang, 3, inc.after.thumbs_up), _per_lang(lang, 3, inc.before.thumbs_up))
        up = g_lab.random(n) < p_up
        delay_s = FEEDBACK_MEDIAN_S * np.exp(FEEDBACK_SIGMA * g_lab.standard_normal(n))
        label_us = arrival_us + np.rint((latency / 1000 + delay_s) * 1e6).astype(np.int64)
        li = np.flatnonzero(gives)
        li = li[np.argsort(label_us[li], kind="stable")]
        labels = pd.DataFrame({"request_id": rid[li], "label": np.where(up[li], UP, DOWN).astype(object),
                               "label_ts": rfc3339_ms(label_us[li])})
        counts["labels"] += jsonl(out_dir / "labels" / f"{name}.jsonl", labels)
        for key, k in ((f"{LANG_NAMES[li_]}:{'after' if a else 'before'}", u)
                       for li_, a, u in zip(lang[li], after[li], up[li], strict=True)):
            up_counts.setdefault(key, [0, 0])
            up_counts[key][0] += int(k)
            up_counts[key][1] += 1
        part += 1
    counts["parts"] = part
    counts["status"] = status_counts
    counts["thumbs_up"] = {k: {"up": v[0], "feedback": v[1]} for k, v in sorted(up_counts.items())}
    ref = generation_reference(seed)
    ref.to_parquet(out_dir / "reference.parquet", index=False)
    counts["reference"] = len(ref)
    gt = GroundTruth(
        scenario=scenario, seed=seed, start=_iso(start), end=_iso(start + timedelta(hours=hours)),
        onset=_iso(start + timedelta(hours=onset_h)) if faulty else None,
        fault_end=None if not faulty or fault_end_hours is None else _iso(start + timedelta(hours=fault_end_hours)),
        verdict=inc.verdict, what_changed=inc.what_changed,
        model_versions={"before": MODEL_VERSION, "after": MODEL_VERSION}, affected=inc.affected,
        expected_findings=list(inc.expected_findings), labels_after_onset=True, counts=counts,
        segment=next((f"{k}={v}" for k, v in inc.affected.get("segment", {}).items()), None),
        params={"hours": hours, "rate_per_s": rate_per_s, "onset_hours": None if not faulty else onset_h,
                "fault_end_hours": fault_end_hours, "service": SERVICE, "langs": {x[0]: x[1] for x in LANGS},
                "deadline_ms": DEADLINE_MS, "feedback_share": FEEDBACK_SHARE,
                "config_before": {"draft": inc.before.draft, "template": inc.before.template,
                                  "config_hash": inc.before.config_hash},
                "config_after": {"draft": inc.after.draft, "template": inc.after.template,
                                 "config_hash": inc.after.config_hash}},
    )
    with open(out_dir / "ground_truth.json", "w", encoding="utf-8", newline="\n") as fh:
        json.dump(asdict(gt), fh, indent=2)
        fh.write("\n")
    return gt


def generation_config(feedback: bool = True, windows: tuple[str, ...] = ("15m",)) -> dict:
    """The tailwatch config of the simulated service, its logs under ./logs and its reference under
    ./generated (as bench/incidents.py and the tests lay them out); `feedback`: with the quality section
    that scores thumbs up / down per language."""
    service: dict = {
        "name": SERVICE,
        "sources": {"predictions": {"kind": "files", "path": "./logs/predictions"},
                    "timings": {"kind": "files", "path": "./logs/timings"}},
        "schema": {"features": {"lang": "categorical"}, "segments": ["lang"],
                   "signals": ["spec_accept"]},
        "reference": {"path": "./generated/reference.parquet"},
        "buckets": {"size": "5m", "windows": list(windows)},
        "join": {"lateness": "5m"},
        "deadline": f"{DEADLINE_MS / 1000:g}s",
        "accepted_versions": [MODEL_VERSION],
    }
    if feedback:
        service["sources"]["labels"] = {"kind": "files", "path": "./logs/labels"}
        service["quality"] = {
            "feedback": {"positive": [UP], "negative": [DOWN]},
            "windows": ["1h"], "maturity_horizon": "2h", "label_horizon": "6h", "min_n": 30,
            "rules": [{"name": "thumbs up per language", "metric": "feedback_rate", "group": "*", "max_drop": 0.1}],
        }
    return {"storage": {"url": "sqlite:///tailwatch.db"}, "services": [service]}
