"""A shard process: the join and frame sums of the comms ``comm % shards == index`` of one job.

It does what the owner asks, in the order asked (one pipe, so member records, step records and
passes keep the order in which the owner applied them; member records themselves come through
shared memory, :mod:`.ring`); answers go out from a thread of their own. When nothing has come
for a moment, or much is staged and the pipe is empty, what is staged is joined, so that a pass
finds little left to do.
"""

from __future__ import annotations

import pickle
import queue
import threading
from dataclasses import astuple, dataclass
from enum import IntEnum
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from failslow.detectors.types import Frame
from failslow.service.stream.assembly import Assembly
from failslow.service.stream.join import DTYPES, MAX_BLOCKED, PendingGroup
from failslow.service.stream.settings import Limits, StateSettings
from failslow.service.stream.shards.ring import Ring
from failslow.service.stream.shards.table import CommTable, TableDelta
from failslow.wire import process

IDLE_JOIN_S = 0.05  # join what is staged after this long without a request
JOIN_AT_RECORDS = 32_768  # or once this many are staged and no request waits


class Msg(IntEnum):
    """What the owner asks of a shard (:class:`~.pool.Shards`)."""

    TABLE = 1  # comms and slots added: a TableDelta (no answer)
    LIMITS = 2  # the job's bounds changed: Limits (no answer)
    STAGE = 3  # member records of this shard's comms (no answer)
    STEPS = 4  # accepted step records: slot, step, start, end, work (no answer)
    PASS = 5  # a PassAsk: join, close what is due, expire; answered with a PassResult
    STATS = 6  # answered with JoinStats
    ABANDON = 8  # drop every incomplete collective: answered with the count
    DUMP = 9  # answered with the pickled Assembly
    LOAD = 10  # (pickled Assembly, split): replace this shard's (no answer)
    STOP = 11


@dataclass(frozen=True, slots=True)
class JoinStats:
    """A job's join, as views and metrics show it (summed over shards)."""

    pending_groups: int = 0
    staged_records: int = 0
    inflight: int = 0
    expired: int = 0
    conflicts: int = 0
    duplicates: int = 0

    def __add__(self, other: JoinStats) -> JoinStats:
        return JoinStats(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


@dataclass(frozen=True, slots=True)
class PassAsk:
    """What the owner asks of every shard at a detection pass."""

    watermark_ns: int
    n_slots: int
    flush: bool
    world: int | None
    time_mode: bool  # the owner's decision: the job fell back to time frames
    blocked_before_ns: int | None  # also find the hang detector's blocked collectives


@dataclass(frozen=True, slots=True)
class PassResult:
    frames: list[Frame]
    expired: np.ndarray  # (n, 2) comm, seq of the collectives expired
    last_progress_ns: int
    dropped_contributions: int
    pending_groups: int
    staged_records: int
    open_frames: int
    blocked: list[PendingGroup]  # for the hang detector (JobState.blocked_groups)


def stats_of(a: Assembly) -> JoinStats:
    j = a.joiner
    return JoinStats(j.pending_groups, j.staged_records, j.inflight_count(), j.expired,
                     j.conflicts, j.duplicates)  # fmt: skip


class Part:
    """What one shard holds, and its answers."""

    def __init__(
        self, settings: StateSettings, index: int, count: int, ring: Ring | None = None
    ) -> None:
        self.index, self.count = index, count
        self.ring = ring
        self.settings = settings
        self.assembly = Assembly(settings, Limits.of(settings, None))
        self.table = CommTable()

    def handle(self, msg: Msg, arg: Any) -> Any:  # noqa: PLR0911 - one branch per request
        a = self.assembly
        if msg is Msg.TABLE:
            self.table.extend(arg)
        elif msg is Msg.LIMITS:
            a.scale(arg)
        elif msg is Msg.STAGE:
            if isinstance(arg, tuple):  # in the ring: (position, columns)
                assert self.ring is not None
                arg = self.ring.read(*arg, DTYPES)
            else:
                arg = {c: v.astype(DTYPES[c], copy=False) for c, v in arg.items()}
            a.stage(arg, self.table)
        elif msg is Msg.STEPS:
            slot, step, start, end, work = arg
            a.add_steps(slot, step, start, end, self.table, work)
        elif msg is Msg.PASS:
            return self.run_pass(arg)
        elif msg is Msg.STATS:
            return stats_of(a)
        elif msg is Msg.ABANDON:
            return a.joiner.abandon()
        elif msg is Msg.DUMP:
            return pickle.dumps(a, protocol=pickle.HIGHEST_PROTOCOL)
        elif msg is Msg.LOAD:
            blob, split = arg
            self.assembly = pickle.loads(blob)  # noqa: S301 - the owner's own state
            if split:
                self._keep_own()
        return None

    def run_pass(self, ask: PassAsk) -> PassResult:
        a = self.assembly
        a.drain_ready(self.table)
        frames = a.frames.advance(ask.watermark_ns, ask.n_slots, flush=ask.flush, world=ask.world,
                                  time_mode=ask.time_mode)  # fmt: skip
        gone = a.expire(ask.watermark_ns)
        blocked = []
        if ask.blocked_before_ns is not None:
            blocked = a.joiner.groups(started_before_ns=ask.blocked_before_ns, limit=MAX_BLOCKED,
                                      inside_only=True)  # fmt: skip
        return PassResult(frames, gone, a.frames.last_progress_ns, a.frames.dropped_contributions,
                          a.joiner.pending_groups, a.joiner.staged_records,
                          len(a.frames.frames), blocked)  # fmt: skip

    def _keep_own(self) -> None:
        """After a split of the owner's assembly: keep this shard's comms' pending records and
        the frames' step records, not what the owner already placed (the owner keeps that)."""
        j = self.assembly.joiner
        j.retain(lambda pending: pending["comm"] % self.count == self.index)
        j.expired = j.conflicts = j.duplicates = 0  # the owner's counts stand
        f = self.assembly.frames
        for acc in f.frames.values():
            for name in ("busy", "late", "calls", "c_transfer", "c_bytes", "c_calls"):
                getattr(acc, name)[...] = 0
            acc.collectives = 0
        f.queue.take()
        f.cqueue.take()
        f.dropped_contributions = 0


def warm_up(settings: StateSettings) -> None:
    """Join and place one collective of a two-rank job: numba loads (or compiles) the kernels
    now, at start-up, and not in the middle of the job's first steps (1.5 s in a shard process
    where nothing had loaded them)."""
    a, t = Assembly(settings, Limits.of(settings, None)), CommTable()
    t.extend(TableDelta(0, 2, np.array([2]), np.array([0]), np.array([0, 1])))
    one = np.ones(1, np.int64)
    for step in range(2):
        a.add_steps(np.array([0, 1]), np.array([step, step]), np.array([step * 100] * 2),
                    np.array([step * 100 + 99] * 2), t, None)  # fmt: skip
        for pos in (0, 1):
            a.stage({"comm": 0 * one, "seq": step * one, "pos": pos * one, "slot": pos * one,
                     "op": np.zeros(1, np.uint8), "nbytes": one, "start": (step * 100 + 10) * one,
                     "end": (step * 100 + 20 + pos) * one, "seen": one}, t)  # fmt: skip
        a.drain_ready(t)
    a.frames.advance(1000, 2, flush=True)


def _answer(conn: Connection, outbox: queue.SimpleQueue[Any]) -> None:
    """Send answers, in order, from a thread of their own: the owner reads a pass's answers at
    its next pass, and meanwhile writes more requests, so a shard whose main thread waited to
    send a large answer (frames are MiBs) would never read them: both would wait for ever."""
    while True:
        item = outbox.get()
        if item is None:
            return
        try:
            conn.send(item)
        except (OSError, ValueError):  # the owner is gone
            return


def serve(
    conn: Connection,
    settings: StateSettings,
    index: int,
    count: int,
    ring: str,
    setup: tuple[int, int] = (0, 700),
) -> None:
    """The shard process's main loop (the target of its ``multiprocessing.Process``); ``setup``:
    the owner's allocator and collector settings (:func:`failslow.wire.process.current`),
    without which the join took twice as long here as in the owner."""
    process.same_as(setup)
    warm_up(settings)
    part = Part(settings, index, count, Ring(name=ring))
    outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    sender = threading.Thread(target=_answer, args=(conn, outbox), daemon=True, name="answer")
    sender.start()
    failed: str | None = None
    while True:
        if not conn.poll(IDLE_JOIN_S):
            if part.assembly.joiner.staged:
                part.assembly.drain_ready(part.table)
            continue
        try:
            msg, arg, answer = conn.recv()
        except (EOFError, OSError):
            break
        if msg is Msg.STOP:
            break
        try:
            out = part.handle(msg, arg)
        except Exception as exc:  # noqa: BLE001 - sent back to the owner, who raises it
            failed = failed or f"{msg.name}: {type(exc).__name__}: {exc}"
            out = None
        if answer:
            outbox.put((True, out) if failed is None else (False, failed))
            failed = None
        elif not conn.poll(0) and part.assembly.joiner.staged_records >= JOIN_AT_RECORDS:
            part.assembly.drain_ready(part.table)  # caught up: join while the owner checks
    outbox.put(None)
    sender.join(timeout=5)
