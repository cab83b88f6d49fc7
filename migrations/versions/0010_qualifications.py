"""Qualification runs in the database (they were in one service's memory): runs, their hosts and
checks, and the passing measurements the fleet norm is made of, shared by every replica.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07
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
        "fleet_qualifications",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.Column("deadline_ns", sa.BigInteger(), nullable=False),
        sa.Column("nbytes", sa.Integer(), nullable=False),
        sa.Column("iterations", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("done_ns", sa.BigInteger(), nullable=True),
    )
    op.create_index("ix_fleet_qualifications_state", "fleet_qualifications",
                    ["state", "deadline_ns"])  # fmt: skip
    op.create_table(
        "fleet_qualification_hosts",
        sa.Column("run_id", sa.String(40), primary_key=True),
        sa.Column("host", sa.String(128), primary_key=True),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("addr", sa.String(128), nullable=True),
        sa.Column("seen", sa.Boolean(), nullable=False),
        sa.Column("standing", sa.JSON(), nullable=False),
        sa.Column("verdict", sa.String(8), nullable=True),
        sa.Column("reasons", sa.JSON(), nullable=False),
        sa.Column("compute_s", sa.Float(), nullable=True),
        sa.Column("link_bps", sa.Float(), nullable=True),
        sa.Column("link_norm", sa.Float(), nullable=True),
        sa.Column("link_pairs", sa.Integer(), nullable=False),
        sa.Column("slow_link", sa.Text(), nullable=True),
        sa.Column("marked", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_fleet_qualification_hosts_host", "fleet_qualification_hosts", ["host"])
    op.create_index("ix_fleet_qualification_hosts_unmarked", "fleet_qualification_hosts",
                    ["marked", "link_bps"])  # fmt: skip
    op.create_table(
        "fleet_qualification_tasks",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("peer", sa.String(128), nullable=True),
        sa.Column("handed", sa.Boolean(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
    )
    op.create_index("ix_fleet_qualification_tasks_run", "fleet_qualification_tasks",
                    ["run_id", "host"])  # fmt: skip
    op.create_table(
        "fleet_qualification_norms",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("at_ns", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_fleet_qualification_norms_kind", "fleet_qualification_norms",
                    ["kind", "id"])  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_fleet_qualification_norms_kind", table_name="fleet_qualification_norms")
    op.drop_table("fleet_qualification_norms")
    op.drop_index("ix_fleet_qualification_tasks_run", table_name="fleet_qualification_tasks")
    op.drop_table("fleet_qualification_tasks")
    op.drop_index("ix_fleet_qualification_hosts_unmarked", table_name="fleet_qualification_hosts")
    op.drop_index("ix_fleet_qualification_hosts_host", table_name="fleet_qualification_hosts")
    op.drop_table("fleet_qualification_hosts")
    op.drop_index("ix_fleet_qualifications_state", table_name="fleet_qualifications")
    op.drop_table("fleet_qualifications")
