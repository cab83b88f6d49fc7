"""What the hang detector (:mod:`.hang`) is given and what it finds: the blocked collectives, the
job's hosts and ranks as the service last heard of them, and a finding with its roots."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

# the least floor a vouched in-flight delay gives (clock granularity, an agent's scheduling)
MIN_VOUCHED_FLOOR_S = 0.05


def vouched_floor_s(
    hosts: Collection[str], host_vouch: Mapping[str, tuple[int, float]]
) -> float | None:
    """Where every one of ``hosts`` vouches for what it sent: the longest in-flight delay they
    announced, at least ``MIN_VOUCHED_FLOOR_S`` (a collective blocked that long has its missing
    members judged by their quiet, as vouched for); None where one does not."""
    if not hosts or any(h not in host_vouch for h in hosts):
        return None
    return max(MIN_VOUCHED_FLOOR_S, max(host_vouch[h][1] for h in hosts))


@dataclass(frozen=True, slots=True)
class BlockedCollective:
    comm: str
    seq: int
    members: tuple[int, ...]  # ranks, in comm order
    started: tuple[int | None, ...]  # start_ns per member (None: never arrived)
    ended: tuple[int | None, ...]  # end_ns per member (None: still inside, or never arrived)
    typical_s: float  # usual duration of this communicator's collectives (NaN if unknown)
    seen_ns: int = 0  # event time at which the service first heard of it
    progress_ns: int = 0  # newest step end of any of its members (they moved on: not a hang)


@dataclass(frozen=True, slots=True)
class HangSnapshot:
    now_ns: int  # event-time now (newest envelope)
    blocked: tuple[BlockedCollective, ...]
    host_of_rank: dict[int, str]
    host_last_ns: dict[str, int]
    last_progress_ns: int  # end of the newest completed step or collective
    step_time_s: float  # usual step time (NaN if unknown)
    # per rank: end of its newest completed collective or step (event time); absent: none known
    rank_last_end: Mapping[int, int] = field(default_factory=dict)
    # per rank: its longest recent gap between two completed calls (s); absent: too few seen
    rank_gap_s: Mapping[int, float] = field(default_factory=dict)
    # how soon the job's instrumentation reports a call in flight, as measured (s; None: no
    # in-flight record seen yet): the floor of the suspect and quiet timeouts where longer
    inflight_after_s: float | None = None
    # per host whose instrumentation vouches for it (docs/ingest-v1.md, "Completeness"):
    # (complete_ns, inflight_after_s): every call of its ranks that ended by complete_ns was
    # sent, every call begun inflight_after_s before it and not ended was sent in flight
    host_vouch: Mapping[str, tuple[int, float]] = field(default_factory=dict)

    @property
    def vouched_floor_s(self) -> float | None:
        """Where every host of the job vouches for what it sent, the longest delay announced
        (:func:`vouched_floor_s`); None where one does not."""
        return vouched_floor_s(self.host_last_ns.keys(), self.host_vouch)


@dataclass(frozen=True, slots=True)
class HangFinding:
    roots: tuple[int, ...]
    hosts: tuple[str, ...]
    onset_ns: int
    detected_ns: int  # first event time at which the evidence sufficed (replay-speed independent)
    reason: str
    evidence: dict[str, object] = field(default_factory=dict)


__all__ = [
    "MIN_VOUCHED_FLOOR_S",
    "BlockedCollective",
    "HangFinding",
    "HangSnapshot",
    "vouched_floor_s",
]
