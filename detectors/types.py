"""Value objects shared by detectors and their callers."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from failslow.detectors.vocab import CommKind

# Columns of per-kind arrays, in CommKind's order. ``p2p`` holds every send/recv, whatever its
# comm's kind.
KINDS: tuple[CommKind, ...] = tuple(CommKind)
KIND_INDEX: dict[str, int] = {k: i for i, k in enumerate(KINDS)}
P2P = KIND_INDEX[CommKind.P2P]
# Communicators that carry send/recv: our SDK announces a pipeline's channels as ``p2p``, other
# instrumentation (Megatron's process groups, an NCCL-level tracer) as ``pp``; both are timed the
# same way, so every rule about p2p timing holds for both (issue 32)
SEND_RECV_KINDS = np.array([P2P, KIND_INDEX[CommKind.PP]], dtype=np.int64)
WORLD = KIND_INDEX[CommKind.WORLD]


@dataclass(frozen=True, slots=True)
class Frame:
    """One step of a job (or one time bucket when no step records exist), per rank slot.

    Every array has one entry per rank slot; NaN means the rank did not report. All durations are
    seconds measured on each rank's own clock, so nothing here depends on clocks agreeing.
    """

    index: int  # step number, or time-bucket number when ``has_steps`` is False
    has_steps: bool
    start_ns: int
    end_ns: int
    step_time: np.ndarray  # (n,) step duration
    comm_time: np.ndarray  # (n,) time inside collectives and p2p
    late: np.ndarray  # (n, len(KINDS)) time peers waited for this rank, per comm kind
    calls: np.ndarray  # (n, len(KINDS)) collectives this rank completed, per comm kind
    collectives: int  # collectives attributed to the frame
    # Per communicator (by its dense index): summed transfer time (the last arriver's duration),
    # summed effective bytes (bytes x bus factor) and number of collectives in this frame.
    comm_transfer: np.ndarray = field(default_factory=lambda: np.zeros(0))
    comm_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    comm_calls: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # (n, len(KINDS)) time inside collectives and p2p per comm kind (``comm_time`` is its sum;
    # empty where the caller does not say): a pipeline rank's time waiting for its neighbours
    busy: np.ndarray = field(default_factory=lambda: np.zeros((0, len(KINDS))))
    # (n,) each rank's work in the step as its SDK reported it (tokens, samples; NaN: not said)
    work: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def n(self) -> int:
        return int(self.step_time.shape[0])


@dataclass(frozen=True, slots=True)
class PeerGroups:
    """Role peers: groups of rank slots expected to do equal work, stacked by group size.

    ``stacks`` maps a group size to an (groups, size) int array of slots. Built from the
    communicators of a job (tensor-, data-, expert-, context-parallel groups).
    """

    stacks: tuple[np.ndarray, ...]

    @staticmethod
    def from_groups(groups: list[np.ndarray]) -> PeerGroups:
        by_size: dict[int, list[np.ndarray]] = {}
        for g in groups:
            if g.size >= 2:
                by_size.setdefault(int(g.size), []).append(np.asarray(g, dtype=np.int64))
        return PeerGroups(tuple(np.stack(v) for _, v in sorted(by_size.items())))


@dataclass(frozen=True, slots=True)
class JobShape:
    """What detectors need to know about a job's topology, as dense arrays.

    Built by the caller from the announced ranks and comms (and rebuilt when they change).
    """

    hosts: tuple[str, ...]  # host names by host index
    host_of_slot: np.ndarray  # (n,) host index of each rank slot, -1 when unknown
    groups: PeerGroups  # role peers: TP/DP/EP/CP groups (equal work)
    cross_groups: PeerGroups  # role peers spanning hosts (DP-like): compare a host with others
    comm_kind: np.ndarray  # (n_comms,) kind index of each comm
    comm_size: np.ndarray  # (n_comms,) members
    comm_hosts: tuple[tuple[int, ...], ...]  # distinct host indices of each comm
    comm_edges: tuple[frozenset[tuple[int, int]], ...]  # cross-host ring edges (a < b) of each comm
    # The same incidence as flat arrays, for vectorised counting:
    ch_comm: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (comm, host) pairs
    ch_host: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ce_comm: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (comm, edge) pairs
    ce_edge: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    edges: np.ndarray = field(
        default_factory=lambda: np.zeros((0, 2), np.int64)
    )  # edge id -> hosts
    # (n_comms,) an earlier comm with the same kind and members (re-created in a new ring
    # order), whose history the comm inherits; -1 for none
    comm_parent: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def n_hosts(self) -> int:
        return len(self.hosts)

    def networked(self, host: int) -> bool:
        """Whether ``host`` is in a communicator spanning hosts (its NIC carries the job)."""
        return any(host in hs and len(hs) >= 2 for hs in self.comm_hosts)

    @staticmethod
    def empty(n_slots: int = 0) -> JobShape:
        return JobShape(
            (),
            np.full(n_slots, -1),
            PeerGroups(()),
            PeerGroups(()),
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            (),
            (),
        )
