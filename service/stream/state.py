"""Per-job in-memory state and the application of one envelope to it.

Bounds (see docs/memory.md): ranks <= ``max_ranks``, comms <= ``max_comms``, collectives being
assembled <= ``max_pending_collectives`` and no older than ``retention_s`` of event time,
remembered completed collectives <= ``max_done_collectives``, open frames <= ``max_open_frames``,
per-rank step ring of 16 steps.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from failslow.service.stream.assembly import Assembler, Outcome
from failslow.service.stream.frames import FrameBuilder
from failslow.service.stream.parse import parse_collective, parse_comm, parse_rank, parse_step
from failslow.service.stream.records import Envelope, RecordError, RecordKind, Reject
from failslow.service.stream.settings import StateSettings
from failslow.service.stream.topology import Topology


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


class JobState:
    """Everything the service holds in memory for one job. Mutate only under ``lock``."""

    def __init__(self, job: str, settings: StateSettings) -> None:
        self.job = job
        self.lock = threading.RLock()
        self.settings = settings
        self.topology = Topology(max_ranks=settings.max_ranks, max_comms=settings.max_comms)
        self.assembler = Assembler(
            max_pending=settings.max_pending_collectives,
            max_done=settings.max_done_collectives,
            retention_ns=int(settings.retention_s * 1e9),
        )
        self.frames = FrameBuilder(
            grace_ns=int(settings.frame_grace_s * 1e9),
            time_frame_ns=int(settings.time_frame_s * 1e9),
            max_open_frames=settings.max_open_frames,
        )
        self.watermark_ns = 0
        self.first_seen_ns: int | None = None
        self.last_wall = time.monotonic()
        self.streams: dict[tuple[str, str], int] = {}  # (host, agent) -> last batch_seq
        self.dirty_streams: set[tuple[str, str]] = set()
        self.deltas: dict[str, HostDelta] = {}
        self.persisted = False  # the jobs row exists
        self.new_data = False  # something arrived since the last detection pass

    # -- ingest --------------------------------------------------------------------------------
    def apply(self, env: Envelope) -> ApplyResult:
        """Apply a structurally valid envelope; per-record problems are reported, not raised."""
        result = ApplyResult()
        wall = time.monotonic()
        stream = (env.host, env.agent) if env.agent is not None else None
        seq = env.batch_seq
        if stream is not None and seq is not None and seq <= self.streams.get(stream, -1):
            result.batch_duplicate = True
            result.duplicates = env.record_count
            self._delta(env).duplicates += result.duplicates
            return result
        topo = self.topology
        topo.touch_host(env.host, env.sent_ns, wall)
        self.last_wall = wall
        if self.first_seen_ns is None:
            self.first_seen_ns = env.sent_ns
        self.watermark_ns = max(self.watermark_ns, env.sent_ns)

        for i, raw in enumerate(env.ranks):
            try:
                topo.announce_rank(env.host, parse_rank(raw))
            except RecordError as exc:
                self._reject(result, f"ranks[{i}]", exc)
        for i, raw in enumerate(env.comms):
            try:
                topo.announce_comm(parse_comm(raw))
            except RecordError as exc:
                self._reject(result, f"comms[{i}]", exc)
        for i, raw in enumerate(env.collectives):
            try:
                rec = parse_collective(raw)
                comm = topo.comms.get(rec.comm)
                if comm is None:
                    raise RecordError(
                        Reject.UNKNOWN_COMM, f"unknown comm {rec.comm} (announce it in comms[])"
                    )
                topo.check_rank_host(rec.rank, env.host)
                outcome = self.assembler.offer(rec, comm, self.watermark_ns)
            except RecordError as exc:
                self._reject(result, f"collectives[{i}]", exc)
                continue
            self._count(result, outcome, RecordKind.COLLECTIVE)
        # Hand completed collectives to the frames now, before step records that may recycle
        # the step intervals they need.
        self.drain_ready()
        for i, raw in enumerate(env.steps):
            try:
                step = parse_step(raw)
                slot = topo.check_rank_host(step.rank, env.host)
                outcome = self.frames.add_step(slot, step, topo.n_slots)
            except RecordError as exc:
                self._reject(result, f"steps[{i}]", exc)
                continue
            self._count(result, outcome, RecordKind.STEP)

        self.drain_ready()
        self.frames.attribute(topo.n_slots)
        delta = self._delta(env)
        delta.accepted += result.accepted
        delta.duplicates += result.duplicates
        delta.rejected += len(result.rejected)
        if stream is not None and env.batch_seq is not None:
            self.streams[stream] = env.batch_seq
            self.dirty_streams.add(stream)
        if result.accepted:
            self.new_data = True
        return result

    def _delta(self, env: Envelope) -> HostDelta:
        delta = self.deltas.get(env.host)
        if delta is None:
            delta = self.deltas[env.host] = HostDelta(first_seen_ns=env.sent_ns)
        delta.envelopes += 1
        delta.last_seen_ns = max(delta.last_seen_ns, env.sent_ns)
        return delta

    @staticmethod
    def _reject(result: ApplyResult, loc: str, exc: RecordError) -> None:
        result.rejected.append({"index": loc, "reason": str(exc)})
        result.reasons.append(exc.code)

    @staticmethod
    def _count(result: ApplyResult, outcome: Outcome, kind: RecordKind) -> None:
        if outcome is Outcome.DUPLICATE:
            result.duplicates += 1
        else:
            result.accepted += 1
            result.kinds[kind] = result.kinds.get(kind, 0) + 1

    def drain_ready(self) -> None:
        """Hand completed collectives to the frame builder (lateness is computed there)."""
        self.frames.add_collectives(self.assembler.take_ready(), self.topology)

    # -- views ---------------------------------------------------------------------------------
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
