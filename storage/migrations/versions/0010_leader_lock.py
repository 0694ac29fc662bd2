"""The leader lock on relations the SQL reader has no privilege on: the view `leader_lock` (PostgreSQL
only), which the leader holds locked, and the table `leader_fence` with the leadership term.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leader_fence",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("term", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_leader_fence"),
    )
    if op.get_bind().dialect.name == "postgresql":
        # No columns, no base relation: locking it locks nothing else.
        op.execute("CREATE VIEW leader_lock AS SELECT")
        op.execute("REVOKE ALL ON leader_lock, leader_fence FROM PUBLIC")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP VIEW leader_lock")
    op.drop_table("leader_fence")
