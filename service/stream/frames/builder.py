"""Per-step, per-rank signals ("frames") built from step records and completed collectives.

Each completed collective contributes, for every member, its duration and its lateness
to the frame (step) that contains the member's own start time — both taken on the member's clock
— and, once per collective, its transfer time and effective bytes to its communicator's entry in
that frame (:mod:`~failslow.service.stream.frames.placement`). A frame is closed when as many ranks
reported it as reported the previous one (the whole announced world for the first), or once event
time has moved ``grace`` past its last record. Jobs without step records get fixed-length time
frames.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from failslow.detectors.lateness import collective_stats
from failslow.detectors.types import Frame
from failslow.service.stream.frames.accumulator import CHUNK, NS, FrameAcc
from failslow.service.stream.frames.placement import Placement
from failslow.service.stream.join import ReadyBatch
from failslow.service.stream.records import Outcome, RecordError, Reject, StepRecord
from failslow.service.stream.topology import CommTable


class FrameBuilder(Placement):
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
        super().__init__(time_frame_ns=time_frame_ns, ring=ring, max_queued=max_queued, jit=jit)
        self.grace_ns = grace_ns
        self.max_open_frames = max_open_frames
        self.first_record_ns: int | None = None
        self.reporters = 0  # ranks that reported the last closed frame
        self.late_steps = 0
        self.steps_seen = 0
        self.last_progress_ns = 0  # newest end of a completed step or collective (event time)

    # -- input -------------------------------------------------------------------------------
    def add_step(self, slot: int, rec: StepRecord, n_slots: int) -> Outcome:
        self.ensure(n_slots)
        row = self.step_id[slot]
        hit = np.flatnonzero(row == rec.step)
        if hit.size:
            j = int(hit[0])
            if self.step_start[slot, j] == rec.start_ns and self.step_end[slot, j] == rec.end_ns:
                return Outcome.DUPLICATE
            raise RecordError(Reject.CONFLICT, "conflicting re-send of a stored record")
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
            acc = self.frames[rec.step] = FrameAcc(rec.step, rec.start_ns, rec.end_ns)
        acc.grow(n_slots, self.n_comms)
        if np.isnan(acc.step_time[slot]):
            acc.reported += 1
        acc.step_time[slot] = (rec.end_ns - rec.start_ns) * NS
        acc.work[slot] = rec.work
        acc.starts[slot] = rec.start_ns
        acc.ends[slot] = rec.end_ns
        acc.start_ns = min(acc.start_ns, rec.start_ns)
        acc.end_ns = max(acc.end_ns, rec.end_ns)
        return Outcome.NEW

    def add_steps(
        self,
        slot: np.ndarray,
        step: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        n_slots: int,
        distinct: bool | None = None,
        work: np.ndarray | None = None,
    ) -> tuple[np.ndarray, list[tuple[int, RecordError]]]:
        """Many step records at once: ``(fresh, errors)`` — which were new (the others were
        re-sends), and the index and error of each conflicting one. The same as
        :meth:`add_step` record by record; whole arrays when every slot appears once and no
        record is already known (the usual envelope), record by record otherwise. ``distinct``:
        whether the caller already knows that every slot appears once. ``work``: each record's
        work (NaN: not said), or None."""
        n = int(slot.size)
        fresh = np.zeros(n, dtype=bool)
        errors: list[tuple[int, RecordError]] = []
        if not n:
            return fresh, errors
        self.ensure(n_slots)
        if distinct is None:
            distinct = len(set(slot.tolist())) == n
        known = (self.step_id[slot] == step[:, None]).any(axis=1)
        if not distinct or self.time_mode or known.any():
            for i in range(n):
                w = float(work[i]) if work is not None else float("nan")
                rec = StepRecord(0, int(step[i]), int(start[i]), int(end[i]), w)
                try:
                    fresh[i] = self.add_step(int(slot[i]), rec, n_slots) is Outcome.NEW
                except RecordError as exc:
                    errors.append((i, exc))
            return fresh, errors
        fresh = step > self.max_step[slot] - self.ring  # older than the ring: a re-send
        if not fresh.all():
            slot, step, start, end = slot[fresh], step[fresh], start[fresh], end[fresh]
            work = work[fresh] if work is not None else None
        if not slot.size:
            return fresh, errors
        j = step % self.ring
        self.step_id[slot, j] = step
        self.step_start[slot, j] = start
        self.step_end[slot, j] = end
        self.max_step[slot] = np.maximum(self.max_step[slot], step)
        self.newest_end[slot] = np.maximum(self.newest_end[slot], end)
        self.last_progress_ns = max(self.last_progress_ns, int(end.max()))
        self.has_steps = True
        self.steps_seen += int(slot.size)
        if self.first_record_ns is None:
            self.first_record_ns = int(start[0])
        late = step <= self.last_closed
        self.late_steps += int(late.sum())
        s0 = int(step[0])
        if not late.any() and (step == s0).all():  # the usual envelope: one step
            groups: list[tuple[int, Any]] = [(s0, slice(None))]
        else:
            groups = [(s, step == s) for s in np.unique(step[~late]).tolist()]
        for s, mine in groups:
            sl, st, en = slot[mine], start[mine], end[mine]
            acc = self.frames.get(s)
            if acc is None:
                acc = self.frames[s] = FrameAcc(s, int(st[0]), int(en[0]))
            acc.grow(n_slots, self.n_comms)
            acc.reported += int(np.isnan(acc.step_time[sl]).sum())
            acc.step_time[sl] = (en - st) * NS
            if work is not None:
                acc.work[sl] = work[mine]
            acc.starts[sl] = st
            acc.ends[sl] = en
            acc.start_ns = min(acc.start_ns, int(st.min()))
            acc.end_ns = max(acc.end_ns, int(en.max()))
        return fresh, errors

    def add_collectives(self, batches: list[ReadyBatch], topology: CommTable) -> None:
        """Compute lateness for batches of completed collectives (one per member count) and
        attribute it to frames.

        Work goes in chunks of about ``CHUNK`` contributions, each attributed at once: the
        temporaries stay in the CPU cache and nothing is queued that can already be placed. What
        cannot be placed yet (its rank's step record has not come) is queued for
        :meth:`attribute`.
        """
        self.n_comms = max(self.n_comms, topology.n_comms)
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

    # -- closing -------------------------------------------------------------------------------
    def advance(
        self,
        watermark_ns: int,
        n_slots: int,
        *,
        flush: bool = False,
        world: int | None = None,
        time_mode: bool | None = None,
    ) -> list[Frame]:
        """Attribute queued contributions and close every frame that is due, oldest first.

        A step frame is complete once as many ranks reported it as reported the previous one
        (for the first frame: the announced world size); otherwise it closes ``grace`` after its
        last record in event time. ``time_mode``: whether the job has fallen back to time frames,
        as the job's owner decided (a shard, :mod:`..shards`); None: decide here.
        """
        if time_mode is not None:
            if time_mode and not self.has_steps:
                self.time_mode = True
        elif (
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

    def _close(self, acc: FrameAcc, n_slots: int) -> Frame:
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
            comm_time=acc.busy.sum(axis=1),
            late=acc.late,
            calls=acc.calls,
            collectives=acc.collectives,
            comm_transfer=acc.c_transfer,
            comm_bytes=acc.c_bytes,
            comm_calls=acc.c_calls,
            busy=acc.busy,
            work=acc.work,
        )
