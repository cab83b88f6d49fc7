"""Bounds on a job's in-memory event-time state (``FAILSLOW_STATE__*``)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field


class StateSettings(BaseModel):
    """Bounds on per-job in-memory state. See docs/memory.md for the arithmetic.

    The ``max_*`` bounds marked *floor* grow with the job: once its world size is declared (in
    a rank announcement), a bound is the larger of the floor and ``*_per_rank`` x world size.
    """

    retention_s: float = Field(
        default=300.0, gt=0, description="Event-time window kept for assembly and idempotency."
    )
    max_pending_collectives: int = Field(
        default=200_000, gt=0, description="Per job (floor): collectives being assembled at once."
    )
    pending_per_rank: float = Field(
        default=16.0, ge=0, description="Per rank: collectives being assembled at once."
    )
    max_done_collectives: int = Field(
        default=200_000,
        gt=0,
        description="Per job (floor): v1 member records remembered to answer re-sends.",
    )
    done_per_rank: float = Field(
        default=8.0, ge=0, description="Per rank: v1 member records remembered for re-sends."
    )
    max_open_frames: int = Field(
        default=64, gt=0, description="Per job: steps (frames) being assembled at once."
    )
    max_ranks: int = Field(default=1_000_000, gt=0, description="Per job: largest world size.")
    max_comms: int = Field(
        default=100_000, gt=0, description="Per job (floor): most communicators."
    )
    comms_per_rank: float = Field(
        default=4.0, ge=0, description="Per rank: communicators (TP, DP, PP pairs, EP, CP...)."
    )
    max_comm_members: int = Field(
        default=250_000,
        gt=0,
        description="Per job (floor): members of all communicators together (~100 B each).",
    )
    members_per_rank: float = Field(
        default=64.0, ge=0, description="Per rank: communicator memberships, all comms together."
    )
    max_total_comm_members: int = Field(
        default=10_000_000,
        gt=0,
        description="All jobs in memory together: communicator memberships (~215 B each, so "
        "~2.1 GB by default; a 100K-rank TP8 x PP4 job holds ~400K); past it new communicators "
        "are refused with this reason.",
    )
    max_jobs: int = Field(default=1_000, gt=0, description="Jobs held in memory at once.")
    tenant_share: float = Field(
        default=0.5, gt=0, le=1,
        description="The most of max_jobs and of max_total_comm_members that the jobs of one "
        "tenant (the jobs a scoped ingest token may send for, auth.ingest_scopes) may hold: "
        "one tenant cannot crowd the others out. Jobs of no scope share the rest.",
    )  # fmt: skip
    frame_grace_s: float = Field(
        default=5.0,
        ge=0,
        description="Event time after a step's last record before it is closed with missing ranks.",
    )
    clock_tolerance_s: float = Field(
        default=2.0,
        gt=0,
        description="How far one host's sent_ns may run ahead of the median of the job's live "
        "hosts before it stops moving the job's event time (docs/event-time.md).",
    )
    clock_live_s: float = Field(
        default=10.0,
        gt=0,
        description="Wall time after its last envelope during which a host still votes on the "
        "job's event time.",
    )
    snapshot_every_s: float = Field(
        default=60.0,
        ge=0,
        description="Without a bus: how often (at most) each job's state and detector state are "
        "written with its counters, and always at shutdown, so that a restart resumes detection "
        "where it was (0: never; with a bus, FAILSLOW_BUS__SNAPSHOT_EVERY_S applies). Taking one "
        "holds the job while it is pickled: 0.11 s for bench/v2_core.py's 10K-rank state; "
        "0.3-0.6 s at 10K ranks and ~3.4 s at 100K before ranks, hosts and comms were pickled "
        "by position (docs/replicas.md).",
    )
    shards: int = Field(
        default=0,
        ge=0,
        le=64,
        description="Shard processes per large job (0: none, every job in the process that owns "
        "it): the join and frame sums of a job of at least shard_min_ranks ranks run in this "
        "many processes besides its owner, by communicator (docs/ingest-v2.md, One job across "
        "processes). 1 already moves the join off the owner's core.",
    )
    shard_min_ranks: int = Field(
        default=4096,
        ge=1,
        description="Fewest ranks shown (announced or registered) of a job that is sharded "
        "(when shards > 0).",
    )
    shard_timeout_s: float = Field(
        default=5.0, gt=0,
        description="The longest the owner waits for one of a job's shard processes (an "
        "answer, room in its pipe or ring); past it the shard counts as failed and the job's "
        "shards start again (docs/hardening.md).",
    )  # fmt: skip
    time_frame_s: float = Field(
        default=1.0, gt=0, description="Frame length for jobs that send no step records."
    )
    stale_after_s: float = Field(
        default=30.0, gt=0, description="A host with no envelope for this long is stale."
    )
    evict_after_s: float = Field(
        default=6 * 3600.0, gt=0, description="Wall time after which an idle job leaves memory."
    )


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one job of ``world`` ranks (None: not declared yet, the floors apply)."""

    comms: int
    comm_members: int
    pending: int
    done: int

    @staticmethod
    def shown(settings: StateSettings, ranks: int) -> Limits:
        """The bounds of a job that has shown ``ranks`` ranks (at most ``max_ranks`` count)."""
        return Limits.of(settings, min(ranks, settings.max_ranks) or None)

    @staticmethod
    def of(settings: StateSettings, world: int | None) -> Limits:
        w = world or 0
        return Limits(
            comms=max(settings.max_comms, int(settings.comms_per_rank * w)),
            comm_members=max(settings.max_comm_members, int(settings.members_per_rank * w)),
            pending=max(settings.max_pending_collectives, int(settings.pending_per_rank * w)),
            done=max(settings.max_done_collectives, int(settings.done_per_rank * w)),
        )
