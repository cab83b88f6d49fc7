"""Actions (with audit trail), plan versions and declared job workloads.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _job_fk() -> sa.ForeignKey:
    return sa.ForeignKey("jobs.id", ondelete="CASCADE")


def upgrade() -> None:
    op.create_table(
        "actions",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("job_id", sa.String(128), _job_fk(), nullable=False),
        sa.Column("incident_id", sa.String(40), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("target", sa.String(512), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("actuator", sa.String(32), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("outcome", sa.JSON(), nullable=True),
        sa.Column("idempotency_key", sa.String(600), nullable=False, unique=True),
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.Column("updated_ns", sa.BigInteger(), nullable=False),
        sa.Column("decided_event_ns", sa.BigInteger(), nullable=False),
        sa.Column("executed_ns", sa.BigInteger(), nullable=True),
        sa.Column("decided_by", sa.String(128), nullable=True),
    )
    op.create_index("ix_actions_job_id", "actions", ["job_id"])
    op.create_index("ix_actions_incident_id", "actions", ["incident_id"])
    op.create_index("ix_actions_state", "actions", ["state"])
    op.create_table(
        "action_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "action_id",
            sa.String(40),
            sa.ForeignKey("actions.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("at_ns", sa.BigInteger(), nullable=False),
        sa.Column("from_state", sa.String(16), nullable=True),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
    )
    op.create_index("ix_action_events_action_id", "action_events", ["action_id"])
    op.create_table(
        "plans",
        sa.Column("job_id", sa.String(128), _job_fk(), primary_key=True),
        sa.Column("version", sa.Integer(), primary_key=True),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("action_id", sa.String(40), nullable=True, unique=True),
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.Column("applied_step", sa.Integer(), nullable=True),
        sa.Column("applied_ns", sa.BigInteger(), nullable=True),
    )
    op.create_table(
        "job_workloads",
        sa.Column("job_id", sa.String(128), _job_fk(), primary_key=True),
        sa.Column("global_batch", sa.Integer(), nullable=False),
        sa.Column("unit", sa.String(32), nullable=False),
        sa.Column("updated_ns", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("job_workloads")
    op.drop_table("plans")
    op.drop_index("ix_action_events_action_id", table_name="action_events")
    op.drop_table("action_events")
    op.drop_index("ix_actions_state", table_name="actions")
    op.drop_index("ix_actions_incident_id", table_name="actions")
    op.drop_index("ix_actions_job_id", table_name="actions")
    op.drop_table("actions")
