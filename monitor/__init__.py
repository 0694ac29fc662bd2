"""tailwatch: tells "the service got slower" apart from "the predictions got worse"."""

import os

# Evidently reports usage unless told not to; set before any module can import it.
os.environ.setdefault("DO_NOT_TRACK", "1")

__version__ = "0.1.0"
