"""Tables of the replicas: each partition's owner and stream position, each job's snapshot."""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from failslow.service.db import Base


class BusPartition(Base):
    """One row per partition: who may write it (``epoch``, the fencing token: the revision of
    the owner's claim in NATS, rising with every new owner) and how far it is applied."""

    __tablename__ = "bus_partitions"

    partition: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    owner: Mapped[str] = mapped_column(String(300))
    epoch: Mapped[int] = mapped_column(BigInteger)
    position: Mapped[int] = mapped_column(BigInteger)  # every message <= it is committed
    updated_ns: Mapped[int] = mapped_column(BigInteger)


class JobSnapshot(Base):
    """A job's state as of stream message ``snapshot_seq``, and how far its counters are
    committed (``committed_seq`` >= ``snapshot_seq``)."""

    __tablename__ = "job_snapshots"

    job: Mapped[str] = mapped_column(String(128), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, index=True)
    committed_seq: Mapped[int] = mapped_column(BigInteger)
    snapshot_seq: Mapped[int] = mapped_column(BigInteger)
    taken_ns: Mapped[int] = mapped_column(BigInteger)
    body: Mapped[bytes] = mapped_column(LargeBinary)
