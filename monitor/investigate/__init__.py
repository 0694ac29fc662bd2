"""Investigation tools over stored results and raw logs: drill-down, compare, explain."""
