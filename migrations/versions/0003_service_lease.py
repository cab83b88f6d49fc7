"""The single-service lease (service/lease.py).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "service_lease",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("holder", sa.String(300), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("acquired_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("service_lease")
