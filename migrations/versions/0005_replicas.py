"""Replicas on a bus: partition owners and positions, job snapshots (service/replica/models.py).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "bus_partitions",
        sa.Column("partition", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("owner", sa.String(300), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("updated_ns", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "job_snapshots",
        sa.Column("job", sa.String(128), primary_key=True),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("committed_seq", sa.BigInteger(), nullable=False),
        sa.Column("snapshot_seq", sa.BigInteger(), nullable=False),
        sa.Column("taken_ns", sa.BigInteger(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_job_snapshots_partition", "job_snapshots", ["partition"])


def downgrade() -> None:
    op.drop_index("ix_job_snapshots_partition", "job_snapshots")
    op.drop_table("job_snapshots")
    op.drop_table("bus_partitions")
