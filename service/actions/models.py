"""Tables of the actions domain: actions with their state, and the audit trail of every change."""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from failslow.service.db import Base


class Action(Base):
    """One decided action. Written (state ``proposed``) before anything is executed."""

    __tablename__ = "actions"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    job_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    incident_id: Mapped[str | None] = mapped_column(String(40), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(String(512))
    state: Mapped[str] = mapped_column(String(16), index=True)
    mode: Mapped[str] = mapped_column(String(8))  # auto | manual
    reason: Mapped[str] = mapped_column(Text)
    params: Mapped[dict[str, object]] = mapped_column(JSON)
    actuator: Mapped[str] = mapped_column(String(32))
    dry_run: Mapped[bool] = mapped_column(default=False)
    result: Mapped[dict[str, object] | None] = mapped_column(JSON)
    outcome: Mapped[dict[str, object] | None] = mapped_column(JSON)
    # One action per (incident, rung, target): a second decision (another process, a retry)
    # cannot create a duplicate.
    idempotency_key: Mapped[str] = mapped_column(String(600), unique=True)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    updated_ns: Mapped[int] = mapped_column(BigInteger)
    decided_event_ns: Mapped[int] = mapped_column(BigInteger)  # job event time of the decision
    executed_ns: Mapped[int | None] = mapped_column(BigInteger)
    decided_by: Mapped[str | None] = mapped_column(String(128))


class ActionEvent(Base):
    """Audit trail: one row per state change, with who made it and why."""

    __tablename__ = "action_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    action_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("actions.id", ondelete="CASCADE"), index=True
    )
    at_ns: Mapped[int] = mapped_column(BigInteger)
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(128))
    note: Mapped[str] = mapped_column(Text)
