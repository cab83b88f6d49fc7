"""Qualification norms per model: a compute measurement (one per GPU on GPU nodes) is judged
against measurements of the same GPU or CPU model only; a host's GPUs found slow are kept for
the fleet ledger's marks.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fleet_qualification_norms") as batch:
        batch.add_column(sa.Column("model", sa.String(200), nullable=False, server_default=""))
    op.drop_index("ix_fleet_qualification_norms_kind", table_name="fleet_qualification_norms")
    with op.batch_alter_table("fleet_qualification_hosts") as batch:
        batch.add_column(sa.Column("slow_gpus", sa.JSON(), nullable=True))
    op.create_index("ix_fleet_qualification_norms_kind_model", "fleet_qualification_norms",
                    ["kind", "model", "id"])  # fmt: skip


def downgrade() -> None:
    with op.batch_alter_table("fleet_qualification_hosts") as batch:
        batch.drop_column("slow_gpus")
    op.drop_index("ix_fleet_qualification_norms_kind_model",
                  table_name="fleet_qualification_norms")  # fmt: skip
    op.create_index("ix_fleet_qualification_norms_kind", "fleet_qualification_norms",
                    ["kind", "id"])  # fmt: skip
    with op.batch_alter_table("fleet_qualification_norms") as batch:
        batch.drop_column("model")
