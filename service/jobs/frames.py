"""Per-step, per-rank signals ("frames") built from step records and completed collectives.

Each completed collective contributes, for every member, its duration and its lateness
to the frame (step) that contains the member's own start time — both taken on the member's clock
— and, once per collective, its transfer time and effective bytes to its communicator's entry in
that frame. A frame is closed when as many ranks reported it as reported the previous one (the
whole announced world for the first), or once event time has moved ``grace`` past its last
record. Jobs without step records get fixed-length time frames.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from failslow.detectors.lateness import collective_stats
from failslow.detectors.types import KINDS, Frame
from failslow.service.ingest.validate import RecordError
from failslow.service.ingest.wire import StepRecord
from failslow.service.jobs import kernels
from failslow.service.jobs.assembly import Outcome, ReadyBatch
from failslow.service.jobs.topology import Topology

NK = len(KINDS)
NS = 1e-9
NEVER = np.iinfo(np.int64).min
CHUNK = 1 << 15  # contributions handled per pass (their temporaries fit in a core's L2 cache)


def _grow(arr: np.ndarray, n: int, fill: float | int) -> np.ndarray:
    if arr.shape[0] >= n:
        return arr
    pad = np.full((n - arr.shape[0], *arr.shape[1:]), fill, dtype=arr.dtype)
    return np.concatenate([arr, pad])


@dataclass(slots=True)
class _FrameAcc:
    index: int
    start_ns: int
    end_ns: int
    step_time: np.ndarray = field(default_factory=lambda: np.empty(0))
    comm: np.ndarray = field(default_factory=lambda: np.empty(0))
    late: np.ndarray = field(default_factory=lambda: np.empty((0, NK)))
    calls: np.ndarray = field(default_factory=lambda: np.empty((0, NK)))
    starts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # per slot, -1 = none
    ends: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    c_transfer: np.ndarray = field(default_factory=lambda: np.empty(0))  # per comm
    c_bytes: np.ndarray = field(default_factory=lambda: np.empty(0))
    c_calls: np.ndarray = field(default_factory=lambda: np.empty(0))
    reported: int = 0
    collectives: int = 0

    def grow(self, n: int, n_comms: int = 0) -> None:
        self.step_time = _grow(self.step_time, n, np.nan)
        self.comm = _grow(self.comm, n, 0.0)
        self.late = _grow(self.late, n, 0.0)
        self.calls = _grow(self.calls, n, 0.0)
        self.starts = _grow(self.starts, n, -1)
        self.ends = _grow(self.ends, n, -1)
        self.c_transfer = _grow(self.c_transfer, n_comms, 0.0)
        self.c_bytes = _grow(self.c_bytes, n_comms, 0.0)
        self.c_calls = _grow(self.c_calls, n_comms, 0.0)


def _add_at(
    out: np.ndarray, index: np.ndarray, weights: np.ndarray | None, lo: int, hi: int
) -> None:
    """``out[index] += weights`` (or ``+= 1``), repeated indices summed in index order, for
    indices known to lie in ``[lo, hi)``: ``np.bincount`` over that span only, so that a chunk
    touching a few thousand slots does not pay for the whole job. Indices past ``out`` are
    ignored."""
    if index.size == 0:
        return
    if hi > out.size:
        keep = index < out.size
        index, hi = index[keep], out.size
        weights = None if weights is None else weights[keep]
        if hi <= lo:
            return
    out[lo:hi] += np.bincount(index - lo, weights=weights, minlength=hi - lo)


class _Queue:
    """Parallel arrays of queued contributions, appended in chunks, taken all at once."""

    def __init__(self, *names: str) -> None:
        self.names = names
        self.chunks: dict[str, list[np.ndarray]] = {n: [] for n in names}

    def __bool__(self) -> bool:
        return bool(self.chunks[self.names[0]])

    def append(self, **arrays: np.ndarray) -> None:
        for name in self.names:
            self.chunks[name].append(arrays[name])

    def take(self) -> dict[str, np.ndarray] | None:
        if not self:
            return None
        out = {n: np.concatenate(c) for n, c in self.chunks.items()}
        for c in self.chunks.values():
            c.clear()
        return out


MEMBER_FIELDS = ("slot", "start", "dur", "late", "kind")
COMM_FIELDS = ("slot", "start", "comm", "transfer", "ebytes")


class FrameBuilder:
    """Builds and closes frames for one job. Memory: O(ranks x ring) + open frames + queues."""

    def __init__(
        self,
        *,
        grace_ns: int,
        time_frame_ns: int,
        max_open_frames: int,
        ring: int = 16,
        max_queued: int = 4_000_000,
        jit: bool | None = None,
    ) -> None:
        """``jit``: use the compiled kernels (None: when numba is installed and
        ``FAILSLOW_JIT`` is not 0)."""
        self.grace_ns = grace_ns
        self.time_frame_ns = time_frame_ns
        self.max_open_frames = max_open_frames
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
        self.frames: dict[int, _FrameAcc] = {}
        self.queue = _Queue(*MEMBER_FIELDS)
        self.cqueue = _Queue(*COMM_FIELDS)
        self.n_comms = 0
        self.has_steps = False
        self.time_mode = False
        self.first_record_ns: int | None = None
        self.last_closed = -1
        self.reporters = 0  # ranks that reported the last closed frame
        self.dropped_contributions = 0
        self.late_steps = 0
        self.steps_seen = 0
        self.last_progress_ns = 0  # newest end of a completed step or collective (event time)

    # -- capacity ----------------------------------------------------------------------------
    def ensure(self, n: int) -> None:
        if n <= self.cap:
            return
        new = max(n, 2 * self.cap, 64)
        self.step_id = _grow(self.step_id, new, -1)
        self.step_start = _grow(self.step_start, new, 0)
        self.step_end = _grow(self.step_end, new, 0)
        self.max_step = _grow(self.max_step, new, -1)
        self.newest_end = _grow(self.newest_end, new, NEVER)
        self.cap = new

    # -- input -------------------------------------------------------------------------------
    def add_step(self, slot: int, rec: StepRecord, n_slots: int) -> Outcome:
        self.ensure(n_slots)
        row = self.step_id[slot]
        hit = np.flatnonzero(row == rec.step)
        if hit.size:
            j = int(hit[0])
            if self.step_start[slot, j] == rec.start_ns and self.step_end[slot, j] == rec.end_ns:
                return Outcome.DUPLICATE
            raise RecordError("conflicting re-send of a stored record")
        if rec.step <= self.max_step[slot] - self.ring:
            return Outcome.DUPLICATE  # older than the ring: treated as a re-send
        j = rec.step % self.ring
        self.step_id[slot, j] = rec.step
        self.step_start[slot, j] = rec.start_ns
        self.step_end[slot, j] = rec.end_ns
        self.max_step[slot] = max(self.max_step[slot], rec.step)
        self.newest_end[slot] = max(self.newest_end[slot], rec.end_ns)
        self.last_progress_ns = max(self.last_progress_ns, rec.end_ns)
        if self.time_mode:
            # Step records after all: drop the time buckets and number frames by step.
            self.frames.clear()
            self.time_mode = False
            self.last_closed = -1
            self.reporters = 0
        self.has_steps = True
        self.steps_seen += 1
        if self.first_record_ns is None:
            self.first_record_ns = rec.start_ns
        if rec.step <= self.last_closed:
            self.late_steps += 1
            return Outcome.NEW
        acc = self.frames.get(rec.step)
        if acc is None:
            acc = self.frames[rec.step] = _FrameAcc(rec.step, rec.start_ns, rec.end_ns)
        acc.grow(n_slots, self.n_comms)
        if np.isnan(acc.step_time[slot]):
            acc.reported += 1
        acc.step_time[slot] = (rec.end_ns - rec.start_ns) * NS
        acc.starts[slot] = rec.start_ns
        acc.ends[slot] = rec.end_ns
        acc.start_ns = min(acc.start_ns, rec.start_ns)
        acc.end_ns = max(acc.end_ns, rec.end_ns)
        return Outcome.NEW

    def add_collectives(self, batches: list[ReadyBatch], topology: Topology) -> None:
        """Compute lateness for batches of completed collectives (one per member count) and
        attribute it to frames.

        Work goes in chunks of about ``CHUNK`` contributions, each attributed at once: the
        temporaries stay in the CPU cache and nothing is queued that can already be placed. What
        cannot be placed yet (its rank's step record has not come) is queued for
        :meth:`attribute`.
        """
        self.n_comms = max(self.n_comms, len(topology.comm_list))
        for b in batches:
            if len(b) == 0:
                continue
            self.last_progress_ns = max(self.last_progress_ns, int(b.ends.max()))
            if self.first_record_ns is None:
                self.first_record_ns = int(b.starts.min())
            n_slots = topology.n_slots
            rows = max(1, CHUNK // b.size)
            if self.jit and self._compiled_ok(n_slots):
                table = topology.slot_table(b.size)
                for lo in range(0, len(b), rows):
                    self._place_compiled(b, table, slice(lo, lo + rows), n_slots)
                continue
            all_slots = topology.member_slots(b.size, b.comm)
            for lo in range(0, len(b), rows):
                part = slice(lo, lo + rows)
                slots, starts = all_slots[part], b.starts[part]
                dur = (b.ends[part] - starts) * NS
                late, fastest = collective_stats(dur)
                self._place(
                    self.queue,
                    {
                        "slot": slots.ravel(),
                        "start": starts.ravel(),
                        "dur": dur.ravel(),
                        "late": late.ravel(),
                        "kind": np.repeat(b.kind[part], b.size),
                    },
                    n_slots,
                )
                # Per collective: the last arriver's duration is (about) the pure transfer time.
                self._place(
                    self.cqueue,
                    {
                        "slot": slots[:, 0],
                        "start": starts[:, 0],
                        "comm": b.comm[part],
                        "transfer": fastest,
                        "ebytes": b.ebytes[part],
                    },
                    n_slots,
                )

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
                acc.comm, acc.late.reshape(-1), acc.calls.reshape(-1),
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

    def _place(self, queue: _Queue, taken: dict[str, np.ndarray], n_slots: int) -> None:
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

    def _requeue(self, queue: _Queue, arrays: dict[str, np.ndarray]) -> None:
        size = next(iter(arrays.values())).size
        if size > self.max_queued:
            cut = size - self.max_queued
            self.dropped_contributions += cut
            arrays = {k: v[cut:] for k, v in arrays.items()}
        queue.append(**arrays)

    def _frame(self, fid: int, n_slots: int) -> _FrameAcc | None:
        acc = self.frames.get(fid)
        if acc is None and self.time_mode:
            lo = fid * self.time_frame_ns
            acc = self.frames[fid] = _FrameAcc(fid, lo, lo + self.time_frame_ns)
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
            _add_at(acc.comm, s, dur, lo, hi)
            flat = s * NK
            flat += k
            _add_at(acc.late.reshape(-1), flat, late, lo * NK, hi * NK)
            _add_at(acc.calls.reshape(-1), flat, None, lo * NK, hi * NK)
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
            _add_at(acc.c_transfer, m, transfer, lo, hi)
            _add_at(acc.c_bytes, m, ebytes, lo, hi)
            _add_at(acc.c_calls, m, None, lo, hi)

    # -- closing -------------------------------------------------------------------------------
    def advance(
        self, watermark_ns: int, n_slots: int, *, flush: bool = False, world: int | None = None
    ) -> list[Frame]:
        """Attribute queued contributions and close every frame that is due, oldest first.

        A step frame is complete once as many ranks reported it as reported the previous one
        (for the first frame: the announced world size); otherwise it closes ``grace`` after its
        last record in event time.
        """
        if (
            not self.has_steps
            and not self.time_mode
            and self.first_record_ns is not None
            and (
                flush
                or watermark_ns - self.first_record_ns > self.grace_ns + 2 * self.time_frame_ns
            )
        ):
            self.time_mode = True  # nobody sends step records: fall back to time frames
        self.attribute(n_slots)
        closed: list[Frame] = []
        for index in sorted(self.frames):
            acc = self.frames[index]
            if self.time_mode and not self.has_steps:
                due = flush or watermark_ns >= acc.end_ns + self.grace_ns
            else:
                expected = self.reporters if self.last_closed >= 0 else (world or 0)
                complete = expected > 0 and acc.reported >= expected
                due = flush or complete or watermark_ns >= acc.end_ns + self.grace_ns
            if not due and len(self.frames) - len(closed) > self.max_open_frames:
                due = True  # bound memory: close the oldest early
            if not due:
                break
            closed.append(self._close(acc, n_slots))
        return closed

    def _close(self, acc: _FrameAcc, n_slots: int) -> Frame:
        del self.frames[acc.index]
        acc.grow(n_slots, self.n_comms)
        self.last_closed = acc.index
        if self.has_steps:
            self.reporters = acc.reported
        return Frame(
            index=acc.index,
            has_steps=self.has_steps,
            start_ns=acc.start_ns,
            end_ns=acc.end_ns,
            step_time=acc.step_time,
            comm_time=acc.comm,
            late=acc.late,
            calls=acc.calls,
            collectives=acc.collectives,
            comm_transfer=acc.c_transfer,
            comm_bytes=acc.c_bytes,
            comm_calls=acc.c_calls,
        )
