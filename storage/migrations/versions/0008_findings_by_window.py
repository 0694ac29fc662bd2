"""Findings read by service and window start without naming a check (an incident's evidence, a page of
one time range) use an index of their own: the identity constraint leads with the check.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_findings_service_window_start", "findings", ["service", "window_start"])


def downgrade() -> None:
    op.drop_index("ix_findings_service_window_start", table_name="findings")
