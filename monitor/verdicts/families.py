"""What each family of finding (checks.catalog) means for the verdict: the check names of each role."""

from __future__ import annotations

from checks.catalog import names

SERVICE_CHECKS = names("latency")  # total quantiles and failure / timeout / reject rates
# Serving-efficiency losses that are a service regression by themselves: a cache that stopped hitting (or
# serves another version's results) costs every request its compute, before the latency shows it at load.
SERVING_CHECKS = names("cache")
SIGNAL_CHECKS = names("cache", "signals", "routing", "vocabulary")
CONFIRMED_QUALITY = names("quality", "versions")  # rest on delivered labels
ESTIMATED_QUALITY = names("estimates", "predictions")  # before labels arrive
INPUT_CHECKS = names("completeness", "ranges", "drift", "lengths", "vocabulary")
# Contract-level input changes: when one breaches, a prediction shift is what the new inputs do to the
# model, not evidence of harm by itself.
CONTRACT_INPUT_CHECKS = names("completeness", "ranges")
LENGTH_CHECKS = names("lengths")  # input lengths: they explain a slowdown, or tell it apart from longer inputs
LABEL_CHECKS = names("labels")
