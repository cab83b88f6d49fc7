"""The owner's side of a sharded job: its shard processes, what goes to which, and the pass.

Requests that need no answer (comms, member and step records) are written to each shard's pipe
and not waited for: a shard works on them while the owner checks the next envelope. A pipe holds
~64 KiB; when a shard falls behind, writing to it waits, which slows ingest of that job down to
what its shards can take (back-pressure, nothing dropped). A pass asks every shard at once and
then reads every answer, so the shards join and close frames side by side.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing as mp
import pickle
import select
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

import numpy as np

from failslow.service.stream.assembly import Assembly
from failslow.service.stream.join import PendingGroup
from failslow.service.stream.settings import Limits, StateSettings
from failslow.service.stream.shards.ring import Ring, wait_a_little
from failslow.service.stream.shards.table import delta_of
from failslow.service.stream.shards.worker import JoinStats, Msg, PassAsk, PassResult, serve
from failslow.service.stream.topology import Topology
from failslow.wire import process

log = logging.getLogger(__name__)
T = TypeVar("T")
RING_BYTES = 64 << 20  # per shard: ~1M member records on their way
STARTUP_S = 30.0  # the least wait for a shard that has not answered since it was started
COMPACT = {"comm": np.int32, "pos": np.int32, "slot": np.int32}  # smaller on the way over


def merge_groups(groups: list[list[PendingGroup]], limit: int | None) -> list[PendingGroup]:
    """Pending collectives of all shards, in the order their first member record arrived."""
    merged = sorted((g for part in groups for g in part), key=lambda g: g.arrival)
    return merged if limit is None else merged[:limit]


class ShardFailed(RuntimeError):
    """A shard process failed or exited: the job's joins on it are lost."""


def _stop(procs: list[BaseProcess], conns: list[Connection], rings: list[Ring],
          graceful: bool = True) -> None:  # fmt: skip
    """Stop the shard processes: asked to (when ``graceful`` and their pipes have room), killed
    when they have not ended 2 s later (or at once)."""
    for c in conns:
        with contextlib.suppress(OSError, ValueError):
            if graceful and _writable(c, 0):
                c.send((Msg.STOP, None, False))
            c.close()
    for p in procs:
        if graceful:
            p.join(timeout=2)
        if p.is_alive():
            p.kill()
        p.join(timeout=2)
    for r in rings:
        r.close(unlink=True)


def _writable(conn: Connection, timeout_s: float) -> bool:
    """Whether ``conn``'s pipe has room to write, waiting up to ``timeout_s``."""
    return bool(select.select([], [conn.fileno()], [], timeout_s)[1])


def stop_in_background(procs: list[BaseProcess], conns: list[Connection], rings: list[Ring],
                       graceful: bool = True) -> None:  # fmt: skip
    """:func:`_stop` on a thread of its own: a job leaving memory (eviction runs on the event
    loop) never waits for its shards to end (4-6 evictions once stalled /healthz 3-6 s)."""
    t = threading.Thread(target=_stop, args=(procs, conns, rings, graceful),
                         name="failslow-shard-stop", daemon=True)  # fmt: skip
    _stopping.add(t)
    t.start()


_stopping: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


@atexit.register
def _finish_stopping() -> None:
    """At exit, the shards being stopped end (and their shared memory goes) first."""
    for t in list(_stopping):
        t.join(timeout=10)


class Shards:
    """``count`` shard processes of one job. Used under the job's lock."""

    def __init__(self, job: str, count: int, settings: StateSettings) -> None:
        self.job, self.count, self.settings = job, count, settings
        self.procs: list[BaseProcess] = []
        self.conns: list[Connection] = []
        self.rings: list[Ring] = []  # member records to each shard (shared memory)
        self.sent_comms = 0  # comms every shard knows
        self.sent_slots = 0
        self.arrivals = 0  # member records numbered so far (the job's arrival order)
        self.blobs: list[bytes] | None = None  # from a snapshot: loaded when started
        self.last: list[PassResult] = []
        self.asked = False  # a pass was asked and its answers not read yet
        self.fed = False  # records sent since the last pass was asked
        self.kept: list[PassResult] | None = None  # read early (by another request), not used
        self.restarts = 0  # times the shards failed and were started again
        self.answered: set[int] = set()  # shards that answered since they were started
        self._limits: Limits | None = None
        self._finalizer: weakref.finalize | None = None

    # -- processes -----------------------------------------------------------------------------
    def start(self) -> None:
        if self.procs:
            return
        ctx = mp.get_context("spawn")  # the service has threads: never fork it
        for i in range(self.count):
            mine, theirs = ctx.Pipe()
            ring = Ring(RING_BYTES)
            self.rings.append(ring)
            p = ctx.Process(
                target=serve,
                args=(theirs, self.settings, i, self.count, ring.name, process.current()),
                name=f"failslow-shard-{i}", daemon=True,
            )  # fmt: skip
            p.start()
            theirs.close()
            self.procs.append(p)
            self.conns.append(mine)
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.conns, self.rings)
        log.info("job %s: %d shard processes started", self.job, self.count)
        if self.blobs is not None:
            for conn, blob in zip(self.conns, self.blobs, strict=True):
                self._send(conn, Msg.LOAD, (blob, False))
            self.blobs = None

    def close(self, *, graceful: bool = True) -> None:
        """Stop the shard processes without waiting for them (they end on a thread of their
        own); ``graceful=False``: kill them (a shard that failed or does not answer)."""
        if self._finalizer is not None and self._finalizer.detach() is not None:
            stop_in_background(self.procs, self.conns, self.rings, graceful)
        self._finalizer = None
        self.procs, self.conns, self.rings = [], [], []
        self.answered = set()

    def restart(self, why: ShardFailed) -> None:
        """A shard failed: start them all again, empty, so that the job goes on. What they held
        is lost: the collectives being assembled there (they expire as incomplete would) and
        their part of the open frames (those frames close with the owner's part only)."""
        log.error(
            "%s; starting job %s's %d shards again (their collectives being assembled and "
            "their part of the open frames are lost)", why, self.job, self.count,
        )  # fmt: skip
        self.close(graceful=False)
        self.sent_comms = self.sent_slots = 0
        self.asked, self.kept, self.last, self.blobs = False, None, [], None
        self.restarts += 1
        self.start()
        if self._limits is not None:  # not through _again: a shard dying again fails the call
            self._send_limits()

    def _again(self, action: Callable[[], T]) -> T:
        """``action``, and once more on new shard processes if a shard failed during it."""
        try:
            return action()
        except ShardFailed as exc:
            self.restart(exc)
        return action()

    def split(self, assembly: Assembly, topology: Topology) -> None:
        """Start from the owner's assembly: each shard takes its comms' pending records and the
        frames' step records; the owner keeps what it placed, and forgets what is pending."""
        assembly.drain_ready(topology)
        blob = pickle.dumps(assembly, protocol=pickle.HIGHEST_PROTOCOL)
        self.start()
        for conn in self.conns:
            self._send(conn, Msg.LOAD, (blob, True))
        self.sync(topology)
        self.arrivals = assembly.joiner.arrivals
        assembly.joiner.retain()

    def _send(self, conn: Connection, msg: Msg, arg: Any, answer: bool = False) -> None:
        """To a shard, waiting at most ``shard_timeout_s`` for room in its pipe (a stopped
        shard once held the job's lock, and with it every request, for over a minute)."""
        if not _writable(conn, self._timeout()):
            raise self._late(conn, "took nothing from its pipe")
        try:
            conn.send((msg, arg, answer))
        except (OSError, ValueError) as exc:
            raise self._failed(conn) from exc

    def _recv(self, conn: Connection) -> Any:
        try:
            if not conn.poll(self._timeout()):
                raise self._late(conn, "did not answer")
            ok, out = conn.recv()
        except (OSError, EOFError) as exc:
            raise self._failed(conn) from exc
        self.answered.add(self.conns.index(conn))
        if not ok:
            raise ShardFailed(f"job {self.job}: shard {self.conns.index(conn)}: {out}")
        return out

    def _timeout(self) -> float:
        """``shard_timeout_s``; until every shard has answered once, at least STARTUP_S (a
        process just spawned imports numpy and failslow first: 1-3 s on a busy machine)."""
        t = self.settings.shard_timeout_s
        return t if len(self.answered) == len(self.conns) else max(t, STARTUP_S)

    def _late(self, conn: Connection, what: str) -> ShardFailed:
        i = self.conns.index(conn)
        return ShardFailed(f"job {self.job}: shard process {i} {what} within "
                           f"{self._timeout():g} s (shard_timeout_s)")  # fmt: skip

    def _failed(self, conn: Connection) -> ShardFailed:
        i = self.conns.index(conn)
        p = self.procs[i]
        p.join(timeout=1)
        return ShardFailed(f"job {self.job}: shard process {i} exited (code {p.exitcode})")

    def _ask(self, msg: Msg, arg: Any) -> list[Any]:
        return self._again(lambda: self._ask_all(msg, arg))

    def _ask_all(self, msg: Msg, arg: Any) -> list[Any]:
        if self.asked:  # a pass's answers come first: kept for the next pass
            self.kept = self.answers()
        self.start()
        for conn in self.conns:
            self._send(conn, msg, arg, answer=True)
        return [self._recv(conn) for conn in self.conns]

    # -- input ---------------------------------------------------------------------------------
    def sync(self, topology: Topology) -> None:
        """Tell every shard of comms and slots added since the last time."""
        if topology.n_comms == self.sent_comms and topology.n_slots == self.sent_slots:
            return

        def send() -> None:  # again after a restart: from the first comm (sent_comms is 0)
            self.start()
            delta = delta_of(topology, self.sent_comms)
            for conn in self.conns:
                self._send(conn, Msg.TABLE, delta)
            self.sent_comms, self.sent_slots = topology.n_comms, topology.n_slots

        self._again(send)

    def limits(self, limits: Limits) -> None:
        """New bounds to every shard (the job grew). A shard found dead here is restarted like
        anywhere else: this is called while applying an envelope, which must not fail for it."""
        self._limits = limits
        self._again(self._send_limits)

    def _send_limits(self) -> None:
        self.start()
        for conn in self.conns:
            self._send(conn, Msg.LIMITS, self._limits)

    def stage(self, members: dict[str, np.ndarray], topology: Topology) -> None:
        """Member records to the shard of their comm, numbered in the job's arrival order."""
        n = int(members["comm"].size)
        members["arrival"] = np.arange(self.arrivals, self.arrivals + n, dtype=np.int64)
        self.arrivals += n
        self._again(lambda: self._stage_all(members, topology))

    def _stage_all(self, members: dict[str, np.ndarray], topology: Topology) -> None:
        self.sync(topology)
        self.fed = True
        if self.count == 1:
            self._stage(0, members)
            return
        shard = members["comm"] % self.count
        order = np.argsort(shard, kind="stable")
        bounds = np.searchsorted(shard[order], np.arange(self.count + 1))
        for i in range(self.count):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            if hi > lo:
                part = order[lo:hi]
                self._stage(i, {c: v[part] for c, v in members.items()})

    def _stage(self, i: int, cols: dict[str, np.ndarray]) -> None:
        conn = self.conns[i]
        deadline = time.monotonic() + self._timeout()

        def wait() -> None:
            if not self.procs[i].is_alive():
                raise self._failed(conn)
            if time.monotonic() > deadline:
                raise self._late(conn, "read nothing from its ring")
            wait_a_little()

        placed = self.rings[i].write(cols, wait, COMPACT)
        self._send(conn, Msg.STAGE, cols if placed is None else placed)

    def steps(self, slot: np.ndarray, step: np.ndarray, start: np.ndarray, end: np.ndarray,
              work: np.ndarray | None, topology: Topology) -> None:  # fmt: skip
        """Accepted step records, to every shard (placing a collective needs its rank's step)."""
        if not slot.size:
            return

        def send() -> None:
            self.sync(topology)
            self.fed = True
            for conn in self.conns:
                self._send(conn, Msg.STEPS, (slot, step, start, end, work))

        self._again(send)

    # -- passes and views ----------------------------------------------------------------------
    def run_pass(self, ask: PassAsk) -> list[PassResult] | None:
        """The answers to the *previous* pass (None: none was asked), so that the owner goes on
        checking envelopes while the shards join; then asks for this one, when the shards may
        have something to do (:meth:`busy`). ``ask.flush``: wait for this pass's answers too,
        and return both (the previous pass's first)."""
        try:
            return self._run_pass(ask)
        except ShardFailed as exc:
            self.restart(exc)  # this pass's answers, and the last one's, are lost
            return None

    def _run_pass(self, ask: PassAsk) -> list[PassResult] | None:
        before = self.answers()
        if not (ask.flush or self.busy()):
            return before
        self.start()
        for conn in self.conns:
            self._send(conn, Msg.PASS, ask, answer=True)
        self.asked, self.fed = True, False
        if not ask.flush:
            return before
        now = self.answers()
        assert now is not None
        if before is None:
            return now
        return [PassResult(a.frames + b.frames, np.concatenate([a.expired, b.expired]),
                           b.last_progress_ns, b.dropped_contributions, b.pending_groups,
                           b.staged_records, b.open_frames, b.blocked)
                for a, b in zip(before, now, strict=True)]  # fmt: skip

    def answers(self) -> list[PassResult] | None:
        """The answers to the pass asked last, once (None: none was asked since)."""
        if self.kept is not None:
            out, self.kept = self.kept, None
            return out
        if not self.asked:
            return None
        self.asked = False
        self.last = [self._recv(conn) for conn in self.conns]
        return self.last

    def busy(self) -> bool:
        """Records came since the last pass, or its answers (none yet: unknown) left
        collectives incomplete, records staged or frames open."""
        return self.fed or not self.last or any(
            r.pending_groups or r.staged_records or r.open_frames for r in self.last
        )

    def waiting(self) -> bool:
        """A pass has work: answers to read, or :meth:`busy`."""
        return self.asked or self.busy()

    def dropped(self) -> int:
        return sum(r.dropped_contributions for r in self.last)

    def stats(self) -> JoinStats:
        return sum(self._ask(Msg.STATS, None), JoinStats())

    def abandon(self) -> int:
        return int(sum(self._ask(Msg.ABANDON, None)))

    # -- snapshots -----------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        blobs = self.blobs if self.blobs is not None else self._ask(Msg.DUMP, None)
        return {"job": self.job, "count": self.count, "settings": self.settings,
                "arrivals": self.arrivals, "blobs": blobs, "kept": self.kept}  # fmt: skip

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__init__(d["job"], d["count"], d["settings"])  # type: ignore[misc]
        self.arrivals, self.blobs, self.kept = d["arrivals"], d["blobs"], d["kept"]
