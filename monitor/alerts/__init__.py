"""Alerts: samples from verdicts and SLO rules, their lifecycle (pending, firing, resolved), grouping, silences."""
