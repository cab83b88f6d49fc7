"""Incidents carry a severity from their measured impact (issue 16): minor, major, critical.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("incidents") as batch:
        batch.add_column(
            sa.Column("severity", sa.String(16), nullable=False, server_default="major")
        )


def downgrade() -> None:
    with op.batch_alter_table("incidents") as batch:
        batch.drop_column("severity")
