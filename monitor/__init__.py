"""tailwatch: tells "the service got slower" apart from "the predictions got worse"."""

import os

# Evidently reports usage unless told not to; set before any module can import it.
os.environ.setdefault("DO_NOT_TRACK", "1")

from monitor.memory import tune_malloc  # noqa: E402  (after DO_NOT_TRACK: nothing here imports evidently)

# One malloc arena and fixed thresholds (monitor/memory.py), before any thread can make an arena of its own:
# set later, threads' arenas would stay in use and keep their free tops.
tune_malloc()

__version__ = "0.1.0"
