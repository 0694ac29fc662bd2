"""Initial schema: offsets, ticks, partials, findings, alert state, outbox, quarantine, join buffer.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Self-contained on purpose (no import of storage.models): a migration must keep meaning what it meant
when it was written, whatever the models become. JSON columns are TEXT; timestamps are timestamptz.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _count(name: str) -> sa.Column:
    return sa.Column(name, sa.BigInteger(), nullable=False, server_default="0")


def upgrade() -> None:
    op.create_table(
        "source_offsets",
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("file_key", sa.String(), nullable=False),
        sa.Column("path", sa.String(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("line", sa.BigInteger(), nullable=False),
        sa.Column("cursor", sa.String(), nullable=True),
        sa.Column("fingerprint", sa.String(), nullable=True),
        sa.Column("size", sa.BigInteger(), nullable=True),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("source", "file_key", name="pk_source_offsets"),
    )

    op.create_table(
        "ticks",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("service", sa.String(), nullable=False),
        _ts("started_at"),
        _ts("finished_at", nullable=True),
        _ts("now"),
        sa.Column("status", sa.String(), nullable=False),
        _count("rows_read"),
        _count("accepted"),
        _count("quarantined"),
        _count("joined"),
        _count("unmatched"),
        _count("duplicates"),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_ticks"),
    )
    op.create_index("ix_ticks_service_id", "ticks", ["service", "id"])

    op.create_table(
        "bucket_partials",
        sa.Column("service", sa.String(), nullable=False),
        sa.Column("model_version", sa.String(), nullable=False),
        _ts("bucket_start"),
        sa.Column("bucket_seconds", sa.Integer(), nullable=False),
        sa.Column("segment", sa.String(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint(
            "service", "model_version", "bucket_start", "bucket_seconds", "segment",
            name="pk_bucket_partials",
        ),
    )

    op.create_table(
        "findings",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("tick_id", BigId, nullable=True),
        sa.Column("service", sa.String(), nullable=False),
        sa.Column("check", sa.String(), nullable=False),
        sa.Column("model_version", sa.String(), nullable=False),
        _ts("window_start"),
        _ts("window_end"),
        sa.Column("labels_key", sa.String(), nullable=False),
        sa.Column("labels", sa.Text(), nullable=True),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("baseline", sa.Float(), nullable=True),
        sa.Column("effect", sa.Float(), nullable=True),
        sa.Column("interval_low", sa.Float(), nullable=True),
        sa.Column("interval_high", sa.Float(), nullable=True),
        sa.Column("p_value", sa.Float(), nullable=True),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_findings"),
        sa.ForeignKeyConstraint(
            ["tick_id"], ["ticks.id"], name="fk_findings_tick_id_ticks", ondelete="SET NULL"
        ),
        sa.UniqueConstraint(
            "service", "check", "model_version", "window_start", "window_end", "labels_key",
            name="uq_findings_identity",
        ),
    )

    op.create_table(
        "alert_state",
        sa.Column("fingerprint", sa.String(), nullable=False),
        sa.Column("labels", sa.Text(), nullable=True),
        sa.Column("state", sa.String(), nullable=False),
        _ts("active_since", nullable=True),
        _ts("fired_at", nullable=True),
        _ts("resolved_at", nullable=True),
        _ts("last_eval_at", nullable=True),
        sa.Column("annotations", sa.Text(), nullable=True),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("fingerprint", name="pk_alert_state"),
    )

    op.create_table(
        "outbox",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("dedup_key", sa.String(), nullable=False),
        _ts("created_at"),
        sa.Column("channel", sa.String(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=True),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        _ts("next_attempt_at"),
        _ts("sent_at", nullable=True),
        sa.Column("last_error", sa.String(), nullable=True),
        sa.Column("external_id", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_outbox"),
        sa.UniqueConstraint("dedup_key", name="uq_outbox_dedup_key"),
    )
    op.create_index("ix_outbox_status_next_attempt_at", "outbox", ["status", "next_attempt_at"])

    op.create_table(
        "quarantine",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("tick_id", BigId, nullable=True),
        sa.Column("service", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("position", sa.String(), nullable=False),
        sa.Column("reason", sa.String(), nullable=False),
        sa.Column("excerpt", sa.String(), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_quarantine"),
    )
    op.create_index("ix_quarantine_service_reason", "quarantine", ["service", "reason"])

    op.create_table(
        "join_pending",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("service", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        _ts("created_at"),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_join_pending"),
    )
    op.create_index("ix_join_pending_service_kind", "join_pending", ["service", "kind"])


def downgrade() -> None:
    op.drop_index("ix_join_pending_service_kind", table_name="join_pending")
    op.drop_table("join_pending")
    op.drop_index("ix_quarantine_service_reason", table_name="quarantine")
    op.drop_table("quarantine")
    op.drop_index("ix_outbox_status_next_attempt_at", table_name="outbox")
    op.drop_table("outbox")
    op.drop_table("alert_state")
    op.drop_table("findings")
    op.drop_table("bucket_partials")
    op.drop_index("ix_ticks_service_id", table_name="ticks")
    op.drop_table("ticks")
    op.drop_table("source_offsets")
