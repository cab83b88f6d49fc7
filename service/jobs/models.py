"""Tables for job topology, ingest accounting and compact per-rank history."""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from failslow.service.db import Base

ID = String(128)


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    world_size: Mapped[int | None] = mapped_column(Integer)
    first_seen_ns: Mapped[int] = mapped_column(BigInteger)
    last_seen_ns: Mapped[int] = mapped_column(BigInteger)
    watermark_ns: Mapped[int] = mapped_column(BigInteger)
    last_step: Mapped[int | None] = mapped_column(Integer)
    step_time_s: Mapped[float | None] = mapped_column(Float)
    baseline_step_time_s: Mapped[float | None] = mapped_column(Float)


class Host(Base):
    """One reporting node of a job, with durable ingest counters (what was accepted, ever)."""

    __tablename__ = "hosts"

    job_id: Mapped[str] = mapped_column(
        ID, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    host: Mapped[str] = mapped_column(ID, primary_key=True)
    first_seen_ns: Mapped[int] = mapped_column(BigInteger)
    last_seen_ns: Mapped[int] = mapped_column(BigInteger)
    envelopes: Mapped[int] = mapped_column(BigInteger, default=0)
    records_accepted: Mapped[int] = mapped_column(BigInteger, default=0)
    records_duplicate: Mapped[int] = mapped_column(BigInteger, default=0)
    records_rejected: Mapped[int] = mapped_column(BigInteger, default=0)


class AgentStream(Base):
    """Highest envelope sequence number accepted from one agent: makes re-sends exact no-ops."""

    __tablename__ = "agent_streams"

    job_id: Mapped[str] = mapped_column(
        ID, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    host: Mapped[str] = mapped_column(ID, primary_key=True)
    agent: Mapped[str] = mapped_column(ID, primary_key=True)
    last_batch_seq: Mapped[int] = mapped_column(BigInteger)
    updated_ns: Mapped[int] = mapped_column(BigInteger)


class HostRegistration(Base):
    """A host's v2 topology registration (docs/ingest-v2.md section 1), kept so that a restarted
    service resolves the digests its agents' envelopes name without making every host register
    again. The newest few per host, as the service keeps them in memory."""

    __tablename__ = "host_registrations"

    job_id: Mapped[str] = mapped_column(
        ID, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    host: Mapped[str] = mapped_column(ID, primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    registered: Mapped[int] = mapped_column(BigInteger)  # order of registration (ns)
    body: Mapped[bytes] = mapped_column(LargeBinary)  # the canonical JSON


class Rank(Base):
    __tablename__ = "ranks"

    job_id: Mapped[str] = mapped_column(
        ID, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(ID)
    gpu: Mapped[int | None] = mapped_column(Integer)


class Comm(Base):
    __tablename__ = "comms"

    job_id: Mapped[str] = mapped_column(
        ID, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    comm: Mapped[str] = mapped_column(ID, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    ranks: Mapped[list[int]] = mapped_column(JSON)


class RankHistoryBucket(Base):
    """Per bucket of ``history_every_steps`` steps, every rank's means of the per-step signals,
    as compressed columns (``jobs.history``): one row per bucket, not per rank."""

    __tablename__ = "rank_history_buckets"

    job_id: Mapped[str] = mapped_column(
        ID, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    end_ns: Mapped[int] = mapped_column(BigInteger)
    ranks: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class JobHistory(Base):
    """Per job, per bucket of steps: step-time statistics and the slowdown then."""

    __tablename__ = "job_history"

    job_id: Mapped[str] = mapped_column(
        ID, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    steps: Mapped[int] = mapped_column(Integer)
    end_ns: Mapped[int] = mapped_column(BigInteger)
    step_time_s: Mapped[float | None] = mapped_column(Float)
    step_time_max_s: Mapped[float | None] = mapped_column(Float)
    slowdown: Mapped[float | None] = mapped_column(Float)
