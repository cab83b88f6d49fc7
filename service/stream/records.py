"""What the event-time core takes in: an envelope whose records are still raw, the validated
records, and the reasons a record is rejected (a code for metrics, words for the client)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

from failslow.detectors.vocab import CommKind, Op


class Reject(StrEnum):
    """Why one record was rejected: a bounded label (metrics carry these, never free text)."""

    END_BEFORE_START = "end_before_start"
    NEGATIVE_BYTES = "negative_bytes"
    UNKNOWN_OP = "unknown_op"
    MISSING_PEER = "missing_peer"
    BAD_PEER = "bad_peer"
    NOT_MEMBER = "not_member"
    UNKNOWN_COMM = "unknown_comm"
    CONFLICT = "conflict"
    WRONG_HOST = "wrong_host"
    LIMIT = "limit"
    INVALID = "invalid"


class Outcome(Enum):
    """What became of one accepted record."""

    NEW = "new"
    COMPLETED = "completed"  # an in-flight record got its end_ns
    DUPLICATE = "duplicate"


class RecordKind(StrEnum):
    """The records an envelope carries that are counted (announcements are not)."""

    COLLECTIVE = "collective"
    STEP = "step"


class RecordError(ValueError):
    """One record breaks a rule: ``code`` says which kind of rule, the message is the reason
    reported to the client."""

    def __init__(self, code: Reject, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class Envelope:
    """A structurally valid envelope (one host's records for one job) whose records are still
    raw: each is validated on its own, so that one bad record rejects only itself."""

    job: str
    host: str
    sent_ns: int
    agent: str | None
    batch_seq: int | None
    ranks: list[Any] = field(default_factory=list)
    comms: list[Any] = field(default_factory=list)
    collectives: list[Any] = field(default_factory=list)
    steps: list[Any] = field(default_factory=list)
    # what the instrumentation vouches for (docs/ingest-v1.md, "Completeness"); None: nothing
    complete_ns: int | None = None
    inflight_after_ns: int | None = None

    @property
    def record_count(self) -> int:
        return len(self.collectives) + len(self.steps)


@dataclass(frozen=True, slots=True)
class CollectiveRecord:
    rank: int
    comm: str
    seq: int
    op: Op
    nbytes: int
    start_ns: int
    end_ns: int | None
    peer: int | None


@dataclass(frozen=True, slots=True)
class StepRecord:
    rank: int
    step: int
    start_ns: int
    end_ns: int
    work: float = float("nan")  # the step's work on the rank (tokens, samples); NaN: not said


@dataclass(frozen=True, slots=True)
class RankAnnouncement:
    rank: int
    gpu: int | None
    world_size: int | None


@dataclass(frozen=True, slots=True)
class CommAnnouncement:
    comm: str
    kind: CommKind
    ranks: tuple[int, ...]
