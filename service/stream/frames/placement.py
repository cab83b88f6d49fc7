"""Placement: each completed collective's per-member contributions go to the open frame whose
step interval, on the member's own rank and clock, contains the member's start; per-collective
contributions (transfer time, bytes) go with the collective's first member. What has no frame yet
waits in a queue; what lost its frame is counted as dropped."""

from __future__ import annotations

import numpy as np

from failslow.detectors.lateness import collective_stats
from failslow.service.stream import kernels
from failslow.service.stream.frames.accumulator import (
    CHUNK,
    COMM_FIELDS,
    MEMBER_FIELDS,
    NEVER,
    NK,
    NS,
    FrameAcc,
    Queue,
    add_at,
    grow,
)
from failslow.service.stream.join import ReadyBatch


class Placement:
    """Where each contribution goes: the open frames, each slot's recent step intervals and the
    queues of contributions whose frame is not known yet. :class:`FrameBuilder` builds on it."""

    def __init__(self, *, time_frame_ns: int, ring: int, max_queued: int, jit: bool | None) -> None:
        """``jit``: use the compiled kernels (None: when numba is installed and
        ``FAILSLOW_JIT`` is not 0)."""
        self.time_frame_ns = time_frame_ns
        self.ring = ring
        self.max_queued = max_queued
        self.jit = kernels.enabled() if jit is None else (jit and kernels.AVAILABLE)
        self._scratch: dict[str, np.ndarray] = {}
        self.cap = 0
        # The ring only remembers recent step records, to recognise re-sends.
        self.step_id = np.empty((0, ring), dtype=np.int64)
        self.step_start = np.empty((0, ring), dtype=np.int64)
        self.step_end = np.empty((0, ring), dtype=np.int64)
        self.max_step = np.empty(0, dtype=np.int64)
        self.newest_end = np.empty(0, dtype=np.int64)  # per slot: end of its newest step record
        self.frames: dict[int, FrameAcc] = {}
        self.queue = Queue(*MEMBER_FIELDS)
        self.cqueue = Queue(*COMM_FIELDS)
        self.n_comms = 0
        self.has_steps = False
        self.time_mode = False
        self.last_closed = -1
        self.dropped_contributions = 0

    # -- capacity ----------------------------------------------------------------------------
    def ensure(self, n: int) -> None:
        if n <= self.cap:
            return
        new = max(n, 2 * self.cap, 64)
        self.step_id = grow(self.step_id, new, -1)
        self.step_start = grow(self.step_start, new, 0)
        self.step_end = grow(self.step_end, new, 0)
        self.max_step = grow(self.max_step, new, -1)
        self.newest_end = grow(self.newest_end, new, NEVER)
        self.cap = new

    # -- the compiled path ---------------------------------------------------------------------
    def _compiled_ok(self, n_slots: int) -> bool:
        """The usual case the kernels handle: step frames, every rank sends step records."""
        if self.time_mode or not self.has_steps:
            return False
        self.ensure(n_slots)
        return bool((self.newest_end[:n_slots] != NEVER).all())

    def _buffer(self, name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        """A reused scratch array (chunks are at most ``CHUNK`` records): no fresh memory."""
        size = shape[0] * (shape[1] if len(shape) > 1 else 1)
        buf = self._scratch.get(name)
        if buf is None or buf.size < size:
            buf = self._scratch[name] = np.empty(max(size, CHUNK), dtype=dtype)
        return buf[:size].reshape(shape)

    def _place_compiled(
        self, b: ReadyBatch, table: tuple[np.ndarray, np.ndarray], part: slice, n: int
    ) -> None:
        starts, ends = b.starts[part], b.ends[part]
        kind, comm, ebytes = b.kind[part], b.comm[part], b.ebytes[part]
        k, m = starts.shape
        if m <= kernels.SMALL:
            dur = self._buffer("dur", (k, m), np.float64)
            late = self._buffer("late", (k, m), np.float64)
            fastest = self._buffer("fastest", (k,), np.float64)
            kernels.lateness_rows(starts, ends, dur, late, fastest)
        else:  # long rows (a large data-parallel group): numpy's sort is faster
            dur = (ends - starts) * NS
            late, fastest = collective_stats(dur)
        placed = self._buffer("placed", (k, m), np.bool_)
        placed[:] = False
        total = 0
        for index in sorted(self.frames):
            acc = self.frames[index]
            acc.grow(n, self.n_comms)
            got = kernels.place_rows(
                table[0], table[1], starts, dur, late, kind, comm, fastest, ebytes,
                acc.starts, acc.ends, placed,
                acc.busy.reshape(-1), acc.late.reshape(-1), acc.calls.reshape(-1),
                acc.c_transfer, acc.c_bytes, acc.c_calls, NK,
            )  # fmt: skip
            acc.collectives += got
            total += got
            if total == k * m:
                return
        # The rest (no open frame holds it) goes the numpy way: queued while its rank's step
        # record may still come, counted as dropped when its frame is gone.
        slots = table[0][table[1][comm]]
        rest = ~placed
        self._place(
            self.queue,
            {
                "slot": slots[rest],
                "start": starts[rest],
                "dur": dur[rest],
                "late": late[rest],
                "kind": np.broadcast_to(kind[:, None], (k, m))[rest],
            },
            n,
        )
        first = rest[:, 0]
        if first.any():
            self._place(
                self.cqueue,
                {
                    "slot": slots[first, 0],
                    "start": starts[first, 0],
                    "comm": comm[first],
                    "transfer": fastest[first],
                    "ebytes": ebytes[first],
                },
                n,
            )

    # -- attribution ---------------------------------------------------------------------------
    def attribute(self, n_slots: int) -> None:
        """Move queued contributions into their frames (those whose step is known)."""
        for queue in (self.queue, self.cqueue):
            taken = queue.take()
            if taken is not None:
                self._place(queue, taken, n_slots)

    def _place(self, queue: Queue, taken: dict[str, np.ndarray], n_slots: int) -> None:
        """Accumulate contributions into their frames; queue those whose frame is not known
        yet, count those whose frame is gone."""
        frame_ids, found, waiting = self._match(taken["slot"], taken["start"], n_slots)
        n_found = int(np.count_nonzero(found))
        member = queue is self.queue
        if member:
            self.dropped_contributions += found.size - n_found - int(np.count_nonzero(waiting))
        accumulate = self._accumulate if member else self._accumulate_comm
        if n_found == found.size:  # the usual case: no copies
            accumulate(frame_ids, taken, n_slots)
        elif n_found:
            accumulate(frame_ids[found], {k: v[found] for k, v in taken.items()}, n_slots)
        if n_found < found.size and waiting.any():
            self._requeue(queue, {k: v[waiting] for k, v in taken.items()})

    def _match(self, slot: np.ndarray, start: np.ndarray, n_slots: int) -> tuple[np.ndarray, ...]:
        """Frame of each contribution: ``(frame_ids, found, waiting)``.

        The open frame whose step interval, on the contribution's own rank and clock, contains
        its start. Ranks that never send step records fall back to the job-wide interval of each
        frame (clock offsets of a few ms only blur the edges). Time frames are fixed buckets.
        """
        if self.time_mode:
            frame_ids = start // self.time_frame_ns
            found = frame_ids > self.last_closed
            return frame_ids, found, np.zeros(slot.size, dtype=bool)
        if not self.has_steps:
            return np.full(slot.size, -1), np.zeros(slot.size, bool), np.ones(slot.size, bool)
        self.ensure(n_slots)
        newest_own = self.newest_end[slot]
        own = newest_own != NEVER
        all_own = bool(own.all())  # the usual case: every rank sends step records
        frame_ids = np.full(slot.size, -1, dtype=np.int64)
        first = True
        for index in sorted(self.frames):
            acc = self.frames[index]
            acc.grow(n_slots, self.n_comms)
            # A slot without this step's record has start = end = -1 there: starts are >= 0
            # (validated), so nothing of it matches.
            hit = start >= acc.starts[slot]
            hit &= start < acc.ends[slot]
            if not all_own:
                hit &= own
                hit |= ~own & (start >= acc.start_ns) & (start < acc.end_ns)
            if not first:
                hit &= frame_ids < 0
            first = False
            frame_ids[hit] = index
        found = frame_ids >= 0
        if all_own:
            return frame_ids, found, ~found & (start >= newest_own)
        newest_frame = max((a.end_ns for a in self.frames.values()), default=NEVER)
        newest = np.where(own, newest_own, newest_frame)
        return frame_ids, found, ~found & (start >= newest)

    def _requeue(self, queue: Queue, arrays: dict[str, np.ndarray]) -> None:
        size = next(iter(arrays.values())).size
        if size > self.max_queued:
            cut = size - self.max_queued
            self.dropped_contributions += cut
            arrays = {k: v[cut:] for k, v in arrays.items()}
        queue.append(**arrays)

    def _frame(self, fid: int, n_slots: int) -> FrameAcc | None:
        acc = self.frames.get(fid)
        if acc is None and self.time_mode:
            lo = fid * self.time_frame_ns
            acc = self.frames[fid] = FrameAcc(fid, lo, lo + self.time_frame_ns)
        if acc is not None:
            acc.grow(n_slots, self.n_comms)
        return acc

    def _frame_groups(self, frame_ids: np.ndarray) -> list[tuple[int, np.ndarray | None]]:
        """``(frame id, selection)`` for each frame present; selection None: all of them."""
        lo, hi = int(frame_ids.min()), int(frame_ids.max())
        if lo == hi:  # the usual case: one frame
            return [(lo, None)]
        return [(int(fid), frame_ids == fid) for fid in np.unique(frame_ids)]

    def _accumulate(self, frame_ids: np.ndarray, c: dict[str, np.ndarray], n_slots: int) -> None:
        for fid, sel in self._frame_groups(frame_ids):
            acc = self._frame(fid, n_slots)
            if acc is None:
                self.dropped_contributions += frame_ids.size if sel is None else int(sel.sum())
                continue
            s, k, dur, late = (
                (c[name] if sel is None else c[name][sel])
                for name in ("slot", "kind", "dur", "late")
            )
            lo, hi = int(s.min()), int(s.max()) + 1
            flat = s * NK
            flat += k
            add_at(acc.busy.reshape(-1), flat, dur, lo * NK, hi * NK)
            add_at(acc.late.reshape(-1), flat, late, lo * NK, hi * NK)
            add_at(acc.calls.reshape(-1), flat, None, lo * NK, hi * NK)
            acc.collectives += s.size

    def _accumulate_comm(
        self, frame_ids: np.ndarray, c: dict[str, np.ndarray], n_slots: int
    ) -> None:
        for fid, sel in self._frame_groups(frame_ids):
            acc = self._frame(fid, n_slots)
            if acc is None:
                continue
            m, transfer, ebytes = (
                (c[name] if sel is None else c[name][sel])
                for name in ("comm", "transfer", "ebytes")
            )
            lo, hi = int(m.min()), int(m.max()) + 1
            add_at(acc.c_transfer, m, transfer, lo, hi)
            add_at(acc.c_bytes, m, ebytes, lo, hi)
            add_at(acc.c_calls, m, None, lo, hi)
