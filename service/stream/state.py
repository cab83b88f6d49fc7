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

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from failslow.detectors.types import Frame
from failslow.service.stream.assembly import Assembly
from failslow.service.stream.clock import EventClock
from failslow.service.stream.frames import FrameBuilder
from failslow.service.stream.join import MAX_BLOCKED, Joiner, PendingGroup
from failslow.service.stream.ledger import Ledger
from failslow.service.stream.quiet import DeliveryLag, HostCadence, InflightDelay
from failslow.service.stream.records import (
    Envelope,
    Outcome,
    RecordError,
    RecordKind,
    Reject,
    StepRecord,
)
from failslow.service.stream.settings import Limits, StateSettings
from failslow.service.stream.shards.pool import Shards, merge_groups
from failslow.service.stream.shards.reduce import reduce_frames
from failslow.service.stream.shards.worker import JoinStats, PassAsk, stats_of
from failslow.service.stream.topology import Topology

if TYPE_CHECKING:
    from failslow.service.stream.columnar import HostTopology

log = logging.getLogger(__name__)

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
        self.assembly = Assembly(settings, self.limits)
        self.ledger = Ledger(max_entries=self.limits.done)
        self._limits_world: int | None = None
        self.shards: Shards | None = None  # the join in other processes (stream/shards)
        self.held_frames: list[Frame] = []  # closed here, waiting for the shards' parts
        self.blocked: list[PendingGroup] = []  # the shards' answers to blocked_groups
        self.registrations: dict[str, OrderedDict[str, HostTopology]] = {}  # v2, per host
        # v2 registrations not yet stored: host -> digest -> canonical JSON
        self.new_registrations: dict[str, dict[str, bytes]] = {}
        # stored before a restart and not used since: host -> digest -> canonical JSON, oldest
        # first; each is registered again when an envelope first names it
        self.stored_registrations: dict[str, dict[str, bytes]] = {}
        self.clock = EventClock(
            tolerance_ns=int(settings.clock_tolerance_s * 1e9), live_s=settings.clock_live_s
        )
        self.first_seen_ns: int | None = None
        self.inflight_delay = InflightDelay()  # how soon in-flight calls are reported (hangs)
        self.delivery_lag = DeliveryLag()  # how late completed ones may be sent (hangs)
        self.cadence = HostCadence()  # how often each host sends (hangs: a silent host)
        self.last_wall = time.monotonic()
        self.streams: dict[tuple[str, str], int] = {}  # (host, agent) -> last batch_seq
        self.dirty_streams: set[tuple[str, str]] = set()
        self.deltas: dict[str, HostDelta] = {}
        self.persisted = False  # the jobs row exists
        self.committing = 0  # commits in progress that took this job's counters
        self.new_data = False  # something arrived since the last detection pass
        self.unsaved = False  # something arrived since the job's last snapshot was taken
        # the last frame index closed, step frames (True) and time frames (False) apart: a
        # frame at or below it is never closed again (shards started again after a failure
        # once closed steps a second time: 33 frames analysed for 30 steps)
        self.closed_through: dict[bool, int] = {}
        self.closed_again = 0  # frames dropped for that

    @property
    def joiner(self) -> Joiner:
        """The join in this process (a sharded job's holds only ``last_end``: its own stays
        empty, see :meth:`join_stats` and :meth:`blocked_groups`)."""
        return self.assembly.joiner

    @property
    def frames(self) -> FrameBuilder:
        """Frames in this process: every step record; a sharded job's collectives are placed
        in its shards and added in :meth:`close_frames`."""
        return self.assembly.frames

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
        self.cadence.note(host, sent_ns, self.clock.watermark_ns)
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

    def scale_limits(self, adding: int = 0) -> None:
        """Bounds from the ranks the job has shown (announced, registered, comm members), never
        from the ``world_size`` it declares (a one-rank registration declaring 2^31-1 ranks
        would scale every bound with it); capped by ``max_ranks``. A job that reaches
        ``shard_min_ranks`` ranks is split over its shard processes. ``adding``: ranks about to
        be registered (checked already) count."""
        world = min(self.topology.n_slots + adding, self.settings.max_ranks) or None
        if world != self._limits_world:
            self._limits_world = world
            self.limits = lim = Limits.of(self.settings, world)
            self.topology.max_comms, self.topology.max_comm_members = lim.comms, lim.comm_members
            self.assembly.scale(lim)
            self.ledger.max_entries = lim.done
            if self.shards is not None:
                self.shards.limits(lim)
        n = self.settings.shards
        if self.shards is None and n and (world or 0) >= self.settings.shard_min_ranks:
            self.shards = Shards(self.job, n, self.settings)
            self.shards.split(self.assembly, self.topology)
            self.shards.limits(self.limits)

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
            self.new_data = self.unsaved = True
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
        """Add one step record (raises RecordError on a conflicting re-send)."""
        out = self.assembly.add_step(slot, rec, self.topology)
        if self.shards is not None and out is Outcome.NEW:
            self.shards.steps(np.array([slot]), np.array([rec.step]), np.array([rec.start_ns]),
                              np.array([rec.end_ns]), np.array([rec.work]),
                              self.topology)  # fmt: skip
        return out

    def add_steps(
        self,
        slot: np.ndarray,
        step: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        work: np.ndarray | None = None,
    ) -> tuple[np.ndarray, list[tuple[int, RecordError]]]:
        """Many step records at once (see :meth:`FrameBuilder.add_steps`)."""
        fresh, errors = self.assembly.add_steps(slot, step, start, end, self.topology, work)
        if self.shards is not None and fresh.any():
            w = None if work is None else work[fresh]
            self.shards.steps(slot[fresh], step[fresh], start[fresh], end[fresh], w, self.topology)
        return fresh, errors

    def stage(self, members: dict[str, np.ndarray]) -> None:
        """Validated member records for the join (see :data:`join.COLUMNS`)."""
        if self.shards is None:
            self.assembly.stage(members, self.topology)
            return
        frames = self.assembly.frames
        if frames.first_record_ns is None and members["start"].size:
            frames.first_record_ns = int(members["start"].min())  # for the time-frame fallback
        self.assembly.joiner.note_ends(members["slot"], members["end"], self.topology.n_slots)
        self.shards.stage(members, self.topology)

    def drain_ready(self) -> None:
        """Join what is staged and hand completed collectives to the frame builder (lateness
        is computed there). A sharded job's shards join on their own and at every pass."""
        self.assembly.drain_ready(self.topology)

    def close_frames(
        self, *, flush: bool = False, blocked_before_ns: int | None = None
    ) -> list[Frame]:
        """A detection pass's part: join, close the frames that are due, expire incomplete
        collectives past retention. Sharded: the frames closed at the previous pass, with the
        shards' parts added up (every pass asks the shards and takes the previous answers, so
        the owner does not wait for their joins; ``flush`` waits for all). ``blocked_before_ns``:
        the shards also find the collectives :meth:`blocked_groups` gives (None: no need)."""
        topo = self.topology
        self.assembly.drain_ready(topo)
        fb = self.assembly.frames
        closed = fb.advance(self.watermark_ns, topo.n_slots, flush=flush, world=topo.world_size)
        if self.shards is not None:
            # the shards' parts of this pass come with the next one: this pass's frames wait
            results = self.shards.run_pass(
                PassAsk(self.watermark_ns, topo.n_slots, flush, topo.world_size, fb.time_mode,
                        blocked_before_ns)
            )  # fmt: skip
            held, self.held_frames = self.held_frames, closed
            if flush:
                held, self.held_frames = held + closed, []
            closed = []
            if results is not None:
                closed = reduce_frames([held, *(r.frames for r in results)])
                fb.last_progress_ns = max([fb.last_progress_ns,
                                           *(r.last_progress_ns for r in results)])  # fmt: skip
                for r in results:
                    self._retire(r.expired)
                self.blocked = merge_groups([r.blocked for r in results], MAX_BLOCKED)
        self.expire()
        return self._once(closed)

    def _once(self, closed: list[Frame]) -> list[Frame]:
        """Frames not closed before, in order; the last index of each kind remembered."""
        through = self.closed_through
        fresh = []
        for f in sorted(closed, key=lambda f: f.index):
            if f.index > through.get(f.has_steps, -(1 << 62)):
                through[f.has_steps] = f.index
                fresh.append(f)
        if len(fresh) < len(closed):
            self.closed_again += len(closed) - len(fresh)
            log.warning("job %s: %d frames closed a second time, dropped", self.job,
                        len(closed) - len(fresh))  # fmt: skip
        return fresh

    def expire(self) -> int:
        """Drop incomplete collectives past retention; their re-sends are duplicates now."""
        return self._retire(self.assembly.expire(self.watermark_ns))

    def _retire(self, gone: np.ndarray) -> int:
        for comm, seq in gone.tolist():
            self.ledger.retire(comm, seq)
        return int(gone.shape[0])

    def waiting(self) -> bool:
        """Frames open, contributions queued or collectives incomplete: a pass has work."""
        f, j = self.assembly.frames, self.assembly.joiner
        local = bool(f.frames or f.queue or j.staged or j.pending_groups)
        return local or (self.shards is not None and self.shards.waiting())

    def dropped_contributions(self) -> int:
        """Contributions whose frame had closed (as of the last pass, for the shards')."""
        own = self.assembly.frames.dropped_contributions
        return own + (self.shards.dropped() if self.shards is not None else 0)

    def join_stats(self) -> JoinStats:
        """The join's counts, over the shards when there are any."""
        out = stats_of(self.assembly)
        return out if self.shards is None else out + self.shards.stats()

    def blocked_groups(self, older_than_ns: int) -> list[PendingGroup]:
        """Incomplete collectives a member is inside and whose first member entered before
        ``older_than_ns`` (see :meth:`Joiner.groups`), at most :data:`MAX_BLOCKED`, for the hang
        detector. A sharded job's are its shards' answers at the last pass (asked with
        ``close_frames(blocked_before_ns=...)``): a pass never waits for them."""
        if self.shards is None:
            return self.assembly.joiner.groups(
                started_before_ns=older_than_ns, limit=MAX_BLOCKED, inside_only=True
            )
        return self.blocked

    def abandon(self) -> int:
        """Drop every incomplete collective (the job restarted: its members are gone)."""
        count = self.assembly.joiner.abandon()
        return count + (self.shards.abandon() if self.shards is not None else 0)

    def close(self) -> None:
        """Leaving memory: stop the shard processes."""
        if self.shards is not None:
            self.shards.close()

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
