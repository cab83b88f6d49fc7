"""What the hang detector (:mod:`.hang`) is given and what it finds: the blocked collectives, the
job's hosts and ranks as the service last heard of them, and a finding with its roots."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

# the least floor a vouched in-flight delay gives (clock granularity, an agent's scheduling)
MIN_VOUCHED_FLOOR_S = 0.05
# the measured delivery lag is the longest seen; a floor from it is this much longer
LAG_MARGIN = 1.25
# a host silent for this many times its longest recent gap between envelopes, and at least
# this long, has stopped (the lab's agents, flushing every 0.5 s and skipping empty batches,
# went 1.5 s between envelopes while healthy, and so did one whose CPU was starved)
SILENCE_FACTOR = 2.0
MIN_SILENCE_S = 2.0


def measured_floor_s(
    floor_s: float, delivery_lag_s: float | None, inflight_after_s: float | None,
    reorder_s: float = 0.0,
) -> float:  # fmt: skip
    """The floor of the suspect and quiet timeouts as the job's own data sets it: the configured
    ``floor_s``, lowered to the measured delivery lag of completions where known (how long a
    call that ended may stay out of what its host sent: ``LAG_MARGIN`` times the longest seen,
    at least ``MIN_VOUCHED_FLOOR_S``), and never below the measured in-flight report delay
    plus how far envelopes arrived behind their host's newer ones (a rank absent for less than
    that after its last completion may be inside a call not reported yet)."""
    floor = floor_s
    if delivery_lag_s is not None:
        floor = min(floor, max(MIN_VOUCHED_FLOOR_S, LAG_MARGIN * delivery_lag_s))
    if inflight_after_s is not None:
        floor = max(floor, inflight_after_s + reorder_s)
    return floor


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

    def waiting_since(self) -> int:
        """When the wait began: the first member's entry; once some members completed it,
        their completion (a member still inside after that is stuck, but only once its own end
        record, which may merely lag its peers', is overdue)."""
        ends = [e for e in self.ended if e is not None]
        if ends:
            return max(ends)
        return min(s for s in self.started if s is not None)


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
    # how long a completed call may stay out of what its host sent, as measured (s; None: too
    # few envelopes yet), and how far an envelope arrived behind its host's newer ones (s)
    delivery_lag_s: float | None = None
    reorder_s: float = 0.0
    # per host: its longest recent gap between two envelopes and the furthest behind "now" one
    # arrived past the least one did (s: a relay's, a late agent's; the least is its clock's
    # offset, by which every time of the host here is already moved on); absent: too few seen
    host_cadence_s: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def vouched_floor_s(self) -> float | None:
        """Where every host of the job vouches for what it sent, the longest delay announced
        (:func:`vouched_floor_s`); None where one does not."""
        return vouched_floor_s(self.host_last_ns.keys(), self.host_vouch)

    def reported_since(self, rank: int, t_ns: int, floor_s: float) -> bool:
        """Has ``rank``'s host sent what the rank completed at ``t_ns``, a collective its peers
        (on other hosts' clocks) completed then: an envelope more than ``floor_s`` (the job's
        measured delivery floor) after it. Not what the host vouched for: that is as late as
        its envelope, and a margin smaller than the floor is within the error of moving one
        host's clock onto another's (a batch: 5x stragglers' peers were named stuck). Before,
        the rank has merely not said yet that it completed it too."""
        heard = self.host_last_ns.get(self.host_of_rank.get(rank, ""))
        return heard is not None and (heard - t_ns) / 1e9 > floor_s


@dataclass(frozen=True, slots=True)
class HangFinding:
    roots: tuple[int, ...]
    hosts: tuple[str, ...]
    onset_ns: int
    detected_ns: int  # first event time at which the evidence sufficed (replay-speed independent)
    reason: str
    evidence: dict[str, object] = field(default_factory=dict)


__all__ = [
    "LAG_MARGIN",
    "MIN_SILENCE_S",
    "MIN_VOUCHED_FLOOR_S",
    "SILENCE_FACTOR",
    "BlockedCollective",
    "HangFinding",
    "HangSnapshot",
    "measured_floor_s",
    "vouched_floor_s",
]
