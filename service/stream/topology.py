"""A job's topology: ranks (dense slots), hosts and communicators, as announced by agents."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from failslow.detectors.types import KIND_INDEX
from failslow.service.stream.records import CommAnnouncement, RankAnnouncement, RecordError, Reject

# _PICKLE: a job's snapshot pickles one of these per rank, host and comm. A slots dataclass is
# pickled through dataclasses' own Python getstate (~9 us each: 0.09 s for 10,240 ranks, ~1 s of
# a 100K-rank snapshot, under the job lock); by position, as here, it is a C-level tuple.


@dataclass(slots=True)
class RankInfo:
    rank: int
    slot: int
    host: str | None = None
    gpu: int | None = None

    def __reduce__(self) -> tuple[Any, ...]:  # see _PICKLE
        return (RankInfo, (self.rank, self.slot, self.host, self.gpu))


@dataclass(slots=True)
class HostInfo:
    host: str
    first_seen_ns: int
    last_sent_ns: int
    last_wall: float  # monotonic seconds of the last envelope; staleness is judged in wall time
    ranks: set[int] = field(default_factory=set)
    # what its instrumentation vouches for (docs/ingest-v1.md, "Completeness"): every call of its
    # ranks that ended by ``complete_ns`` was sent, every call begun ``inflight_after_ns``
    # before it and not ended was sent in flight; 0 / -1: it never said
    complete_ns: int = 0
    inflight_after_ns: int = -1

    def __reduce__(self) -> tuple[Any, ...]:  # see _PICKLE
        return (HostInfo, (self.host, self.first_seen_ns, self.last_sent_ns, self.last_wall,
                           self.ranks, self.complete_ns, self.inflight_after_ns))  # fmt: skip


@dataclass(slots=True)
class CommInfo:
    comm: str
    kind: str
    ranks: tuple[int, ...]
    slots: np.ndarray  # member slots in comm order
    position: dict[int, int]  # rank -> index in ``ranks``
    index: int = 0  # dense number of the comm within its job

    def __reduce__(self) -> tuple[Any, ...]:  # see _PICKLE; slots and position are derived
        return (_comm_info, (self.comm, self.kind, self.ranks, self.slots.tobytes(), self.index))


def _new_comm(
    comm: str, kind: str, ranks: tuple[int, ...], slots: np.ndarray, index: int
) -> CommInfo:
    """A :class:`CommInfo`; its ``position`` follows from ``ranks``."""
    return CommInfo(comm, kind, ranks, slots, {r: i for i, r in enumerate(ranks)}, index)


def _comm_info(comm: str, kind: str, ranks: tuple[int, ...], slots: bytes, index: int) -> CommInfo:
    """A :class:`CommInfo` from its pickled form (``slots`` as int64 bytes): ~4x faster to pickle
    than a small array and a dict per comm."""
    return _new_comm(comm, kind, ranks, np.frombuffer(slots, np.int64).copy(), index)


class MemberBudget:
    """Communicator members held in memory over all jobs of one service (~100 B each): the
    per-job caps do not bound a flood of jobs. Shared by the jobs a registry holds. A tenant's
    budget (``parent``: the service's) is its share of it: what fits must fit both, and what it
    holds counts in both."""

    def __init__(self, limit: int, *, parent: MemberBudget | None = None, label: str = "") -> None:
        self.limit = limit
        self.used = 0
        self.parent = parent
        self.label = label  # a tenant's, for its refusals
        self._lock = threading.Lock()

    def fits(self, n: int) -> bool:
        return self.used + n <= self.limit and (self.parent is None or self.parent.fits(n))

    def refusal(self, n: int) -> str:
        if self.parent is not None and self.used + n <= self.limit:
            return self.parent.refusal(n)
        if self.parent is not None:
            return (
                f"{self.label} holds {self.used} communicator members over its jobs; {n} more "
                f"exceed its share of {self.limit} (FAILSLOW_STATE__TENANT_SHARE of "
                "FAILSLOW_STATE__MAX_TOTAL_COMM_MEMBERS)"
            )
        return (
            f"the service holds {self.used} communicator members over all jobs; {n} more "
            f"exceed its limit of {self.limit} (FAILSLOW_STATE__MAX_TOTAL_COMM_MEMBERS)"
        )

    def add(self, n: int) -> None:
        with self._lock:
            self.used += n
        if self.parent is not None:
            self.parent.add(n)

    def release(self, n: int) -> None:
        with self._lock:
            self.used = max(0, self.used - n)
        if self.parent is not None:
            self.parent.release(n)

    def __getstate__(self) -> dict[str, Any]:  # a snapshot keeps no lock; a registry re-attaches
        return {"limit": self.limit, "used": 0}

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.limit, self.used, self._lock = d["limit"], d["used"], threading.Lock()
        self.parent, self.label = None, ""


class Topology:
    """Ranks, hosts and comms of one job. Mutated only under the job lock."""

    def __init__(self, *, max_ranks: int, max_comms: int, max_comm_members: int = 1 << 62) -> None:
        self.max_ranks = max_ranks
        self.max_comms = max_comms
        self.max_comm_members = max_comm_members
        self.comm_members = 0  # members of all comms together
        self.budget: MemberBudget | None = None  # the service's, while a registry holds the job
        self.ranks: dict[int, RankInfo] = {}
        self.slot_rank: list[int] = []
        self.hosts: dict[str, HostInfo] = {}
        self.comms: dict[str, CommInfo] = {}
        self.comm_list: list[CommInfo] = []  # by index
        self._slot_tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._slot_tables_version = -1
        self.host_ids: dict[str, int] = {}  # host -> dense host number (first appearance)
        self.slot_host = np.zeros(0, np.int64)  # per slot: its host's number, -1 unknown
        self._comm_arrays: tuple[np.ndarray, np.ndarray] | None = None
        self.world_size: int | None = None
        self.version = 0  # bumped on every change; detectors cache derived groups by it
        self.dirty_ranks: set[int] = set()
        self.dirty_comms: set[str] = set()
        # comm -> (kind, start, stop, step): a large comm registered as a range of ranks, so
        # that hosts naming it again in that form are checked without expanding its members
        self.comm_forms: dict[str, tuple[str, int, int, int]] = {}

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self.__dict__.setdefault("comm_forms", {})  # a snapshot taken before it existed

    # -- ranks -------------------------------------------------------------------------------
    def slot(self, rank: int) -> int:
        info = self.ranks.get(rank)
        if info is None:
            info = self._new_rank(rank)
        return info.slot

    def _new_rank(self, rank: int) -> RankInfo:
        if len(self.ranks) >= self.max_ranks:
            raise RecordError(Reject.LIMIT, f"job exceeds {self.max_ranks} ranks")
        info = RankInfo(rank=rank, slot=len(self.slot_rank))
        self.ranks[rank] = info
        self.slot_rank.append(rank)
        if self.slot_host.size < len(self.slot_rank):
            grown = np.full(max(64, 2 * self.slot_host.size), -1, np.int64)
            grown[: self.slot_host.size] = self.slot_host
            self.slot_host = grown
        self.version += 1
        return info

    def _place(self, info: RankInfo, host: str) -> None:
        info.host = host
        self.slot_host[info.slot] = self.host_ids.get(host, -1)

    @property
    def n_slots(self) -> int:
        return len(self.slot_rank)

    @property
    def n_comms(self) -> int:
        return len(self.comm_list)

    def announce_rank(self, host: str, ann: RankAnnouncement) -> None:
        if ann.world_size is not None and ann.world_size > self.max_ranks:
            raise RecordError(
                Reject.LIMIT, f"world_size exceeds this service's {self.max_ranks} ranks"
            )
        info = self.ranks.get(ann.rank) or self._new_rank(ann.rank)
        changed = False
        if info.host != host:
            if info.host is not None and info.host in self.hosts:
                self.hosts[info.host].ranks.discard(ann.rank)
            self._place(info, host)
            changed = True
        if ann.gpu is not None and info.gpu != ann.gpu:
            info.gpu = ann.gpu
            changed = True
        if host in self.hosts:
            self.hosts[host].ranks.add(ann.rank)
        if ann.world_size is not None and ann.world_size != self.world_size:
            self.world_size = ann.world_size
        if changed:
            self.dirty_ranks.add(ann.rank)
            self.version += 1

    def check_rank_host(self, rank: int, host: str) -> int:
        """Slot of ``rank`` reported by ``host``; an unannounced rank is placed on that host."""
        info = self.ranks.get(rank)
        if info is None:
            info = self._new_rank(rank)
        if info.host is None:
            self._place(info, host)
            self.hosts[host].ranks.add(rank)
            self.dirty_ranks.add(rank)
            self.version += 1
        elif info.host != host:
            raise RecordError(
                Reject.WRONG_HOST, f"rank {rank} lives on host {info.host}, not {host}"
            )
        return info.slot

    # -- hosts -------------------------------------------------------------------------------
    def touch_host(self, host: str, sent_ns: int, wall: float) -> bool:
        """Record an envelope from ``host``; True when the host is new."""
        info = self.hosts.get(host)
        if info is None:
            self.hosts[host] = HostInfo(host, sent_ns, sent_ns, wall)
            self.host_ids.setdefault(host, len(self.host_ids))
            return True
        info.last_sent_ns = max(info.last_sent_ns, sent_ns)
        info.last_wall = wall
        return False

    def vouch(self, host: str, complete_ns: int | None, inflight_after_ns: int | None) -> None:
        """What an applied envelope of ``host`` vouched for (None: nothing new; a heartbeat, or
        a source that does not vouch: what was vouched for before still holds, and the hang
        detector judges a rank with and without it)."""
        info = self.hosts.get(host)
        if info is None or complete_ns is None or inflight_after_ns is None:
            return
        info.complete_ns = max(info.complete_ns, complete_ns)
        info.inflight_after_ns = inflight_after_ns

    # -- comms -------------------------------------------------------------------------------
    def announce_comm(self, ann: CommAnnouncement) -> None:
        existing = self.comms.get(ann.comm)
        if existing is not None:
            if existing.ranks is not ann.ranks and existing.ranks != ann.ranks:
                raise RecordError(Reject.CONFLICT, f"conflicting member list for comm {ann.comm}")
            if existing.kind != ann.kind:
                raise RecordError(
                    Reject.CONFLICT, f"conflicting kind for comm {ann.comm}: {existing.kind}"
                )
            return
        if len(self.comms) >= self.max_comms:
            raise RecordError(Reject.LIMIT, f"job exceeds {self.max_comms} comms")
        if self.comm_members + len(ann.ranks) > self.max_comm_members:
            raise RecordError(
                Reject.LIMIT, f"job exceeds {self.max_comm_members} communicator members"
            )
        if self.budget is not None and not self.budget.fits(len(ann.ranks)):
            raise RecordError(Reject.LIMIT, self.budget.refusal(len(ann.ranks)))
        missing = sum(1 for r in ann.ranks if r not in self.ranks)
        if len(self.ranks) + missing > self.max_ranks:
            raise RecordError(Reject.LIMIT, f"job exceeds {self.max_ranks} ranks")
        slots = np.fromiter((self.slot(r) for r in ann.ranks), dtype=np.int64, count=len(ann.ranks))
        info = _new_comm(ann.comm, ann.kind, ann.ranks, slots, len(self.comm_list))
        self.comms[ann.comm] = info
        self.comm_list.append(info)
        self.comm_members += len(ann.ranks)
        if self.budget is not None:
            self.budget.add(len(ann.ranks))
        self.dirty_comms.add(ann.comm)
        self.version += 1

    # -- views -------------------------------------------------------------------------------
    def comm_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(member count, kind column)`` of every comm, by comm index."""
        if self._comm_arrays is None or self._comm_arrays[0].size != len(self.comm_list):
            self._comm_arrays = (
                np.array([len(c.ranks) for c in self.comm_list], dtype=np.int64),
                np.array([KIND_INDEX[c.kind] for c in self.comm_list], dtype=np.int64),
            )
        return self._comm_arrays

    def member_slots(self, size: int, comm_index: np.ndarray) -> np.ndarray:
        """(k, size) member slots of the comms ``comm_index`` (all of member count ``size``)."""
        matrix, row_of = self.slot_table(size)
        return matrix[row_of[comm_index]]

    def slot_table(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """``(matrix, row_of)``: member slots of every comm of member count ``size`` (one row
        each, in comm order) and, per comm index, its row (-1 for other sizes)."""
        if self._slot_tables_version != len(self.comm_list):
            self._slot_tables.clear()
            self._slot_tables_version = len(self.comm_list)
        table = self._slot_tables.get(size)
        if table is None:
            rows = [c for c in self.comm_list if len(c.ranks) == size]
            row_of = np.full(len(self.comm_list), -1, dtype=np.int64)
            row_of[[c.index for c in rows]] = np.arange(len(rows))
            matrix = np.stack([c.slots for c in rows]) if rows else np.zeros((0, size), np.int64)
            table = self._slot_tables[size] = (matrix, row_of)
        return table

    def rank_hosts(self) -> list[str | None]:
        return [self.ranks[r].host for r in self.slot_rank]

    def slots_of_hosts(self, hosts: set[str]) -> set[int]:
        return {self.ranks[r].slot for h in hosts if h in self.hosts for r in self.hosts[h].ranks}


class CommTable(Protocol):
    """What the join and the frame builder read of a job's topology."""

    @property
    def n_slots(self) -> int: ...

    @property
    def n_comms(self) -> int: ...

    def comm_arrays(self) -> tuple[np.ndarray, np.ndarray]: ...

    def slot_table(self, size: int) -> tuple[np.ndarray, np.ndarray]: ...

    def member_slots(self, size: int, comm_index: np.ndarray) -> np.ndarray: ...
