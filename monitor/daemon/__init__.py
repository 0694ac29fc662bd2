"""The daemon: scheduler, tick and nightly jobs, leader lock, health and metrics, backfill, retention, logs."""
