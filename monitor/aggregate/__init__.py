"""Aggregate: rows folded into mergeable per-bucket partials (counts, histograms, sketches), their keys, the reference profile."""
