"""Bin edges of a reference numeric column."""

from __future__ import annotations

import numpy as np

ATOM_WIDTH = 1e-3  # share of the gap to the next reference value an atom's own bin spans: rounding, no more


def atom_edges(ordered: np.ndarray, edges: np.ndarray, bins: int) -> np.ndarray:
    """Quantile `edges` of sorted finite values, plus an edge just above each edge value that holds 1 /
    `bins` of the values or more (an atom: a pixel's 0, an integer level) when its bin holds other values
    too: the atom becomes a bin of its own, so values turning up beside it (a pixel turning nonzero)
    cannot move unseen inside its bin. The new edge lies ATOM_WIDTH of the way to the next value."""
    lo = np.searchsorted(ordered, edges, side="left")
    hi = np.searchsorted(ordered, edges, side="right")
    ends = np.r_[lo[1:], len(ordered)]  # where each edge's bin ends
    split = ((hi - lo) * bins >= len(ordered)) & (hi < ends)
    if not split.any():
        return edges
    return np.union1d(edges, edges[split] + (ordered[hi[split]] - edges[split]) * ATOM_WIDTH)
