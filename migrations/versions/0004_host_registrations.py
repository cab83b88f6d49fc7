"""v2 host registrations survive a restart (service/jobs/models.py HostRegistration).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "host_registrations",
        sa.Column(
            "job_id", sa.String(128), sa.ForeignKey("jobs.id", ondelete="CASCADE"),
            primary_key=True,
        ),  # fmt: skip
        sa.Column("host", sa.String(128), primary_key=True),
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("registered", sa.BigInteger(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("host_registrations")
