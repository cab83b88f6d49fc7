"""The join and the frames of one job, or of one shard's communicators (:mod:`.shards`).

An :class:`Assembly` takes validated member records (staged for the join) and accepted step
records, joins the staged records into whole collectives and places their lateness in frames.
It works against a *comm table*: the job's :class:`~failslow.service.stream.topology.Topology`
in the process that owns the job, or a :class:`~failslow.service.stream.shards.table.CommTable`
(its comms' sizes, kinds and member slots, nothing else) in a shard process. Both give
``n_slots``, ``n_comms``, ``comm_arrays()``, ``slot_table(size)`` and ``member_slots(size,
comms)``.
"""

from __future__ import annotations

import numpy as np

from failslow.service.stream.frames import FrameBuilder
from failslow.service.stream.join import Joiner
from failslow.service.stream.records import Outcome, RecordError, StepRecord
from failslow.service.stream.settings import Limits, StateSettings
from failslow.service.stream.topology import CommTable

STEP_RING = 16  # step records remembered per rank
JOIN_EVERY_STEPS = STEP_RING // 2  # join before a rank's step intervals could be recycled


class Assembly:
    """Staged and pending member records (:class:`Joiner`) and frames (:class:`FrameBuilder`).
    Mutated only under its job's lock (or in its shard process)."""

    def __init__(self, settings: StateSettings, limits: Limits) -> None:
        retention_ns = int(settings.retention_s * 1e9)
        self.joiner = Joiner(max_pending=limits.pending, retention_ns=retention_ns)
        self.frames = FrameBuilder(
            grace_ns=int(settings.frame_grace_s * 1e9),
            time_frame_ns=int(settings.time_frame_s * 1e9),
            max_open_frames=settings.max_open_frames,
            ring=STEP_RING,
        )
        self.pending_limit = limits.pending
        self.steps_since_join = np.zeros(0, np.int64)  # per slot

    def scale(self, limits: Limits) -> None:
        self.joiner.max_pending = self.pending_limit = limits.pending

    # -- input ---------------------------------------------------------------------------------
    def stage(self, members: dict[str, np.ndarray], table: CommTable) -> None:
        """Validated member records for the join (see :data:`join.COLUMNS`)."""
        self.joiner.stage(members, table.n_slots)
        if self.joiner.staged_records > self.pending_limit:
            self.drain_ready(table)  # bound what waits for the next pass

    def add_step(self, slot: int, rec: StepRecord, table: CommTable) -> Outcome:
        """Add one step record (raises RecordError on a conflicting re-send). Staged
        collectives are joined first when this rank's step intervals could otherwise be
        recycled before they were placed."""
        self._guard_ring(np.array([slot]), table)
        return self.frames.add_step(slot, rec, table.n_slots)

    def add_steps(
        self,
        slot: np.ndarray,
        step: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        table: CommTable,
        work: np.ndarray | None = None,
    ) -> tuple[np.ndarray, list[tuple[int, RecordError]]]:
        """Many step records at once (see :meth:`FrameBuilder.add_steps`)."""
        distinct = len(set(slot.tolist())) == slot.size
        self._guard_ring(slot, table, distinct)
        return self.frames.add_steps(slot, step, start, end, table.n_slots, distinct, work=work)

    def _guard_ring(self, slots: np.ndarray, table: CommTable, distinct: bool = False) -> None:
        n = table.n_slots
        if self.steps_since_join.size < n:
            self.steps_since_join = np.concatenate(
                [self.steps_since_join, np.zeros(n - self.steps_since_join.size, np.int64)]
            )
        if not slots.size:
            return
        if distinct or slots.size == 1:
            if int(self.steps_since_join[slots].max()) + 1 > JOIN_EVERY_STEPS:
                self.drain_ready(table)
            self.steps_since_join[slots] += 1
            return
        per_slot = np.unique(slots, return_counts=True)[1].max()
        if int(self.steps_since_join[slots].max()) + int(per_slot) > JOIN_EVERY_STEPS:
            self.drain_ready(table)
        np.add.at(self.steps_since_join, slots, 1)

    # -- the join ------------------------------------------------------------------------------
    def drain_ready(self, table: CommTable) -> None:
        """Join what is staged and hand completed collectives to the frame builder (lateness
        is computed there)."""
        if self.joiner.staged:
            sizes, kinds = table.comm_arrays()
            self.frames.add_collectives(self.joiner.join(sizes, kinds), table)
        self.steps_since_join[:] = 0

    def expire(self, watermark_ns: int) -> np.ndarray:
        """Drop incomplete collectives past retention: their (comm, seq) as an (n, 2) array."""
        return self.joiner.expire(watermark_ns)
