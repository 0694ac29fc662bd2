"""Synthetic support-ticket `notes`: deterministic text with a long-tailed length."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

PHRASES = (
    "customer called about the bill", "asked why the monthly charge went up", "wants a discount",
    "internet drops in the evening", "router replaced last visit", "complained about wait time on the phone",
    "considering a competitor offer", "moved to a new address", "asked to pause the service",
    "streaming buffers at night", "technician missed the appointment", "happy with support today",
    "requested paperless billing", "payment failed twice", "asked about contract end date",
    "upgrade to fiber requested", "speed test below plan", "asked to remove a add-on",
    "late fee disputed", "chat transferred three times", "no follow up after the last ticket",
    "security package questions", "device protection claim", "wants to talk to a manager",
    "billing address corrected", "credit applied to the account", "outage in the area confirmed",
    "tv channels missing", "password reset", "asked about the senior discount",
)
CORPUS_CHARS = 200_000
MAX_NOTES_CHARS = 60_000


@lru_cache(maxsize=1)
def corpus() -> tuple[str, np.ndarray]:
    """A fixed text of shuffled phrases and the offsets where phrases start (independent of any seed)."""
    rng = np.random.Generator(np.random.PCG64(12345))
    parts, starts, pos = [], [], 0
    while pos < CORPUS_CHARS + MAX_NOTES_CHARS:
        p = PHRASES[int(rng.integers(len(PHRASES)))] + (". " if rng.random() < 0.3 else "; ")
        starts.append(pos)
        parts.append(p)
        pos += len(p)
    return "".join(parts), np.asarray(starts, dtype=np.int64)


def lengths(rng: np.random.Generator, n: int, long_share: np.ndarray | float, median: np.ndarray | float
            ) -> np.ndarray:
    """Lengths in characters: lognormal body (sigma 1) mixed with a Pareto(alpha 1, from 400) tail
    of share `long_share`; capped at MAX_NOTES_CHARS. Always draws the same amount from `rng`."""
    body = median * np.exp(rng.standard_normal(n))
    tail = 400.0 / np.maximum(rng.random(n), 1e-9)
    pick = rng.random(n) < long_share
    out = np.where(pick, tail, body)
    return np.clip(np.rint(out), 0, MAX_NOTES_CHARS).astype(np.int64)


def texts(rng: np.random.Generator, lens: np.ndarray) -> list[str]:
    """One note per length; each starts at a phrase boundary of the corpus."""
    text, starts = corpus()
    usable = int(np.searchsorted(starts, CORPUS_CHARS))
    off = starts[rng.integers(0, usable, size=len(lens))]
    return [text[o:o + n] for o, n in zip(off.tolist(), lens.tolist(), strict=True)]
