"""Assembly of each collective, keyed by (comm, seq), from its members' records in any order.

A collective is complete when every member has reported an ``end_ns``. Completed collectives
are queued for the frame builder and remembered (bounded) so that re-sends are recognised.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from failslow.detectors.busbw import bus_factor
from failslow.detectors.types import KIND_INDEX, P2P
from failslow.detectors.vocab import P2P_OPS, Op
from failslow.service.stream.records import CollectiveRecord, RecordError, Reject
from failslow.service.stream.topology import CommInfo


class Outcome(enum.Enum):
    NEW = "new"
    COMPLETED = "completed"  # an in-flight record got its end_ns
    DUPLICATE = "duplicate"


@dataclass(slots=True)
class Pending:
    kind: int
    nbytes: int
    first_ns: int
    starts: list[int | None]
    ends: list[int | None]
    ident: list[tuple[str, int, int | None] | None]  # per member (op, bytes, peer)
    reported: int = 0
    finished: int = 0
    seen_ns: int = 0  # the job's event time when the first member's record arrived


@dataclass(frozen=True, slots=True)
class ReadyBatch:
    """Completed collectives with the same member count, as columns (rows in completion order).

    Columns, not objects: detection then works on whole arrays (see bench/detection_scale.py).
    """

    size: int
    comm: np.ndarray  # (k,) comm index
    kind: np.ndarray  # (k,) kind column (P2P for send/recv)
    ebytes: np.ndarray  # (k,) message bytes x bus factor
    starts: np.ndarray  # (k, size) member start_ns, in comm order, on each member's clock
    ends: np.ndarray  # (k, size)

    def __len__(self) -> int:
        return int(self.comm.size)


@dataclass(slots=True)
class _ReadyBuffer:
    comm: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    ebytes: list[float] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # flat, size per row
    ends: list[int] = field(default_factory=list)

    def batch(self, size: int) -> ReadyBatch:
        k = len(self.comm)
        return ReadyBatch(
            size,
            np.array(self.comm, dtype=np.int64),
            np.array(self.kind, dtype=np.int64),
            np.array(self.ebytes, dtype=np.float64),
            np.array(self.starts, dtype=np.int64).reshape(k, size),
            np.array(self.ends, dtype=np.int64).reshape(k, size),
        )


def _member_key(op: str, nbytes: int, start: int, end: int | None, peer: int | None) -> int:
    return hash((op, nbytes, start, end, peer))


class Assembler:
    """Pending and completed collectives of one job, bounded by count and event time."""

    def __init__(self, *, max_pending: int, max_done: int, retention_ns: int) -> None:
        self.max_pending = max_pending
        self.max_done = max_done
        self.retention_ns = retention_ns
        self.pending: OrderedDict[tuple[str, int], Pending] = OrderedDict()
        # per completed collective: per member (hash with end, hash with end=None)
        self.done: OrderedDict[tuple[str, int], tuple[int, ...]] = OrderedDict()
        self.retired_seq: dict[str, int] = {}
        self._ready: dict[int, _ReadyBuffer] = {}
        self.expired = 0  # incomplete collectives dropped by retention or the cap
        self.last_end: dict[int, int] = {}  # per rank: end of its newest completed call
        self.assumed_duplicates = 0

    def offer(self, rec: CollectiveRecord, comm: CommInfo, now_ns: int = 0) -> Outcome:
        """Add one validated record of a member of ``comm``; raise RecordError on conflict."""
        pos = comm.position.get(rec.rank)
        if pos is None:
            raise RecordError(
                Reject.NOT_MEMBER, f"rank {rec.rank} is not a member of comm {rec.comm}"
            )
        if rec.op in P2P_OPS and (len(comm.ranks) != 2 or rec.peer not in comm.position):
            raise RecordError(
                Reject.BAD_PEER, f"peer {rec.peer} is not the other member of comm {rec.comm}"
            )
        key = (rec.comm, rec.seq)
        done = self.done.get(key)
        if done is not None:
            return self._against_done(rec, done, pos)
        entry = self.pending.get(key)
        if entry is None:
            if rec.seq <= self.retired_seq.get(rec.comm, -1):
                # Older than what we still remember: most likely a re-send. Counted apart.
                self.assumed_duplicates += 1
                return Outcome.DUPLICATE
            n = len(comm.ranks)
            kind = P2P if rec.op in P2P_OPS else KIND_INDEX[comm.kind]
            entry = Pending(
                kind, rec.nbytes, rec.start_ns, [None] * n, [None] * n, [None] * n, seen_ns=now_ns
            )
            self.pending[key] = entry
            if len(self.pending) > self.max_pending:
                self._expire_oldest()
        ident = (rec.op, rec.nbytes, rec.peer)
        old = entry.ident[pos]
        if old is None:
            entry.ident[pos] = ident
            entry.starts[pos] = rec.start_ns
            entry.ends[pos] = rec.end_ns
            entry.reported += 1
            entry.first_ns = min(entry.first_ns, rec.start_ns)
            entry.nbytes = max(entry.nbytes, rec.nbytes)
            outcome = Outcome.NEW
            if rec.end_ns is not None:
                entry.finished += 1
        else:
            if old != ident or entry.starts[pos] != rec.start_ns:
                raise RecordError(Reject.CONFLICT, "conflicting re-send of a stored record")
            stored_end = entry.ends[pos]
            if stored_end == rec.end_ns or rec.end_ns is None:
                return Outcome.DUPLICATE  # identical, or a stale in-flight copy
            if stored_end is not None:
                raise RecordError(Reject.CONFLICT, "conflicting re-send of a stored record")
            entry.ends[pos] = rec.end_ns
            entry.finished += 1
            outcome = Outcome.COMPLETED
        if rec.end_ns is not None and rec.end_ns > self.last_end.get(rec.rank, 0):
            self.last_end[rec.rank] = rec.end_ns  # the hang detector's "still progressing"
        if entry.finished == len(comm.ranks):
            self._complete(key, entry, comm, rec.op)
        return outcome

    def _against_done(self, rec: CollectiveRecord, done: tuple[int, ...], pos: int) -> Outcome:
        if rec.end_ns is None:
            ok = done[2 * pos + 1] == _member_key(rec.op, rec.nbytes, rec.start_ns, None, rec.peer)
        else:
            ok = done[2 * pos] == _member_key(
                rec.op, rec.nbytes, rec.start_ns, rec.end_ns, rec.peer
            )
        if not ok:
            raise RecordError(Reject.CONFLICT, "conflicting re-send of a stored record")
        return Outcome.DUPLICATE

    def _complete(self, key: tuple[str, int], entry: Pending, comm: CommInfo, op: str) -> None:
        del self.pending[key]
        fingerprint: list[int] = []
        for ident, start, end in zip(entry.ident, entry.starts, entry.ends, strict=True):
            assert ident is not None and start is not None
            fingerprint.append(_member_key(ident[0], ident[1], start, end, ident[2]))
            fingerprint.append(_member_key(ident[0], ident[1], start, None, ident[2]))
        self.done[key] = tuple(fingerprint)
        if len(self.done) > self.max_done:
            old_key, _ = self.done.popitem(last=False)
            self._retire(old_key)
        n = len(comm.ranks)
        buf = self._ready.get(n)
        if buf is None:
            buf = self._ready[n] = _ReadyBuffer()
        buf.comm.append(comm.index)
        buf.kind.append(entry.kind)
        buf.ebytes.append(entry.nbytes * bus_factor(Op.SEND if entry.kind == P2P else op, n))
        buf.starts.extend(entry.starts)  # type: ignore[arg-type]  # complete: no None left
        buf.ends.extend(entry.ends)  # type: ignore[arg-type]

    def _retire(self, key: tuple[str, int]) -> None:
        comm, seq = key
        if seq > self.retired_seq.get(comm, -1):
            self.retired_seq[comm] = seq

    def _expire_oldest(self) -> None:
        key, _ = self.pending.popitem(last=False)
        self._retire(key)
        self.expired += 1

    def expire(self, watermark_ns: int) -> int:
        """Drop incomplete collectives older than the retention window; return how many."""
        horizon = watermark_ns - self.retention_ns
        count = 0
        # Insertion order is arrival order, close to event order: stop at the first young one.
        while self.pending:
            key, entry = next(iter(self.pending.items()))
            if entry.first_ns >= horizon:
                break
            del self.pending[key]
            self._retire(key)
            count += 1
        self.expired += count
        return count

    def abandon(self) -> int:
        """Drop every incomplete collective (the job restarted: its members are gone)."""
        count = len(self.pending)
        for key in list(self.pending):
            del self.pending[key]
            self._retire(key)
        self.expired += count
        return count

    def take_ready(self) -> list[ReadyBatch]:
        """Collectives completed since the last call, one batch per member count."""
        ready, self._ready = self._ready, {}
        return [buf.batch(size) for size, buf in ready.items()]

    @property
    def ready_count(self) -> int:
        return sum(len(b.comm) for b in self._ready.values())

    def inflight(self) -> list[tuple[str, int, Pending]]:
        """Collectives with at least one member inside the call (reported without end_ns)."""
        return [(c, s, e) for (c, s), e in self.pending.items() if e.finished < e.reported]
