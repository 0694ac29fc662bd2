"""Accepted versions: a version value accepted as good with `tailwatch accept` (its windows are compared
with its own history from then on).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "versions_accepted",
        sa.Column("service", sa.String(), nullable=False),
        sa.Column("value", sa.String(), nullable=False),
        sa.Column("accepted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("accepted_by", sa.String(), nullable=False, server_default=""),
        sa.Column("comment", sa.String(), nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("service", "value", name="pk_versions_accepted"),
    )


def downgrade() -> None:
    op.drop_table("versions_accepted")
