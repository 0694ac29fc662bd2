"""Delayed labels and quality results: the scored predictions labels join to, and the labels.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scored_predictions",
        sa.Column("service", sa.String(), nullable=False),
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("model_version", sa.String(), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("prediction", sa.String(), nullable=True),
        sa.Column("scores", sa.Text(), nullable=True),
        sa.Column("attrs", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("service", "request_id", "model_version", name="pk_scored_predictions"),
    )
    op.create_index("ix_scored_predictions_service_ts", "scored_predictions", ["service", "ts"])
    op.create_table(
        "labels",
        sa.Column("service", sa.String(), nullable=False),
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("label", sa.String(), nullable=False),
        sa.Column("label_ts", sa.DateTime(timezone=True), nullable=True),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("changes", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("service", "request_id", name="pk_labels"),
    )
    op.create_index("ix_labels_service_first_seen", "labels", ["service", "first_seen"])


def downgrade() -> None:
    op.drop_index("ix_labels_service_first_seen", table_name="labels")
    op.drop_table("labels")
    op.drop_index("ix_scored_predictions_service_ts", table_name="scored_predictions")
    op.drop_table("scored_predictions")
