"""The fleet ledger: hardware parts across jobs, per-job readings, incident marks, host
inventories (docs/fleet.md).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fleet_parts",
        sa.Column("part_id", sa.String(200), primary_key=True),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("label", sa.String(200), nullable=False),
        sa.Column("id_source", sa.String(8), nullable=True),
        sa.Column("first_seen_ns", sa.BigInteger(), nullable=False),
        sa.Column("last_seen_ns", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("state_since_ns", sa.BigInteger(), nullable=False),
        sa.Column("state_reason", sa.Text(), nullable=False),
        sa.Column("clean_s", sa.Float(), nullable=False),
        sa.Column("clean_jobs", sa.JSON(), nullable=False),
        sa.Column("jobs_total", sa.Integer(), nullable=False),
        sa.Column("incidents_total", sa.Integer(), nullable=False),
        sa.Column("lost_s_total", sa.Float(), nullable=False),
        sa.Column("health", sa.JSON(), nullable=False),
        sa.Column("flagged", sa.Boolean(), nullable=False),
        sa.Column("cost_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_fleet_parts_kind", "fleet_parts", ["kind", "cost_s"])
    op.create_table(
        "fleet_readings",
        sa.Column("part_id", sa.String(200), primary_key=True),
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("mean", sa.Float(), nullable=False),
        sa.Column("var", sa.Float(), nullable=False),
        sa.Column("observed_s", sa.Float(), nullable=False),
        sa.Column("first_ns", sa.BigInteger(), nullable=False),
        sa.Column("last_ns", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "fleet_marks",
        sa.Column("incident_id", sa.String(40), primary_key=True),
        sa.Column("part_id", sa.String(200), primary_key=True),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("at_ns", sa.BigInteger(), nullable=False),
        sa.Column("lost_s", sa.Float(), nullable=False),
        sa.Column("hard", sa.Boolean(), nullable=False),
        sa.Column("final", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_fleet_marks_part", "fleet_marks", ["part_id", "at_ns"])
    op.create_table(
        "fleet_inventory",
        sa.Column("host", sa.String(128), primary_key=True),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("nics", sa.JSON(), nullable=False),
        sa.Column("reported_ns", sa.BigInteger(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("fleet_inventory")
    op.drop_index("ix_fleet_marks_part", table_name="fleet_marks")
    op.drop_table("fleet_marks")
    op.drop_table("fleet_readings")
    op.drop_index("ix_fleet_parts_kind", table_name="fleet_parts")
    op.drop_table("fleet_parts")
