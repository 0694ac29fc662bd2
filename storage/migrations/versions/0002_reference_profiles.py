"""Reference profiles: the stored profile each service's checks compare windows with.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reference_profiles",
        sa.Column("service", sa.String(), nullable=False),
        sa.Column("fingerprint", sa.String(), nullable=False),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("built_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("profile", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("service", name="pk_reference_profiles"),
    )


def downgrade() -> None:
    op.drop_table("reference_profiles")
