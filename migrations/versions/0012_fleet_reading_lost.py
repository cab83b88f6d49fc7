"""The job time a part's own slowness cost in a job, measured there: a NIC's readings from jobs'
passive data carry what its transfers lost against the job's other hosts (the fleet ledger
prices a chronically slow NIC by it).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fleet_readings") as batch:
        batch.add_column(sa.Column("lost_s", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("fleet_readings") as batch:
        batch.drop_column("lost_s")
