"""Daemon operations: heartbeats, job events (errors and missed runs), backfill progress.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "daemon_heartbeats",
        sa.Column("instance", sa.String(), nullable=False),
        sa.Column("role", sa.String(), nullable=False),
        _ts("started_at"),
        _ts("beat_at"),
        _ts("last_tick_at", nullable=True),
        sa.Column("last_tick_status", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("instance", name="pk_daemon_heartbeats"),
    )
    op.create_table(
        "job_events",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        _ts("at"),
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("instance", sa.String(), nullable=False),
        sa.Column("message", sa.String(), nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("id", name="pk_job_events"),
    )
    op.create_index("ix_job_events_at", "job_events", ["at"])
    op.create_table(
        "backfill_progress",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        _ts("since"),
        _ts("until"),
        sa.Column("step_seconds", sa.Integer(), nullable=False),
        _ts("reached", nullable=True),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("staging", sa.String(), nullable=False),
        _ts("started_at"),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_backfill_progress"),
    )


def downgrade() -> None:
    op.drop_table("backfill_progress")
    op.drop_index("ix_job_events_at", table_name="job_events")
    op.drop_table("job_events")
    op.drop_table("daemon_heartbeats")
