"""Serving simulator: churn-model prediction logs, stage timings, delayed labels and ground truth for
known incidents. `generate(scenario, out_dir)` writes one run; see generate.py for the file layout."""

from .generate import DEFAULT_START, GroundTruth, generate, reference_frame
from .scenarios import ALL_SCENARIOS, SCENARIOS

__all__ = ["ALL_SCENARIOS", "DEFAULT_START", "SCENARIOS", "GroundTruth", "generate", "reference_frame"]
