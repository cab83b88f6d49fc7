"""Per-step, per-rank signals ("frames") built from step records and completed collectives.

Each completed collective contributes, for every member, its duration, its wait and its lateness
to the frame (step) that contains the member's own start time — both taken on the member's clock
— and, once per collective, its transfer time and effective bytes to its communicator's entry in
that frame. A frame is closed when as many ranks reported it as reported the previous one (the
whole announced world for the first), or once event time has moved ``grace`` past its last
record. Jobs without step records get fixed-length time frames.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from detectors.lateness import collective_lateness
from detectors.types import KINDS, Frame
from service.ingest.validate import RecordError
from service.ingest.wire import StepRecord
from service.jobs.assembly import Outcome, ReadyBatch
from service.jobs.topology import Topology

NK = len(KINDS)
NS = 1e-9
NEVER = np.iinfo(np.int64).min


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
    wait: np.ndarray = field(default_factory=lambda: np.empty(0))
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
        self.wait = _grow(self.wait, n, 0.0)
        self.late = _grow(self.late, n, 0.0)
        self.calls = _grow(self.calls, n, 0.0)
        self.starts = _grow(self.starts, n, -1)
        self.ends = _grow(self.ends, n, -1)
        self.c_transfer = _grow(self.c_transfer, n_comms, 0.0)
        self.c_bytes = _grow(self.c_bytes, n_comms, 0.0)
        self.c_calls = _grow(self.c_calls, n_comms, 0.0)


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


MEMBER_FIELDS = ("slot", "start", "dur", "late", "wait", "kind")
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
    ) -> None:
        self.grace_ns = grace_ns
        self.time_frame_ns = time_frame_ns
        self.max_open_frames = max_open_frames
        self.ring = ring
        self.max_queued = max_queued
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
        queue it."""
        self.n_comms = max(self.n_comms, len(topology.comm_list))
        for b in batches:
            if len(b) == 0:
                continue
            slots = topology.member_slots(b.size, b.comm)
            dur = (b.ends - b.starts) * NS
            self.last_progress_ns = max(self.last_progress_ns, int(b.ends.max()))
            late, wait = collective_lateness(dur)
            self.queue.append(
                slot=slots.ravel(),
                start=b.starts.ravel(),
                dur=dur.ravel(),
                late=late.ravel(),
                wait=wait.ravel(),
                kind=np.repeat(b.kind, b.size),
            )
            # Per collective: the last arriver's duration is (about) the pure transfer time.
            self.cqueue.append(
                slot=slots[:, 0],
                start=b.starts[:, 0],
                comm=b.comm,
                transfer=dur.min(axis=1),
                ebytes=b.ebytes,
            )
            if self.first_record_ns is None:
                self.first_record_ns = int(b.starts.min())

    # -- attribution ---------------------------------------------------------------------------
    def attribute(self, n_slots: int) -> None:
        """Move queued contributions into their frames (those whose step is known)."""
        for queue, accumulate in (
            (self.queue, self._accumulate),
            (self.cqueue, self._accumulate_comm),
        ):
            taken = queue.take()
            if taken is None:
                continue
            frame_ids, found, waiting = self._match(taken["slot"], taken["start"], n_slots)
            n_found = int(found.sum())
            if queue is self.queue:
                self.dropped_contributions += found.size - n_found - int(waiting.sum())
            if n_found == found.size:  # the usual case: no copies
                accumulate(frame_ids, taken, n_slots)
            elif n_found:
                accumulate(frame_ids[found], {k: v[found] for k, v in taken.items()}, n_slots)
            if waiting.any():
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
        for index in sorted(self.frames):
            acc = self.frames[index]
            acc.grow(n_slots, self.n_comms)
            # per slot (small): a slot without this step's record matches nothing
            end = np.where(acc.starts >= 0, acc.ends, NEVER)
            hit = start >= acc.starts[slot]
            hit &= start < end[slot]
            if not all_own:
                hit &= own
                hit |= ~own & (start >= acc.start_ns) & (start < acc.end_ns)
            hit &= frame_ids < 0
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

    def _accumulate(self, frame_ids: np.ndarray, c: dict[str, np.ndarray], n_slots: int) -> None:
        ids = np.unique(frame_ids)
        for fid in ids:
            acc = self._frame(int(fid), n_slots)
            sel = None if ids.size == 1 else frame_ids == fid
            if acc is None:
                self.dropped_contributions += frame_ids.size if sel is None else int(sel.sum())
                continue
            s, k, dur, wait, late = (
                (c[name] if sel is None else c[name][sel])
                for name in ("slot", "kind", "dur", "wait", "late")
            )
            n = acc.comm.size
            acc.comm += np.bincount(s, weights=dur, minlength=n)[:n]
            acc.wait += np.bincount(s, weights=wait, minlength=n)[:n]
            flat = s * NK + k
            acc.late += np.bincount(flat, weights=late, minlength=n * NK)[: n * NK].reshape(n, NK)
            acc.calls += np.bincount(flat, minlength=n * NK)[: n * NK].reshape(n, NK)
            acc.collectives += s.size

    def _accumulate_comm(
        self, frame_ids: np.ndarray, c: dict[str, np.ndarray], n_slots: int
    ) -> None:
        for fid in np.unique(frame_ids):
            sel = frame_ids == fid
            acc = self._frame(int(fid), n_slots)
            if acc is None:
                continue
            m = c["comm"][sel]
            n = acc.c_calls.size
            acc.c_transfer += np.bincount(m, weights=c["transfer"][sel], minlength=n)[:n]
            acc.c_bytes += np.bincount(m, weights=c["ebytes"][sel], minlength=n)[:n]
            acc.c_calls += np.bincount(m, minlength=n)[:n]

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
            wait=acc.wait,
            late=acc.late,
            calls=acc.calls,
            collectives=acc.collectives,
            comm_transfer=acc.c_transfer,
            comm_bytes=acc.c_bytes,
            comm_calls=acc.c_calls,
        )
