"""Tables of the plans domain: every published version of a job's execution plan."""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from failslow.service.db import Base


class PlanVersion(Base):
    """One version of a job's plan (versions only grow; the newest is the current plan)."""

    __tablename__ = "plans"

    job_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    body: Mapped[dict[str, object]] = mapped_column(JSON)
    reason: Mapped[str] = mapped_column(Text)
    # The action that published it: unique, so re-executing one action cannot publish twice.
    action_id: Mapped[str | None] = mapped_column(String(40), unique=True)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    # The training job's acknowledgement: the step from which it runs this version.
    applied_step: Mapped[int | None] = mapped_column(Integer)
    applied_ns: Mapped[int | None] = mapped_column(BigInteger)


class JobWorkload(Base):
    """What the training job declared about itself (for rebalancing): the global batch."""

    __tablename__ = "job_workloads"

    job_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    global_batch: Mapped[int] = mapped_column(Integer)
    unit: Mapped[str] = mapped_column(String(32))
    updated_ns: Mapped[int] = mapped_column(BigInteger)
