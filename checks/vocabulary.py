"""Vocabulary: the share of text tokens the reference never used (new abbreviations, a new language)."""

from __future__ import annotations

from dataclasses import dataclass

from checks.base import Finding
from checks.contract import Count, Share, check, decide
from monitor.aggregate import keys
from monitor.aggregate.fold_text import OOV_SAMPLE
from monitor.aggregate.partial import Partial
from monitor.aggregate.profile import Profile


@dataclass(frozen=True)
class OovThreshold:
    """Breach when the window's out-of-vocabulary share is, with 95% confidence, more than `max_increase`
    above the reference's expected share. The interval counts texts, not tokens (a text's tokens come
    together), so it is wide on purpose."""

    max_increase: Share = 0.03  # absolute, share of tokens
    min_texts: Count = 50  # sampled texts below which the check says 'insufficient'


@check("oov_rate", OovThreshold, "vocabulary", "share of tokens outside the reference vocabulary (0..1)",
       "sampled texts")
def oov_rate(window: Partial, profile: Profile | None, baseline: Partial | None,
             params: OovThreshold) -> list[Finding]:
    """Share (0..1) of tokens per text field outside the reference vocabulary, vs the reference's own
    expected share (FieldProfile.expected_oov), over the texts sampled by hash (1 in OOV_SAMPLE distinct
    texts). Nothing without a profile; 'insufficient' when the stored profile has no vocabulary (built
    before this check: rebuild it with `tailwatch reference build`)."""
    if profile is None:
        return []
    out = []
    for name, ref in sorted(profile.fields.items()):
        if ref.kind != "text":
            continue
        tokens, oov = window.counts[keys.tokens(name)], window.counts[keys.oov(name)]
        texts = window.counts[keys.oov_texts(name)]
        expected = ref.expected_oov
        value = oov / tokens if tokens else None
        # Texts as the unit: the token share, counted over `texts` trials.
        (low, high), status = decide(value * texts if value is not None else 0, texts if value is not None else 0,
                                         None if expected is None else expected + params.max_increase,
                                         texts >= params.min_texts)
        out.append(Finding("oov_rate", {"field": name}, value, status, texts, baseline=expected,
                           effect=None if value is None or expected is None else value - expected,
                           interval=(low, high) if texts else None,
                           detail={"tokens": tokens, "oov_tokens": oov, "sampled_texts": texts,
                                   "sample": f"1 in {OOV_SAMPLE} distinct texts",
                                   "vocabulary": len(ref.vocabulary),
                                   **({} if ref.vocabulary else {"note": "the reference profile has no "
                                       "vocabulary: rebuild it with `tailwatch reference build`"})}))
    return out
