"""Quarantine rows name the field that broke the contract and keep the bytes of the line as written.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("quarantine", sa.Column("field", sa.String(), nullable=True))
    op.add_column("quarantine", sa.Column("raw", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quarantine") as batch:
        batch.drop_column("raw")
        batch.drop_column("field")
