"""Serving simulator: churn-model prediction logs, stage timings, delayed labels and ground truth for
known incidents (`generate(scenario, out_dir)`; see generate.py for the file layout), and a text-generation
service with thumbs up / down feedback (`generate_generation`, generation.py)."""

from .generate import DEFAULT_START, GroundTruth, generate, reference_frame
from .generation import GENERATION_SCENARIOS, generate_generation, generation_config
from .scenarios import ALL_SCENARIOS, SCENARIOS

__all__ = ["ALL_SCENARIOS", "DEFAULT_START", "GENERATION_SCENARIOS", "SCENARIOS", "GroundTruth", "generate",
           "generate_generation", "generation_config", "reference_frame"]
