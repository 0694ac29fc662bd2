"""Verdicts: windows scored against their baselines, label quality scored, and each version and window decided."""
