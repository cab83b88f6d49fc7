"""Runtime control per job (mute, pause, maintenance windows, threshold overrides) and the
audit trail of operators' changes.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_controls",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("muted_until_ns", sa.BigInteger(), nullable=True),
        sa.Column("mute_reason", sa.Text(), nullable=True),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("pause_reason", sa.Text(), nullable=True),
        sa.Column("windows", sa.JSON(), nullable=False),
        sa.Column("overrides", sa.JSON(), nullable=False),
        sa.Column("updated_ns", sa.BigInteger(), nullable=False),
        sa.Column("updated_by", sa.String(128), nullable=False),
    )
    op.create_table(
        "audit_events",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("at_ns", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("verb", sa.String(32), nullable=False),
        sa.Column("job_id", sa.String(128), nullable=True),
        sa.Column("target", sa.String(128), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
    )
    op.create_index("ix_audit_events_job", "audit_events", ["job_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_audit_events_job", table_name="audit_events")
    op.drop_table("audit_events")
    op.drop_table("job_controls")
