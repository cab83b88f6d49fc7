"""The fleet ledger's tables: hardware parts, per-job readings, incident marks, inventories.

Bounded by construction: one reading per part per job (at most ``max_jobs_per_part``, older
ones pooled into one archive row), one mark per incident per part (old, decayed marks dropped,
their totals kept on the part), one inventory per host.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from sqlalchemy import JSON, BigInteger, Boolean, Float, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from failslow.service.db import Base

ARCHIVE = "(archive)"  # the job id of a part's pooled old readings
IN_CHUNK = 500  # values per SQL IN list (SQLite's bound-parameter limit, with room)


def in_chunks(values: Sequence[str]) -> Iterator[Sequence[str]]:
    """``values`` in slices short enough for one ``IN (...)``."""
    for i in range(0, len(values), IN_CHUNK):
        yield values[i : i + IN_CHUNK]


class FleetPart(Base):
    """One host, GPU or NIC, its standing and its health as last computed."""

    __tablename__ = "fleet_parts"

    part_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))  # PartKind
    host: Mapped[str] = mapped_column(String(128))  # where it was last seen
    label: Mapped[str] = mapped_column(String(200))  # device index, PCI id, NIC name
    id_source: Mapped[str | None] = mapped_column(String(8))  # IdSource (GPUs)
    first_seen_ns: Mapped[int] = mapped_column(BigInteger)
    last_seen_ns: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))  # PartState
    state_since_ns: Mapped[int] = mapped_column(BigInteger)
    state_reason: Mapped[str] = mapped_column(Text, default="")
    clean_s: Mapped[float] = mapped_column(Float, default=0.0)  # observed clean since state
    clean_jobs: Mapped[list[str]] = mapped_column(JSON, default=list)
    jobs_total: Mapped[int] = mapped_column(Integer, default=0)
    incidents_total: Mapped[int] = mapped_column(Integer, default=0)
    lost_s_total: Mapped[float] = mapped_column(Float, default=0.0)
    health: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    flagged: Mapped[bool] = mapped_column(Boolean, default=False)
    cost_s: Mapped[float] = mapped_column(Float, default=0.0)

    __table_args__ = (Index("ix_fleet_parts_kind", "kind", "cost_s"),)


class FleetReading(Base):
    """What one job saw of one part's speed: pooled per-frame log compute ratios."""

    __tablename__ = "fleet_readings"

    part_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    n: Mapped[int] = mapped_column(Integer)
    mean: Mapped[float] = mapped_column(Float)
    var: Mapped[float] = mapped_column(Float)
    observed_s: Mapped[float] = mapped_column(Float)
    first_ns: Mapped[int] = mapped_column(BigInteger)
    last_ns: Mapped[int] = mapped_column(BigInteger)
    # job time the part's own slowness cost there, as measured (a NIC's passive readings)
    lost_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")


class FleetMark(Base):
    """One incident that named a part, with the job time it cost."""

    __tablename__ = "fleet_marks"

    incident_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    part_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32))
    severity: Mapped[str] = mapped_column(String(16))
    at_ns: Mapped[int] = mapped_column(BigInteger)
    lost_s: Mapped[float] = mapped_column(Float)
    hard: Mapped[bool] = mapped_column(Boolean)
    final: Mapped[bool] = mapped_column(Boolean)  # the incident is resolved: no more updates

    __table_args__ = (Index("ix_fleet_marks_part", "part_id", "at_ns"),)


class HostInventory(Base):
    """What a node agent reported a host runs on: GPUs by local index, NICs."""

    __tablename__ = "fleet_inventory"

    host: Mapped[str] = mapped_column(String(128), primary_key=True)
    # [{"index", "uuid", "pci_bus_id", "name"}], [{"name", "address", "kind"}]
    gpus: Mapped[list[dict[str, object]]] = mapped_column(JSON, default=list)
    nics: Mapped[list[dict[str, object]]] = mapped_column(JSON, default=list)
    reported_ns: Mapped[int] = mapped_column(BigInteger)
    note: Mapped[str] = mapped_column(Text, default="")  # how the agent read it


class QualRun(Base):
    """A qualification (docs/fleet.md): shared by every replica through the database, so an
    agent may poll one replica and an operator read another."""

    __tablename__ = "fleet_qualifications"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    created_ns: Mapped[int] = mapped_column(BigInteger)  # wall clock: replicas share it
    deadline_ns: Mapped[int] = mapped_column(BigInteger)
    nbytes: Mapped[int] = mapped_column(Integer)
    iterations: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(8))  # RunState
    done_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    __table_args__ = (Index("ix_fleet_qualifications_state", "state", "deadline_ns"),)


class QualHost(Base):
    """One host of a qualification: its agent's endpoint, what the ledger held against it, and
    its verdict once judged (``slow_link``: the reason it is no-go for its link; ``slow_gpus``:
    its GPUs found slow). ``marked``: the ledger has taken its checks (a reading of its NIC,
    marks on what was slow)."""

    __tablename__ = "fleet_qualification_hosts"

    run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    host: Mapped[str] = mapped_column(String(128), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)  # its place in the ring, as asked
    addr: Mapped[str | None] = mapped_column(String(128), nullable=True)
    seen: Mapped[bool] = mapped_column(Boolean, default=False)
    standing: Mapped[list[str]] = mapped_column(JSON, default=list)
    verdict: Mapped[str | None] = mapped_column(String(8), nullable=True)  # Verdict once judged
    reasons: Mapped[list[str]] = mapped_column(JSON, default=list)
    compute_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    link_bps: Mapped[float | None] = mapped_column(Float, nullable=True)
    link_norm: Mapped[float | None] = mapped_column(Float, nullable=True)
    link_pairs: Mapped[int] = mapped_column(Integer, default=0)
    slow_link: Mapped[str | None] = mapped_column(Text, nullable=True)
    # its GPUs found slow, [{"index", "uuid"}] (NULL: none)
    slow_gpus: Mapped[list[dict[str, object]] | None] = mapped_column(
        JSON(none_as_null=True), nullable=True
    )
    marked: Mapped[bool] = mapped_column(Boolean, default=False)

    __table_args__ = (
        Index("ix_fleet_qualification_hosts_host", "host"),
        Index("ix_fleet_qualification_hosts_unmarked", "marked", "link_bps"),
    )


class QualTask(Base):
    """One check an agent runs: handed out once (a conditional update), answered once."""

    __tablename__ = "fleet_qualification_tasks"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40))
    host: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(8))  # TaskKind
    peer: Mapped[str | None] = mapped_column(String(128), nullable=True)
    handed: Mapped[bool] = mapped_column(Boolean, default=False)
    # {"seconds", "device", "gpus"} or {"bps", "up_bps", "down_bps"} or {"error"}
    result: Mapped[dict[str, object] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (Index("ix_fleet_qualification_tasks_run", "run_id", "host"),)


class QualNorm(Base):
    """One passing host's measurement (one per GPU on GPU nodes), for the fleet norm: the newest
    ``Norms.keep`` per kind and model."""

    __tablename__ = "fleet_qualification_norms"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(8))  # TaskKind
    # what was measured ("cuda: <GPU model>", "cpu: <CPU model>"; "" for links and unnamed)
    model: Mapped[str] = mapped_column(String(200), default="", server_default="")
    value: Mapped[float] = mapped_column(Float)
    at_ns: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_fleet_qualification_norms_kind_model", "kind", "model", "id"),)
