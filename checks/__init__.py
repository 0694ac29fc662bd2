"""Pure window checks: (partials, reference profile, params) -> typed findings."""

import os

os.environ.setdefault("DO_NOT_TRACK", "1")
