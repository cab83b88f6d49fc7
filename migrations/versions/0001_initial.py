"""Initial schema: jobs, hosts, agent streams, ranks, comms, incidents, history.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ID = sa.String(128)


def _job_fk() -> sa.ForeignKey:
    return sa.ForeignKey("jobs.id", ondelete="CASCADE")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", ID, primary_key=True),
        sa.Column("world_size", sa.Integer(), nullable=True),
        sa.Column("first_seen_ns", sa.BigInteger(), nullable=False),
        sa.Column("last_seen_ns", sa.BigInteger(), nullable=False),
        sa.Column("watermark_ns", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.Integer(), nullable=True),
        sa.Column("step_time_s", sa.Float(), nullable=True),
        sa.Column("baseline_step_time_s", sa.Float(), nullable=True),
    )
    op.create_table(
        "hosts",
        sa.Column("job_id", ID, _job_fk(), primary_key=True),
        sa.Column("host", ID, primary_key=True),
        sa.Column("first_seen_ns", sa.BigInteger(), nullable=False),
        sa.Column("last_seen_ns", sa.BigInteger(), nullable=False),
        sa.Column("envelopes", sa.BigInteger(), nullable=False),
        sa.Column("records_accepted", sa.BigInteger(), nullable=False),
        sa.Column("records_duplicate", sa.BigInteger(), nullable=False),
        sa.Column("records_rejected", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "agent_streams",
        sa.Column("job_id", ID, _job_fk(), primary_key=True),
        sa.Column("host", ID, primary_key=True),
        sa.Column("agent", ID, primary_key=True),
        sa.Column("last_batch_seq", sa.BigInteger(), nullable=False),
        sa.Column("updated_ns", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "ranks",
        sa.Column("job_id", ID, _job_fk(), primary_key=True),
        sa.Column("rank", sa.Integer(), primary_key=True),
        sa.Column("host", ID, nullable=False),
        sa.Column("gpu", sa.Integer(), nullable=True),
    )
    op.create_table(
        "comms",
        sa.Column("job_id", ID, _job_fk(), primary_key=True),
        sa.Column("comm", ID, primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("ranks", sa.JSON(), nullable=False),
    )
    op.create_table(
        "incidents",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("job_id", sa.String(128), _job_fk(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("subject", sa.String(512), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("ranks", sa.JSON(), nullable=False),
        sa.Column("hosts", sa.JSON(), nullable=False),
        sa.Column("slowdown", sa.Float(), nullable=True),
        sa.Column("subject_slowdown", sa.Float(), nullable=True),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column("onset_ns", sa.BigInteger(), nullable=False),
        sa.Column("detected_ns", sa.BigInteger(), nullable=False),
        sa.Column("resolved_ns", sa.BigInteger(), nullable=True),
        sa.Column("onset_step", sa.Integer(), nullable=True),
        sa.Column("detected_step", sa.Integer(), nullable=True),
        sa.Column("resolved_step", sa.Integer(), nullable=True),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("updated_ns", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_incidents_job_id", "incidents", ["job_id"])
    op.create_index(
        "uq_incidents_open_subject",
        "incidents",
        ["job_id", "kind", "subject"],
        unique=True,
        sqlite_where=sa.text("state = 'open'"),
        postgresql_where=sa.text("state = 'open'"),
    )
    op.create_table(
        "rank_history",
        sa.Column("job_id", ID, _job_fk(), primary_key=True),
        sa.Column("rank", sa.Integer(), primary_key=True),
        sa.Column("bucket", sa.Integer(), primary_key=True),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("end_ns", sa.BigInteger(), nullable=False),
        sa.Column("step_time_s", sa.Float(), nullable=True),
        sa.Column("compute_s", sa.Float(), nullable=True),
        sa.Column("comm_s", sa.Float(), nullable=True),
        sa.Column("lateness_s", sa.Float(), nullable=True),
        sa.Column("score", sa.Float(), nullable=True),
    )
    op.create_table(
        "job_history",
        sa.Column("job_id", ID, _job_fk(), primary_key=True),
        sa.Column("bucket", sa.Integer(), primary_key=True),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("end_ns", sa.BigInteger(), nullable=False),
        sa.Column("step_time_s", sa.Float(), nullable=True),
        sa.Column("step_time_max_s", sa.Float(), nullable=True),
        sa.Column("slowdown", sa.Float(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("job_history")
    op.drop_table("rank_history")
    op.drop_index("uq_incidents_open_subject", table_name="incidents")
    op.drop_index("ix_incidents_job_id", table_name="incidents")
    op.drop_table("incidents")
    op.drop_table("comms")
    op.drop_table("ranks")
    op.drop_table("agent_streams")
    op.drop_table("hosts")
    op.drop_table("jobs")
