"""The domain's vocabulary, defined once: communicator kinds, collective ops, incident kinds,
finding statuses and the typed subject of a condition.

Everything else (the wire format, SQL rows, REST schemas, metrics) uses these names. ``StrEnum``
members are ``str``: they compare equal to, hash like, and serialise as their values.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class CommKind(StrEnum):
    """What a communicator is for (the ``kind`` of ``comms[]`` on the wire)."""

    DP = "dp"  # data parallel
    TP = "tp"  # tensor parallel
    PP = "pp"  # pipeline parallel (send/recv between stages)
    EP = "ep"  # expert parallel (MoE)
    CP = "cp"  # context parallel
    WORLD = "world"
    OTHER = "other"  # anything else (embedding groups, ...)
    P2P = "p2p"  # a two-member point-to-point channel


class Op(StrEnum):
    """Canonical collective and point-to-point operations."""

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALLTOALL = "alltoall"
    BARRIER = "barrier"
    SEND = "send"
    RECV = "recv"


P2P_OPS = frozenset({Op.SEND, Op.RECV})


class IncidentKind(StrEnum):
    """The conditions failslow finds."""

    SLOW_GPU = "slow_gpu"  # one rank's compute is slow
    SLOW_NODE = "slow_node"  # most ranks of one host are slow
    SLOW_LINK = "slow_link"  # a host's NIC or a cable between two hosts is slow
    HANG = "hang"  # collectives stopped making progress
    JOB_SLOWDOWN = "job_slowdown"  # the whole job slowed with no single culprit


COMPUTE_KINDS = frozenset({IncidentKind.SLOW_GPU, IncidentKind.SLOW_NODE})
SLOW_KINDS = frozenset(
    {
        IncidentKind.SLOW_GPU,
        IncidentKind.SLOW_NODE,
        IncidentKind.SLOW_LINK,
        IncidentKind.JOB_SLOWDOWN,
    }
)


class Severity(StrEnum):
    """How much an incident costs the job (docs/mitigation.md: the policy acts from MAJOR)."""

    MINOR = "minor"  # the job loses less than a few percent: watch, notify
    MAJOR = "major"  # a real share of the job's time is lost
    CRITICAL = "critical"  # the job crawls or stands still (a hang)

    @property
    def rank(self) -> int:
        return _SEVERITY_ORDER[self]


_SEVERITY_ORDER = {Severity.MINOR: 0, Severity.MAJOR: 1, Severity.CRITICAL: 2}


class FindingStatus(StrEnum):
    """What a finding says about its condition."""

    OPENED = "opened"
    UPDATED = "updated"
    RESOLVED = "resolved"


class SubjectKind(StrEnum):
    SLOT = "slot"  # a rank slot (detectors' dense rank index)
    RANK = "rank"  # global ranks (how the service names a slow GPU)
    HOST = "host"  # a host (a slow node; a slow NIC)
    LINK = "link"  # one or more host pairs (a cable; ambiguous candidates)
    JOB = "job"  # the job as a whole (a job slowdown, a hang)


@dataclass(frozen=True, slots=True)
class Subject:
    """Who a condition is about. ``str()`` gives the stored form (``"host:node-3"``,
    ``"link:a|b,c|d"``, ``"rank:12"``, ``"job"``); :meth:`parse` reads it back."""

    kind: SubjectKind
    key: str = ""

    def __str__(self) -> str:
        return self.kind.value if self.kind is SubjectKind.JOB else f"{self.kind.value}:{self.key}"

    @staticmethod
    def job() -> Subject:
        return Subject(SubjectKind.JOB)

    @staticmethod
    def slot(slot: int) -> Subject:
        return Subject(SubjectKind.SLOT, str(int(slot)))

    @staticmethod
    def ranks(ranks: list[int] | tuple[int, ...]) -> Subject:
        return Subject(SubjectKind.RANK, ",".join(str(int(r)) for r in ranks))

    @staticmethod
    def host(host: str) -> Subject:
        return Subject(SubjectKind.HOST, host)

    @staticmethod
    def link(pairs: tuple[tuple[str, str], ...]) -> Subject:
        return Subject(SubjectKind.LINK, ",".join(f"{a}|{b}" for a, b in pairs))

    @property
    def slot_index(self) -> int:
        if self.kind is not SubjectKind.SLOT:
            raise ValueError(f"{self} is not a rank slot")
        return int(self.key)

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        if self.kind is not SubjectKind.LINK:
            return ()
        return tuple(tuple(p.split("|", 1)) for p in self.key.split(",") if "|" in p)  # type: ignore[misc]

    @staticmethod
    def parse(text: str) -> Subject:
        """The subject stored as ``text``; raises ValueError for anything else."""
        if text == SubjectKind.JOB.value:
            return Subject.job()
        kind, sep, key = text.partition(":")
        if not sep or not key:
            raise ValueError(f"not a subject: {text!r}")
        return Subject(SubjectKind(kind), key)
