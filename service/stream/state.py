"""Per-job in-memory state: topology, staged and pending collectives, frames, stream positions.

An envelope is applied by :mod:`~failslow.service.stream.v1` (JSON, record by record) or
:mod:`~failslow.service.stream.columnar` (v2 columns, whole arrays); both stage member records for
the join (:mod:`~failslow.service.stream.join`), which runs at the start of every detection pass.

Bounds (see docs/memory.md): ranks <= ``max_ranks``, comms <= ``max_comms``, collectives being
assembled <= ``max_pending_collectives`` and no older than ``retention_s`` of event time,
v1 member records remembered for re-sends <= ``max_done_collectives``, open frames <=
``max_open_frames``, per-rank step ring of 16 steps.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from failslow.service.stream.clock import EventClock
from failslow.service.stream.frames import FrameBuilder
from failslow.service.stream.join import Joiner
from failslow.service.stream.ledger import Ledger
from failslow.service.stream.records import (
    Envelope,
    Outcome,
    RecordError,
    RecordKind,
    Reject,
    StepRecord,
)
from failslow.service.stream.settings import Limits, StateSettings
from failslow.service.stream.topology import Topology

if TYPE_CHECKING:
    from failslow.service.stream.columnar import HostTopology

STEP_RING = 16  # step records remembered per rank
JOIN_EVERY_STEPS = STEP_RING // 2  # join before a rank's step intervals could be recycled


@dataclass(slots=True)
class HostDelta:
    """Ingest counters not yet committed to the database (additive, so safe to carry over)."""

    envelopes: int = 0
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    first_seen_ns: int | None = None
    last_seen_ns: int = 0


@dataclass(slots=True)
class ApplyResult:
    accepted: int = 0
    duplicates: int = 0
    rejected: list[dict[str, str]] = field(default_factory=list)
    reasons: list[Reject] = field(default_factory=list)  # per rejection, for metrics
    kinds: dict[RecordKind, int] = field(default_factory=dict)  # accepted per record kind
    batch_duplicate: bool = False

    def reject(self, loc: str, exc: RecordError) -> None:
        self.rejected.append({"index": loc, "reason": str(exc)})
        self.reasons.append(exc.code)

    def count(self, kind: RecordKind, accepted: int, duplicates: int = 0) -> None:
        self.duplicates += duplicates
        if accepted:
            self.accepted += accepted
            self.kinds[kind] = self.kinds.get(kind, 0) + accepted


class JobState:
    """Everything the service holds in memory for one job. Mutate only under ``lock``."""

    def __init__(self, job: str, settings: StateSettings) -> None:
        self.job = job
        self.lock = threading.RLock()
        self.settings = settings
        self.limits = Limits.of(settings, None)
        self.topology = Topology(
            max_ranks=settings.max_ranks,
            max_comms=self.limits.comms,
            max_comm_members=self.limits.comm_members,
        )
        self.joiner = Joiner(
            max_pending=self.limits.pending, retention_ns=int(settings.retention_s * 1e9)
        )
        self.ledger = Ledger(max_entries=self.limits.done)
        self._limits_world: int | None = None
        self.frames = FrameBuilder(
            grace_ns=int(settings.frame_grace_s * 1e9),
            time_frame_ns=int(settings.time_frame_s * 1e9),
            max_open_frames=settings.max_open_frames,
            ring=STEP_RING,
        )
        self.registrations: dict[str, OrderedDict[str, HostTopology]] = {}  # v2, per host
        # v2 registrations not yet stored: host -> digest -> canonical JSON
        self.new_registrations: dict[str, dict[str, bytes]] = {}
        # stored before a restart and not used since: host -> digest -> canonical JSON, oldest
        # first; each is registered again when an envelope first names it
        self.stored_registrations: dict[str, dict[str, bytes]] = {}
        self.steps_since_join = np.zeros(0, np.int64)  # per slot
        self.clock = EventClock(
            tolerance_ns=int(settings.clock_tolerance_s * 1e9), live_s=settings.clock_live_s
        )
        self.first_seen_ns: int | None = None
        self.last_wall = time.monotonic()
        self.streams: dict[tuple[str, str], int] = {}  # (host, agent) -> last batch_seq
        self.dirty_streams: set[tuple[str, str]] = set()
        self.deltas: dict[str, HostDelta] = {}
        self.persisted = False  # the jobs row exists
        self.committing = 0  # commits in progress that took this job's counters
        self.new_data = False  # something arrived since the last detection pass

    # -- ingest --------------------------------------------------------------------------------
    def apply(self, env: Envelope) -> ApplyResult:
        """Apply a structurally valid v1 envelope; per-record problems are reported, not
        raised."""
        from failslow.service.stream.v1 import apply_v1  # noqa: PLC0415 - one module each way

        return apply_v1(self, env)

    def begin(
        self,
        host: str,
        sent_ns: int,
        agent: str | None,
        batch_seq: int | None,
        records: int,
        *,
        claim: bool = False,
    ) -> ApplyResult:
        """Start applying an envelope. A re-send of a batch already applied comes back with
        ``batch_duplicate`` set (counted as duplicates, nothing else to do). ``claim``: take its
        stream position now, so that a re-send begun before this one finishes is a duplicate
        (envelopes applied together, :mod:`.v2apply`)."""
        wall = time.monotonic()
        stream = (host, agent) if agent is not None else None
        if stream is not None and batch_seq is not None:
            if batch_seq <= self.streams.get(stream, -1):
                self._delta(host, sent_ns).duplicates += records
                return ApplyResult(duplicates=records, batch_duplicate=True)
            if claim:
                self.streams[stream] = batch_seq
                self.dirty_streams.add(stream)
        self.topology.touch_host(host, sent_ns, wall)
        self.last_wall = wall
        if self.first_seen_ns is None:
            self.first_seen_ns = sent_ns
        self.clock.observe(self.topology.host_ids[host], sent_ns, wall)
        return ApplyResult()

    @property
    def watermark_ns(self) -> int:
        """The job's event-time "now" (:class:`~failslow.service.stream.clock.EventClock`)."""
        return self.clock.watermark_ns

    @watermark_ns.setter
    def watermark_ns(self, value: int) -> None:  # restored from the database after a restart
        self.clock.restore(value)

    def scale_limits(self, world: int | None = None) -> None:
        """Bounds from the declared world size (``world``, or the topology's)."""
        world = max(world or 0, self.topology.world_size or 0) or None
        if world == self._limits_world:
            return
        self._limits_world = world
        self.limits = lim = Limits.of(self.settings, world)
        self.topology.max_comms, self.topology.max_comm_members = lim.comms, lim.comm_members
        self.joiner.max_pending = lim.pending
        self.ledger.max_entries = lim.done

    def finish(
        self,
        result: ApplyResult,
        host: str,
        sent_ns: int,
        agent: str | None,
        batch_seq: int | None,
        *,
        settle: bool = True,
    ) -> ApplyResult:
        """End applying an envelope: its counters and stream position become pending commits.
        ``settle``: also :meth:`settle` (envelopes applied together settle once, after all)."""
        if settle:
            self.settle()
        delta = self._delta(host, sent_ns)
        delta.accepted += result.accepted
        delta.duplicates += result.duplicates
        delta.rejected += len(result.rejected)
        if agent is not None and batch_seq is not None:
            self.streams[(host, agent)] = batch_seq
            self.dirty_streams.add((host, agent))
        if result.accepted:
            self.new_data = True
        return result

    def settle(self) -> None:
        """After applying: bounds that follow the job's size, and contributions whose step
        record has come placed in their frames."""
        self.scale_limits()
        self.frames.attribute(self.topology.n_slots)

    def reject_whole(self, host: str, sent_ns: int, records: int) -> None:
        """Count every record of an envelope that could not be applied at all (with a bus, its
        owner did not know the topology it names) as rejected for its host."""
        self._delta(host, sent_ns).rejected += records

    def _delta(self, host: str, sent_ns: int) -> HostDelta:
        delta = self.deltas.get(host)
        if delta is None:
            delta = self.deltas[host] = HostDelta(first_seen_ns=sent_ns)
        delta.envelopes += 1
        delta.last_seen_ns = max(delta.last_seen_ns, sent_ns)
        return delta

    def add_step(self, slot: int, rec: StepRecord) -> Outcome:
        """Add one step record (raises RecordError on a conflicting re-send).
        Staged collectives are joined first when this rank's step intervals could otherwise be
        recycled before they were placed."""
        self._guard_ring(np.array([slot]))
        return self.frames.add_step(slot, rec, self.topology.n_slots)

    def add_steps(
        self,
        slot: np.ndarray,
        step: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        work: np.ndarray | None = None,
    ) -> tuple[np.ndarray, list[tuple[int, RecordError]]]:
        """Many step records at once (see :meth:`FrameBuilder.add_steps`)."""
        distinct = len(set(slot.tolist())) == slot.size
        self._guard_ring(slot, distinct)
        return self.frames.add_steps(
            slot, step, start, end, self.topology.n_slots, distinct, work=work
        )

    def _guard_ring(self, slots: np.ndarray, distinct: bool = False) -> None:
        n = self.topology.n_slots
        if self.steps_since_join.size < n:
            self.steps_since_join = np.concatenate(
                [self.steps_since_join, np.zeros(n - self.steps_since_join.size, np.int64)]
            )
        if not slots.size:
            return
        if distinct or slots.size == 1:
            if int(self.steps_since_join[slots].max()) + 1 > JOIN_EVERY_STEPS:
                self.drain_ready()
            self.steps_since_join[slots] += 1
            return
        per_slot = np.unique(slots, return_counts=True)[1].max()
        if int(self.steps_since_join[slots].max()) + int(per_slot) > JOIN_EVERY_STEPS:
            self.drain_ready()
        np.add.at(self.steps_since_join, slots, 1)

    def stage(self, members: dict[str, np.ndarray]) -> None:
        """Validated member records for the join (see :data:`join.COLUMNS`)."""
        self.joiner.stage(members, self.topology.n_slots)
        if self.joiner.staged_records > self.limits.pending:
            self.drain_ready()  # bound what waits for the next pass

    def drain_ready(self) -> None:
        """Join what is staged and hand completed collectives to the frame builder (lateness
        is computed there)."""
        if self.joiner.staged:
            sizes, kinds = self.topology.comm_arrays()
            self.frames.add_collectives(self.joiner.join(sizes, kinds), self.topology)
        self.steps_since_join[:] = 0

    def expire(self) -> int:
        """Drop incomplete collectives past retention; their re-sends are duplicates now."""
        gone = self.joiner.expire(self.watermark_ns)
        for comm, seq in gone.tolist():
            self.ledger.retire(comm, seq)
        return int(gone.shape[0])

    # -- views ---------------------------------------------------------------------------------
    def idle(self) -> bool:
        """Nothing of it waits to be written: it may leave memory."""
        return not self.deltas and not self.committing

    def host_stale(self, host: str, now_wall: float) -> bool:
        info = self.topology.hosts.get(host)
        if info is None:
            return True
        stale_ns = int(self.settings.stale_after_s * 1e9)
        return (
            self.watermark_ns - info.last_sent_ns > stale_ns
            or now_wall - info.last_wall > self.settings.stale_after_s
        )

    def is_stale(self, now_wall: float) -> bool:
        return now_wall - self.last_wall > self.settings.stale_after_s
