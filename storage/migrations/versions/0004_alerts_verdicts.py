"""Verdicts, alert lifecycle, silences and notifications.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03

New tables: incidents, verdicts, silences, versions_seen, alert_cursors (the last tick whose findings
were turned into verdicts). alert_state gains the columns the lifecycle
needs (service, alertname, last_active_at, group_fingerprint), outbox the incident it belongs to and
its kind. Self-contained, like 0001.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "incidents",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("service", sa.String(), nullable=False),
        sa.Column("model_version", sa.String(), nullable=True),
        sa.Column("verdict", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        _ts("opened_at"),
        _ts("resolved_at", nullable=True),
        _ts("first_window_start", nullable=True),
        _ts("last_window_end", nullable=True),
        sa.Column("fingerprint", sa.String(), nullable=False),
        sa.Column("group_labels", sa.Text(), nullable=True),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column("revision", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("notified_hash", sa.String(), nullable=True),
        _ts("last_notified_at", nullable=True),
        sa.Column("channel", sa.String(), nullable=True),
        sa.Column("slack_ts", sa.String(), nullable=True),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_incidents"),
    )
    op.create_index("ix_incidents_service_status", "incidents", ["service", "status"])
    op.create_index("ix_incidents_fingerprint_status", "incidents", ["fingerprint", "status"])

    op.create_table(
        "verdicts",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("service", sa.String(), nullable=False),
        sa.Column("model_version", sa.String(), nullable=False),
        _ts("window_start"),
        _ts("window_end"),
        sa.Column("verdict", sa.String(), nullable=False),
        sa.Column("estimated", sa.Boolean(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("evidence", sa.Text(), nullable=True),
        sa.Column("attribution", sa.Text(), nullable=True),
        sa.Column("what_changed", sa.Text(), nullable=True),
        sa.Column("next_steps", sa.Text(), nullable=True),
        sa.Column("rollback_to", sa.String(), nullable=True),
        sa.Column("summary", sa.String(), nullable=False, server_default=""),
        sa.Column("incident_id", BigId, nullable=True),
        _ts("created_at"),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_verdicts"),
        sa.ForeignKeyConstraint(
            ["incident_id"], ["incidents.id"], name="fk_verdicts_incident_id_incidents", ondelete="SET NULL"
        ),
        sa.UniqueConstraint(
            "service", "model_version", "window_start", "window_end", name="uq_verdicts_identity"
        ),
    )
    op.create_index("ix_verdicts_service_window_end", "verdicts", ["service", "window_end"])

    op.create_table(
        "silences",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("matchers", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(), nullable=False),
        sa.Column("comment", sa.String(), nullable=False),
        _ts("starts_at"),
        _ts("ends_at"),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_silences"),
    )

    op.create_table(
        "versions_seen",
        sa.Column("service", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("value", sa.String(), nullable=False),
        _ts("first_seen"),
        _ts("recorded_at"),
        sa.PrimaryKeyConstraint("service", "kind", "value", name="pk_versions_seen"),
    )

    op.create_table(
        "alert_cursors",
        sa.Column("service", sa.String(), nullable=False),
        sa.Column("last_tick_id", sa.BigInteger(), nullable=False),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("service", name="pk_alert_cursors"),
    )

    with op.batch_alter_table("alert_state") as batch:
        batch.add_column(sa.Column("service", sa.String(), nullable=True))
        batch.add_column(sa.Column("alertname", sa.String(), nullable=True))
        batch.add_column(_ts("last_active_at", nullable=True))
        batch.add_column(_ts("keep_firing_since", nullable=True))
        batch.add_column(sa.Column("group_fingerprint", sa.String(), nullable=True))
    with op.batch_alter_table("outbox") as batch:
        batch.add_column(sa.Column("incident_id", BigId, nullable=True))
        batch.add_column(sa.Column("kind", sa.String(), nullable=True))
    op.create_index("ix_outbox_incident_id", "outbox", ["incident_id"])


def downgrade() -> None:
    op.drop_index("ix_outbox_incident_id", table_name="outbox")
    with op.batch_alter_table("outbox") as batch:
        batch.drop_column("kind")
        batch.drop_column("incident_id")
    with op.batch_alter_table("alert_state") as batch:
        batch.drop_column("group_fingerprint")
        batch.drop_column("keep_firing_since")
        batch.drop_column("last_active_at")
        batch.drop_column("alertname")
        batch.drop_column("service")
    op.drop_table("alert_cursors")
    op.drop_table("versions_seen")
    op.drop_table("silences")
    op.drop_index("ix_verdicts_service_window_end", table_name="verdicts")
    op.drop_table("verdicts")
    op.drop_index("ix_incidents_fingerprint_status", table_name="incidents")
    op.drop_index("ix_incidents_service_status", table_name="incidents")
    op.drop_table("incidents")
