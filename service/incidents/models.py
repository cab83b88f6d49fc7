"""The incidents table: persistent conditions with their evidence."""

from __future__ import annotations

from enum import StrEnum

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from failslow.service.db import Base


class IncidentState(StrEnum):
    OPEN = "open"
    RESOLVED = "resolved"


class IncidentResolution(StrEnum):
    """How a resolved incident ended (``evidence.resolution.closed_as``)."""

    RECOVERED = "recovered"  # the data showed the condition gone
    MANUAL = "manual"  # an operator resolved it, with a reason
    STALE = "stale"  # its job stopped reporting


class Incident(Base):
    __tablename__ = "incidents"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    job_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(String(32))
    subject: Mapped[str] = mapped_column(String(512))
    state: Mapped[str] = mapped_column(String(16))
    ranks: Mapped[list[int]] = mapped_column(JSON)
    hosts: Mapped[list[str]] = mapped_column(JSON)
    slowdown: Mapped[float | None] = mapped_column(Float)
    subject_slowdown: Mapped[float | None] = mapped_column(Float)
    confidence: Mapped[float] = mapped_column(Float)
    severity: Mapped[str] = mapped_column(String(16), default="major", server_default="major")
    onset_ns: Mapped[int] = mapped_column(BigInteger)
    detected_ns: Mapped[int] = mapped_column(BigInteger)
    resolved_ns: Mapped[int | None] = mapped_column(BigInteger)
    onset_step: Mapped[int | None] = mapped_column(Integer)
    detected_step: Mapped[int | None] = mapped_column(Integer)
    resolved_step: Mapped[int | None] = mapped_column(Integer)
    summary: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict[str, object]] = mapped_column(JSON)
    updated_ns: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        # One open incident per (job, kind, subject), enforced by the database so that two
        # service processes on one database cannot both open it.
        Index(
            "uq_incidents_open_subject",
            "job_id",
            "kind",
            "subject",
            unique=True,
            sqlite_where=(state == IncidentState.OPEN.value),
            postgresql_where=(state == IncidentState.OPEN.value),
        ),
    )
