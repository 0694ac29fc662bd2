"""A file's stored offset keeps a hash of the last bytes read before it (`tail`), so a file with the same
first bytes is told from a copy of the file read.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("source_offsets", sa.Column("tail", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("source_offsets") as batch:
        batch.drop_column("tail")
