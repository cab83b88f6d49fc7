"""Per-step, per-rank signals ("frames") built from step records and completed collectives.

Each completed collective contributes, for every member, its duration, its wait and its lateness
to the frame (step) that contains the member's own start time — both taken on the member's clock.
A frame is closed when every regular reporter has reported that step, or once event time has
moved ``grace`` past its last record. Jobs without step records get fixed-length time frames.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from detectors.lateness import collective_lateness
from detectors.types import KINDS, Frame
from service.ingest.validate import RecordError
from service.ingest.wire import StepRecord
from service.jobs.assembly import Completed, Outcome

NK = len(KINDS)
NS = 1e-9
NEVER = np.iinfo(np.int64).min


@dataclass(slots=True)
class _FrameAcc:
    index: int
    n: int
    step_time: np.ndarray
    comm: np.ndarray
    wait: np.ndarray
    late: np.ndarray
    calls: np.ndarray
    start_ns: int
    end_ns: int
    starts: np.ndarray  # per slot: this step's start on the rank's clock (-1 = not reported)
    ends: np.ndarray
    reported: int = 0
    collectives: int = 0

    @staticmethod
    def new(index: int, n: int, start_ns: int, end_ns: int) -> _FrameAcc:
        return _FrameAcc(
            index,
            n,
            np.full(n, np.nan),
            np.zeros(n),
            np.zeros(n),
            np.zeros((n, NK)),
            np.zeros((n, NK)),
            start_ns,
            end_ns,
            np.full(n, -1, dtype=np.int64),
            np.full(n, -1, dtype=np.int64),
        )

    def grow(self, n: int) -> None:
        if n <= self.n:
            return
        extra = n - self.n
        self.starts = np.concatenate([self.starts, np.full(extra, -1, dtype=np.int64)])
        self.ends = np.concatenate([self.ends, np.full(extra, -1, dtype=np.int64)])
        self.step_time = np.concatenate([self.step_time, np.full(extra, np.nan)])
        self.comm = np.concatenate([self.comm, np.zeros(extra)])
        self.wait = np.concatenate([self.wait, np.zeros(extra)])
        self.late = np.vstack([self.late, np.zeros((extra, NK))])
        self.calls = np.vstack([self.calls, np.zeros((extra, NK))])
        self.n = n


@dataclass(slots=True)
class _Contrib:
    """Queued per-member contributions awaiting their step record (parallel arrays)."""

    slot: list[np.ndarray] = field(default_factory=list)
    start: list[np.ndarray] = field(default_factory=list)
    dur: list[np.ndarray] = field(default_factory=list)
    late: list[np.ndarray] = field(default_factory=list)
    wait: list[np.ndarray] = field(default_factory=list)
    kind: list[np.ndarray] = field(default_factory=list)

    def append(self, *arrays: np.ndarray) -> None:
        for store, arr in zip(
            (self.slot, self.start, self.dur, self.late, self.wait, self.kind), arrays, strict=True
        ):
            store.append(arr)

    def take(self) -> tuple[np.ndarray, ...] | None:
        if not self.slot:
            return None
        out = tuple(
            np.concatenate(store)
            for store in (self.slot, self.start, self.dur, self.late, self.wait, self.kind)
        )
        for store in (self.slot, self.start, self.dur, self.late, self.wait, self.kind):
            store.clear()
        return out


class FrameBuilder:
    """Builds and closes frames for one job. Memory: O(ranks x ring) + open frames + queue."""

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
        self.step_id = np.empty((0, ring), dtype=np.int64)
        self.step_start = np.empty((0, ring), dtype=np.int64)  # start/end only to compare re-sends
        self.step_end = np.empty((0, ring), dtype=np.int64)
        self.max_step = np.empty(0, dtype=np.int64)
        self.newest_end = np.empty(0, dtype=np.int64)  # per slot: end of its newest step record
        self.frames: dict[int, _FrameAcc] = {}
        self.queue = _Contrib()
        self.has_steps = False
        self.time_mode = False
        self.first_record_ns: int | None = None
        self.last_closed = -1
        self.reporters = 0  # ranks that reported the last closed frame
        self.dropped_contributions = 0
        self.late_steps = 0
        self.steps_seen = 0

    # -- capacity ----------------------------------------------------------------------------
    def ensure(self, n: int) -> None:
        if n <= self.cap:
            return
        new = max(n, 2 * self.cap, 64)
        extra = new - self.cap
        self.step_id = np.vstack([self.step_id, np.full((extra, self.ring), -1, dtype=np.int64)])
        self.step_start = np.vstack([self.step_start, np.zeros((extra, self.ring), np.int64)])
        self.step_end = np.vstack([self.step_end, np.zeros((extra, self.ring), np.int64)])
        self.max_step = np.concatenate([self.max_step, np.full(extra, -1, dtype=np.int64)])
        self.newest_end = np.concatenate([self.newest_end, np.full(extra, NEVER, dtype=np.int64)])
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
        j = rec.step % self.ring  # the ring only remembers recent steps to recognise re-sends
        self.step_id[slot, j] = rec.step
        self.step_start[slot, j] = rec.start_ns
        self.step_end[slot, j] = rec.end_ns
        self.max_step[slot] = max(self.max_step[slot], rec.step)
        self.newest_end[slot] = max(self.newest_end[slot], rec.end_ns)
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
            acc = self.frames[rec.step] = _FrameAcc.new(rec.step, n_slots, rec.start_ns, rec.end_ns)
        acc.grow(n_slots)
        if np.isnan(acc.step_time[slot]):
            acc.reported += 1
        acc.step_time[slot] = (rec.end_ns - rec.start_ns) * NS
        acc.starts[slot] = rec.start_ns
        acc.ends[slot] = rec.end_ns
        acc.start_ns = min(acc.start_ns, rec.start_ns)
        acc.end_ns = max(acc.end_ns, rec.end_ns)
        return Outcome.NEW

    def add_collectives(self, completed: list[Completed]) -> None:
        """Compute lateness for a batch of completed collectives (grouped by size) and queue it."""
        by_size: dict[int, list[Completed]] = {}
        for c in completed:
            by_size.setdefault(c.slots.size, []).append(c)
        for size, group in by_size.items():
            if size < 1:
                continue
            slots = np.stack([c.slots for c in group])
            starts = np.array([c.starts for c in group], dtype=np.int64)
            ends = np.array([c.ends for c in group], dtype=np.int64)
            kinds = np.repeat(np.array([c.kind for c in group], dtype=np.int64)[:, None], size, 1)
            dur = (ends - starts) * NS
            late, wait = collective_lateness(dur)
            self.queue.append(
                slots.ravel(),
                starts.ravel(),
                dur.ravel(),
                late.ravel(),
                wait.ravel(),
                kinds.ravel(),
            )
            if self.first_record_ns is None:
                self.first_record_ns = int(starts.min())

    # -- attribution ---------------------------------------------------------------------------
    def attribute(self, n_slots: int) -> None:
        """Move queued contributions into their frames (those whose step is known)."""
        self._attribute(n_slots)

    def _attribute(self, n_slots: int) -> None:
        taken = self.queue.take()
        if taken is None:
            return
        slot, start, dur, late, wait, kind = taken
        if self.time_mode:
            frame_ids = start // self.time_frame_ns
            keep = frame_ids > self.last_closed
            self.dropped_contributions += int((~keep).sum())
            self._accumulate(
                frame_ids[keep], slot[keep], dur[keep], late[keep], wait[keep], kind[keep], n_slots
            )
            return
        if not self.has_steps:
            self._requeue(slot, start, dur, late, wait, kind)
            return
        self.ensure(n_slots)
        # Match each contribution to the open frame whose step interval, on the contribution's
        # own rank and clock, contains its start. Ranks that never send step records fall back
        # to the job-wide interval of each frame (clock offsets of a few ms only blur the edges).
        own = self.newest_end[slot] != NEVER
        frame_ids = np.full(slot.size, -1, dtype=np.int64)
        for index in sorted(self.frames):
            acc = self.frames[index]
            acc.grow(n_slots)
            st, en = acc.starts[slot], acc.ends[slot]
            hit = own & (st >= 0) & (start >= st) & (start < en)
            hit |= ~own & (start >= acc.start_ns) & (start < acc.end_ns)
            frame_ids = np.where((frame_ids < 0) & hit, index, frame_ids)
        found = frame_ids >= 0
        newest = np.where(
            own, self.newest_end[slot], max((a.end_ns for a in self.frames.values()), default=NEVER)
        )
        waiting = ~found & (start >= newest)
        self.dropped_contributions += int((~found & ~waiting).sum())
        self._accumulate(
            frame_ids[found],
            slot[found],
            dur[found],
            late[found],
            wait[found],
            kind[found],
            n_slots,
        )
        if waiting.any():
            self._requeue(
                slot[waiting],
                start[waiting],
                dur[waiting],
                late[waiting],
                wait[waiting],
                kind[waiting],
            )

    def _requeue(self, *arrays: np.ndarray) -> None:
        size = arrays[0].size
        if size > self.max_queued:
            cut = size - self.max_queued
            self.dropped_contributions += cut
            arrays = tuple(a[cut:] for a in arrays)
        self.queue.append(*arrays)

    def _accumulate(
        self,
        frame_ids: np.ndarray,
        slot: np.ndarray,
        dur: np.ndarray,
        late: np.ndarray,
        wait: np.ndarray,
        kind: np.ndarray,
        n_slots: int,
    ) -> None:
        if frame_ids.size == 0:
            return
        for fid in np.unique(frame_ids):
            sel = frame_ids == fid
            acc = self.frames.get(int(fid))
            if acc is None:
                if not self.time_mode:
                    self.dropped_contributions += int(sel.sum())
                    continue
                lo = int(fid) * self.time_frame_ns
                acc = self.frames[int(fid)] = _FrameAcc.new(
                    int(fid), n_slots, lo, lo + self.time_frame_ns
                )
            acc.grow(n_slots)
            s = slot[sel]
            np.add.at(acc.comm, s, dur[sel])
            np.add.at(acc.wait, s, wait[sel])
            np.add.at(acc.late, (s, kind[sel]), late[sel])
            np.add.at(acc.calls, (s, kind[sel]), 1.0)
            acc.collectives += int(sel.sum())

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
        self._attribute(n_slots)
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
        acc.grow(n_slots)
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
        )
