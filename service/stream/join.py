"""The join: member records of each collective, keyed by (comm, seq), become whole collectives.

Ingest only *stages* validated member records (columns, no per-record object); a join pass, at the
start of every detection pass (or earlier when much is staged), sorts the staged records together
with the still-incomplete ones by (comm, seq) and finds, per communicator size, which collectives
now have every member's end. Those go to the frame builder as :class:`ReadyBatch` columns; the
rest stay pending. Duplicate member records (the same member twice) are dropped; a member
reported in flight (``end = -1``) and later completed keeps the completion; a member reported
twice with different data keeps the first and counts a conflict.

All of it is whole-array work: the cost per record is a share of one sort and a few scatters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from failslow.detectors.types import P2P
from failslow.detectors.vocab import Op
from failslow.service.stream.members import (
    COLUMNS,
    DTYPES,
    SEQ_BITS,
    SEQ_MASK,
    count_keys,
    empty_columns,
    merge,
    ranges,
    sort_key,
    take,
)
from failslow.service.stream.quiet import QuietGaps
from failslow.wire.v2 import NO_END, OPS

__all__ = ["COLUMNS", "DTYPES", "MAX_BLOCKED", "Joiner", "PendingGroup", "ReadyBatch"]

MAX_BLOCKED = 2048  # blocked collectives handed to the hang detector per pass
_P2P_CODES = np.array([op in (Op.SEND, Op.RECV) for op in OPS])
_ALLREDUCE = np.array([op == Op.ALLREDUCE for op in OPS])
_RING = np.array([op in (Op.ALLGATHER, Op.REDUCESCATTER, Op.ALLTOALL) for op in OPS])
_BARRIER = np.array([op == Op.BARRIER for op in OPS])


def bus_factors(op: np.ndarray, n: int) -> np.ndarray:
    """nccl-tests' bus factor of each op code for ``n`` members (see detectors.busbw); p2p
    counts as a send."""
    if n < 2:
        return np.zeros(op.size)
    out = np.ones(op.size)
    out[_ALLREDUCE[op]] = 2.0 * (n - 1) / n
    out[_RING[op]] = (n - 1) / n
    out[_BARRIER[op]] = 0.0
    return out


@dataclass(frozen=True, slots=True)
class ReadyBatch:
    """Completed collectives with the same member count, as columns.

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


@dataclass(frozen=True, slots=True)
class PendingGroup:
    """An incomplete collective, for the hang detector and views."""

    comm: int
    seq: int
    first_ns: int  # earliest start of a member that reported
    seen_ns: int  # the job's event time when its first member record arrived
    positions: np.ndarray  # member positions that reported
    starts: np.ndarray  # their starts
    ends: np.ndarray  # their ends (-1: in flight)
    arrival: int = 0  # the job's number of its first member record to arrive


class Joiner:
    """Staged and pending member records of one job. Mutated only under the job lock."""

    def __init__(self, *, max_pending: int, retention_ns: int) -> None:
        self.max_pending = max_pending  # incomplete collectives held at once
        self.retention_ns = retention_ns
        self.staged: list[dict[str, np.ndarray]] = []
        self.staged_records = 0
        self.pending = empty_columns()  # sorted by (comm, seq)
        self._pkey: np.ndarray | None = None  # the key of pending (None: compute it again)
        self.pending_groups = 0
        self.expired = 0  # incomplete collectives dropped by retention or the cap
        self.conflicts = 0  # member records that contradicted an earlier one (dropped)
        self.duplicates = 0  # member records identical to an earlier one (dropped)
        # per slot: the end of its newest completed call, and its longest recent gap between two
        self.quiet = QuietGaps()
        self.n_slots = 0  # slots the job had at the newest staging
        self.arrivals = 0  # member records staged so far

    # -- input ---------------------------------------------------------------------------------
    def stage(self, cols: dict[str, np.ndarray], n_slots: int) -> None:
        """Add validated member records (the columns of :data:`COLUMNS` but ``arrival``, which
        is numbered here: the order in which records reached the job)."""
        n = int(cols["comm"].size)
        if not n:
            return
        if "arrival" not in cols:  # numbered by the job's owner when the join is sharded
            cols["arrival"] = np.arange(self.arrivals, self.arrivals + n, dtype=np.int64)
        self.arrivals += n
        self.staged.append(cols)
        self.staged_records += n
        self.n_slots = max(self.n_slots, n_slots)

    # -- the join ------------------------------------------------------------------------------
    def join(self, comm_size: np.ndarray, comm_kind: np.ndarray) -> list[ReadyBatch]:
        """Complete what can be completed; returns one batch per member count.

        Only the collectives that staged records belong to are looked at: the staged records
        are sorted, the pending records of the same collectives found by binary search in the
        (sorted) pending columns, and what stays incomplete is merged back in order. A job
        whose collectives span many hosts and a long step (a 100K-rank job at 10 s per step
        holds millions of incomplete member records) so pays for what arrived, not for all it
        holds, at every pass."""
        if not self.staged:
            return []
        staged = self._take_staged()
        self._note_ends(staged["slot"], staged["end"])
        skey = sort_key(staged)
        # timsort uses the runs hosts' records come in (84K keys: 0.56 ms, quicksort 3.8 ms)
        touched = np.sort(skey, kind="stable")
        touched = touched[np.r_[True, touched[1:] != touched[:-1]]]
        pkey = self._pending_key()
        lo = np.searchsorted(pkey, touched, side="left")
        hi = np.searchsorted(pkey, touched, side="right")
        sel = ranges(lo, hi - lo)  # pending records of the touched collectives, in order
        # pending records arrived before the staged ones: first, as the stable sort keeps them
        cols = {c: np.concatenate([self.pending[c][sel], staged[c]]) for c in COLUMNS}
        key = np.concatenate([pkey[sel], skey])
        order = np.argsort(key, kind="stable")  # arrival order kept within a collective
        cols = take(cols, order)
        key = key[order]
        first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        gid = np.repeat(np.arange(first.size), np.diff(np.r_[first, key.size]))
        gcomm = cols["comm"][first]
        gsize = comm_size[gcomm]
        out: list[ReadyBatch] = []
        keep = np.zeros(key.size, dtype=bool)  # records of incomplete collectives
        for n in np.unique(gsize).tolist():
            groups = np.flatnonzero(gsize == n)
            rec = np.flatnonzero(gsize[gid] == n)
            row_of = np.full(first.size, -1, np.int64)
            row_of[groups] = np.arange(groups.size)
            cell = row_of[gid[rec]] * n + cols["pos"][rec]
            winner = self._winners(cell, rec, cols, groups.size * n)
            filled = winner >= 0
            starts = np.full(groups.size * n, NO_END, np.int64)
            ends = np.full(groups.size * n, NO_END, np.int64)
            starts[filled] = cols["start"][winner[filled]]
            ends[filled] = cols["end"][winner[filled]]
            complete = (ends != NO_END).reshape(-1, n).all(axis=1)
            if complete.any():
                rows = np.flatnonzero(complete)
                g = groups[rows]
                op = cols["op"][first[g]]
                p2p = _P2P_CODES[op]
                nbytes = np.maximum.reduceat(cols["nbytes"], first)[g]
                out.append(
                    ReadyBatch(
                        n,
                        gcomm[g],
                        np.where(p2p, P2P, comm_kind[gcomm[g]]),
                        nbytes * bus_factors(np.where(p2p, OPS.index(Op.SEND), op), n),
                        starts.reshape(-1, n)[rows],
                        ends.reshape(-1, n)[rows],
                    )
                )
            open_cells = np.zeros(groups.size * n, dtype=bool)
            open_cells[filled] = ~np.repeat(complete, n)[filled]
            keep[winner[open_cells]] = True
        if sel.size:
            rest = np.ones(pkey.size, dtype=bool)
            rest[sel] = False
            untouched, ukey = take(self.pending, np.flatnonzero(rest)), pkey[rest]
        else:
            untouched, ukey = self.pending, pkey
        self.pending, kept = merge(untouched, ukey, take(cols, np.flatnonzero(keep)), key[keep])
        self._pkey = kept
        self.pending_groups = count_keys(kept)
        if self.pending_groups > self.max_pending:
            self._drop_oldest(self.pending_groups - self.max_pending)
        return out

    def _pending_key(self) -> np.ndarray:
        if self._pkey is None or self._pkey.size != self.pending["comm"].size:
            self._pkey = sort_key(self.pending)
        return self._pkey

    def _take_staged(self) -> dict[str, np.ndarray]:
        parts = self.staged
        self.staged, self.staged_records = [], 0
        if len(parts) == 1:
            return parts[0]
        return {c: np.concatenate([p[c] for p in parts]) for c in COLUMNS}

    def note_ends(self, slot: np.ndarray, end: np.ndarray, n_slots: int) -> None:
        """``last_end`` from member records that are joined elsewhere (a sharded job's owner)."""
        self.n_slots = max(self.n_slots, n_slots)
        self._note_ends(slot, end)

    def retain(self, select: Callable[[dict[str, np.ndarray]], np.ndarray] | None = None) -> None:
        """Keep only the pending (and staged) records that ``select`` picks from the pending
        columns (None: none); the others were handed to shards, not expired."""
        self.join_pending_only()
        keep = select(self.pending) if select is not None else np.zeros(0, np.int64)
        self.pending, self._pkey = take(self.pending, np.flatnonzero(keep)), None
        self.pending_groups = count_keys(self._pending_key())

    @property
    def last_end(self) -> np.ndarray:
        """Per slot, the end of its newest completed call (0: none yet)."""
        return self.quiet.last

    def _note_ends(self, slot: np.ndarray, end: np.ndarray) -> None:
        """``last_end`` and the quiet gaps from new records' ends."""
        self.quiet.note(slot, end, self.n_slots)

    def _winners(
        self, cell: np.ndarray, rec: np.ndarray, cols: dict[str, np.ndarray], cells: int
    ) -> np.ndarray:
        """Per cell (collective x member), the record that stands for it (-1: none)."""
        winner = np.full(cells, -1, np.int64)
        count = np.bincount(cell, minlength=cells)
        winner[cell] = rec  # where a cell has several records, the last write wins: fixed below
        multi = np.flatnonzero(count > 1)
        if multi.size:
            order = np.argsort(cell, kind="stable")  # arrival order within a cell
            sorted_cells = cell[order]
            lo = np.searchsorted(sorted_cells, multi, side="left")
            hi = np.searchsorted(sorted_cells, multi, side="right")
            for c, a, b in zip(multi.tolist(), lo.tolist(), hi.tolist(), strict=True):
                winner[c] = self._resolve(rec[order[a:b]], cols)
        return winner

    def _resolve(self, records: np.ndarray, cols: dict[str, np.ndarray]) -> int:
        """One member reported several times: keep the first, or its completion."""
        chosen = int(records[0])
        for r in records[1:].tolist():
            same = (
                cols["op"][r] == cols["op"][chosen]
                and cols["nbytes"][r] == cols["nbytes"][chosen]
                and cols["start"][r] == cols["start"][chosen]
            )
            end, chosen_end = cols["end"][r], cols["end"][chosen]
            if not same:
                self.conflicts += 1
            elif end in (chosen_end, NO_END):
                self.duplicates += 1  # identical, or a stale in-flight copy
            elif chosen_end == NO_END:
                chosen = r  # the in-flight call completed
            else:
                self.conflicts += 1
        return chosen

    # -- bounds --------------------------------------------------------------------------------
    def _groups(self) -> tuple[np.ndarray, np.ndarray]:
        """``(first index, key)`` of each pending collective (pending is sorted by key)."""
        key = self._pending_key()
        first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else key
        return first.astype(np.int64), key

    def _drop(self, dropped_groups: np.ndarray, first: np.ndarray) -> np.ndarray:
        """Remove the given pending collectives; returns their (comm, seq) as an (n, 2) array."""
        p = self.pending
        sizes = np.diff(np.r_[first, p["comm"].size])
        gone = np.repeat(np.isin(np.arange(first.size), dropped_groups), sizes)
        out = np.column_stack([p["comm"][first[dropped_groups]], p["seq"][first[dropped_groups]]])
        self.pending, self._pkey = take(p, np.flatnonzero(~gone)), None
        self.pending_groups -= int(dropped_groups.size)
        self.expired += int(dropped_groups.size)
        return out

    def _arrival_order(self, first: np.ndarray) -> np.ndarray:
        """Pending collectives in the order their first member record arrived."""
        return np.argsort(np.minimum.reduceat(self.pending["arrival"], first), kind="stable")

    def _drop_oldest(self, count: int) -> None:
        first, _ = self._groups()
        self._drop(self._arrival_order(first)[:count], first)

    def expire(self, watermark_ns: int) -> np.ndarray:
        """Drop incomplete collectives older than the retention window; returns their
        (comm, seq) as an (n, 2) array. Arrival order is close to event order: the scan stops
        at the first young one."""
        if not self.pending_groups:
            return np.zeros((0, 2), np.int64)
        first, _ = self._groups()
        order = self._arrival_order(first)
        oldest = np.minimum.reduceat(self.pending["start"], first)[order]
        young = np.flatnonzero(oldest >= watermark_ns - self.retention_ns)
        old = order[: young[0] if young.size else order.size]
        return self._drop(old, first) if old.size else np.zeros((0, 2), np.int64)

    def abandon(self) -> int:
        """Drop every incomplete collective (the job restarted: its members are gone)."""
        self.join_pending_only()
        count = self.pending_groups
        self.pending, self.pending_groups, self._pkey = empty_columns(), 0, None
        self.expired += count
        return count

    def join_pending_only(self) -> None:
        """Fold what is staged into pending without completing anything (for counts)."""
        if not self.staged:
            return
        parts = [self.pending, *self.staged]
        staged = self.staged_records
        self.staged, self.staged_records = [], 0
        cols = {c: np.concatenate([p[c] for p in parts]) for c in COLUMNS}
        self._note_ends(cols["slot"][-staged:], cols["end"][-staged:])
        key = (cols["comm"] << SEQ_BITS) | (cols["seq"] & SEQ_MASK)
        order = np.argsort(key, kind="stable")
        self.pending = take(cols, order)
        self._pkey = key[order]
        self.pending_groups = count_keys(self._pkey)

    # -- views ---------------------------------------------------------------------------------
    def inflight_count(self) -> int:
        """Incomplete collectives that a member reported as entered but not completed."""
        if not self.pending_groups:
            return 0
        first, key = self._groups()
        inside = self.pending["end"] == NO_END
        return int(np.count_nonzero(np.logical_or.reduceat(inside, first)))

    def groups(
        self,
        *,
        started_before_ns: int | None = None,
        limit: int | None = None,
        inside_only: bool = False,
    ) -> list[PendingGroup]:
        """Pending collectives in order of arrival. With ``started_before_ns``: those arriving
        before the first whose first member started after it and, when there are any, every
        later one that a member is inside (whoever waits there waits for someone else).
        ``inside_only``: only those that a member reported being inside (in flight). At most
        ``limit`` (the first in that order)."""
        if not self.pending_groups:
            return []
        p = self.pending
        first, _ = self._groups()
        bounds = np.r_[first, p["comm"].size]
        oldest = np.minimum.reduceat(p["start"], first)
        seen = np.minimum.reduceat(p["seen"], first)
        arrival = np.minimum.reduceat(p["arrival"], first)
        order = np.argsort(arrival, kind="stable")
        inside = None
        if started_before_ns is not None:
            young = np.flatnonzero(oldest[order] >= started_before_ns)
            cut = young[0] if young.size else order.size
            if cut == 0:
                return []
            inside = np.logical_or.reduceat(p["end"] == NO_END, first)
            later = order[cut:]
            order = np.r_[order[:cut], later[inside[later]]]
        if inside_only:
            if inside is None:
                inside = np.logical_or.reduceat(p["end"] == NO_END, first)
            order = order[inside[order]]
        if limit is not None:
            order = order[:limit]
        out = []
        for g in order.tolist():
            a, b = bounds[g], bounds[g + 1]
            out.append(
                PendingGroup(
                    int(p["comm"][a]), int(p["seq"][a]), int(oldest[g]), int(seen[g]),
                    p["pos"][a:b], p["start"][a:b], p["end"][a:b], int(arrival[g]),
                )  # fmt: skip
            )
        return out
