"""Indexes for the reads of one page: findings of one check over a time range (a drift or quality chart,
the metrics export; the identity constraint puts the model version between the check and the window, and
the window index alone reads every other check's findings of the range too), and an incident's verdicts
(by incident id, not a scan of the service's).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_findings_service_check_window_start", "findings", ["service", "check", "window_start"])
    op.create_index("ix_verdicts_incident_id", "verdicts", ["incident_id"])


def downgrade() -> None:
    op.drop_index("ix_verdicts_incident_id", table_name="verdicts")
    op.drop_index("ix_findings_service_check_window_start", table_name="findings")
