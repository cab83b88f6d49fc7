"""The tables of runtime control: one row of control per job, and the audit trail of every
operator change (control, incident resolutions, action decisions)."""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Boolean, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from failslow.service.db import Base


class JobControl(Base):
    """What operators set for a job. No foreign key to ``jobs``: a job may be muted or tuned
    before it first reports."""

    __tablename__ = "job_controls"

    job_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    muted_until_ns: Mapped[int | None] = mapped_column(BigInteger)  # wall clock; None: not muted
    mute_reason: Mapped[str | None] = mapped_column(Text)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    pause_reason: Mapped[str | None] = mapped_column(Text)
    # [{"id", "start_ns", "end_ns", "reason", "by"}]: detection paused and nothing done within
    windows: Mapped[list[dict[str, object]]] = mapped_column(JSON, default=list)
    overrides: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)  # declared keys only
    updated_ns: Mapped[int] = mapped_column(BigInteger)
    updated_by: Mapped[str] = mapped_column(String(128))


class AuditEvent(Base):
    """One operator change: who (from the token), what, to which job or object, why."""

    __tablename__ = "audit_events"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # sortable by time
    at_ns: Mapped[int] = mapped_column(BigInteger)
    actor: Mapped[str] = mapped_column(String(128))
    verb: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str | None] = mapped_column(String(128))
    target: Mapped[str | None] = mapped_column(String(128))  # an incident, an action, a key
    reason: Mapped[str] = mapped_column(Text)
    detail: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)

    __table_args__ = (Index("ix_audit_events_job", "job_id", "id"),)
