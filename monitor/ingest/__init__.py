"""Ingest: read prediction, timing and label rows (files, SQL, OTLP), hold them to the contract, join them by request."""
