"""In-process SDK: a training script records collectives and steps; a node agent ships them.

Every public method returns quickly and never raises into the training loop: records go into a
bounded in-memory queue; a daemon thread encodes them and hands them to the local agent over a
Unix datagram socket (non-blocking) or as files in a spool directory. When the agent is away,
encoded batches are kept (bounded) and retried; what does not fit is dropped and counted.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from failslow.agents import wire
from failslow.agents.vouch import MARK

log = logging.getLogger(__name__)

ANNOUNCE_EVERY_S = 30.0
WARN_NO_AGENT_AFTER_S = 10.0


def default_socket(job: str) -> str:
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return os.path.join(base, f"failslow-{job}.sock")


@dataclass(slots=True)
class SdkStats:
    recorded: int = 0
    sent: int = 0
    dropped: int = 0
    errors: int = 0
    pending_bytes: int = 0
    undelivered: int = 0  # records encoded and waiting for the agent
    agent_absent: bool = False  # the last hand-over found no agent
    agent_absent_warnings: int = 0  # warnings logged that no agent takes the records


class Recorder:
    """Records telemetry for one job from one process. Thread-safe; never blocks or raises.

    The sender thread wakes every ``flush_interval_s`` (default 0.5 s: the node agent seals its
    envelopes every second anyway, and each wake-up costs CPU on the training's cores) or as soon
    as ``flush_at_records`` records are waiting.

    When no agent takes the records for ``warn_no_agent_after_s`` (a socket nobody listens on),
    one warning goes to the ``failslow.sdk`` log (Python's last-resort handler prints it on
    stderr when the program configured none) and ``stats.agent_absent`` says so; records wait,
    bounded, and are delivered once an agent appears. Never a Python warning, which a program
    run with ``-W error`` would raise."""

    def __init__(
        self,
        job: str,
        *,
        socket_path: str | None = None,
        spool_dir: str | None = None,
        flush_interval_s: float = 0.5,
        flush_at_records: int = 2_000,
        max_queue: int = 200_000,
        max_pending_bytes: int = 64 * 1024 * 1024,
        warn_no_agent_after_s: float = WARN_NO_AGENT_AFTER_S,
        start: bool = True,
    ) -> None:
        self.job = job
        self.spool_dir = Path(spool_dir) if spool_dir else None
        self.socket_path = socket_path or (None if spool_dir else default_socket(job))
        self.flush_interval_s = flush_interval_s
        self.flush_at_records = flush_at_records
        self.max_queue = max_queue
        self.max_pending_bytes = max_pending_bytes
        self.warn_no_agent_after_s = warn_no_agent_after_s
        self._absent_since: float | None = None
        self.stats = SdkStats()
        self._queue: deque[list[Any]] = deque()
        self._announce: list[list[Any]] = []
        self._pending: deque[bytes] = deque()  # encoded payloads awaiting delivery
        self._counts: deque[int] = deque()  # records in each pending payload
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._sock: socket.socket | None = None
        self._file_seq = 0
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        # what each hand-over vouches for, ``(complete_ns, inflight_after_ns)`` (the torch
        # instrumentation's ``CallTimer.watermark``; None: nothing): a ``["w", ...]`` line after
        # the records, sent even when there are none, which the node agent turns into an
        # envelope's ``complete_ns`` (docs/ingest-v1.md, "Completeness")
        self.watermark: Callable[[], tuple[int, int] | None] | None = None
        if self.spool_dir:
            self.spool_dir.mkdir(parents=True, exist_ok=True)
        if start:
            self.start()

    # -- public API (hot path) ---------------------------------------------------------------
    def register_rank(
        self, rank: int, *, gpu: int | None = None, world_size: int | None = None
    ) -> None:
        try:
            item = ["r", int(rank), gpu, world_size]
            self._announce.append(item)
            self._push(item, record=False)
        except Exception:  # noqa: BLE001 - never raise into training
            self.stats.errors += 1

    def register_comm(self, comm: str, kind: str, ranks: list[int]) -> None:
        try:
            item = ["m", str(comm), str(kind), [int(r) for r in ranks]]
            self._announce.append(item)
            self._push(item, record=False)
        except Exception:  # noqa: BLE001
            self.stats.errors += 1

    def record_collective(
        self,
        *,
        rank: int,
        comm: str,
        seq: int,
        op: str,
        nbytes: int,
        start_ns: int,
        end_ns: int | None,
        peer: int | None = None,
    ) -> None:
        self._push(["c", rank, comm, seq, op, nbytes, start_ns, end_ns, peer])

    def record_step(
        self, *, rank: int, step: int, start_ns: int, end_ns: int, work: float | None = None
    ) -> None:
        """``work``: the step's work on this rank (tokens, samples; any unit the job uses for
        every rank), when it varies from step to step or rank to rank: compute is then compared
        per unit of work (a rank with a long batch is not a straggler)."""
        if work is None:
            self._push(["s", rank, step, start_ns, end_ns])
        else:
            self._push(["s", rank, step, start_ns, end_ns, float(work)])

    @contextlib.contextmanager
    def step(self, *, rank: int, step: int, work: float | None = None) -> Iterator[None]:
        """Time a training step: ``with recorder.step(rank=r, step=i, work=tokens): ...``."""
        start = time.time_ns()
        try:
            yield
        finally:
            self.record_step(
                rank=rank, step=step, start_ns=start, end_ns=time.time_ns(), work=work
            )

    @contextlib.contextmanager
    def collective(
        self, *, rank: int, comm: str, seq: int, op: str, nbytes: int, peer: int | None = None
    ) -> Iterator[None]:
        """Time a blocking collective call on the wall clock (CPU / gloo)."""
        start = time.time_ns()
        try:
            yield
        finally:
            self.record_collective(
                rank=rank,
                comm=comm,
                seq=seq,
                op=op,
                nbytes=nbytes,
                start_ns=start,
                end_ns=time.time_ns(),
                peer=peer,
            )

    def _push(self, item: list[Any], *, record: bool = True) -> None:
        if len(self._queue) >= self.max_queue:
            self.stats.dropped += record
            return
        self._queue.append(item)
        self.stats.recorded += record
        if len(self._queue) == self.flush_at_records:  # a burst: do not wait for the interval
            self._wake.set()

    def hand_over_soon(self) -> None:
        """Hand what is queued (and a fresh mark) to the agent now, not at the next interval."""
        self._wake.set()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="failslow-sdk", daemon=True)
            self._thread.start()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until everything recorded so far was handed to the agent (True) or timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._queue and not self._pending:
                return True
            self._wake.set()
            time.sleep(0.01)
        return not self._queue and not self._pending

    def close(self, timeout_s: float = 5.0) -> None:
        self.flush(timeout_s)
        self._closed.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        if self._sock is not None:
            self._sock.close()

    # -- background ----------------------------------------------------------------------------
    def _run(self) -> None:
        last_announce = time.monotonic()
        while not self._closed.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            if time.monotonic() - last_announce > ANNOUNCE_EVERY_S:
                # An agent that restarted with a fresh state learns the topology again.
                last_announce = time.monotonic()
                for item in list(self._announce):
                    self._push(item, record=False)
            try:
                self._drain()
                self._deliver()
            except Exception:  # noqa: BLE001 - keep the thread alive whatever happens
                self.stats.errors += 1
                log.debug("failslow sdk flush failed", exc_info=True)

    def _drain(self) -> None:
        mark = None
        if self.watermark is not None:  # read before the queue: what it vouches for is in it
            try:
                mark = self.watermark()
            except Exception:  # noqa: BLE001 - vouching for nothing is always safe
                mark = None
        if mark is not None and (self._queue or self.spool_dir is None):
            # (a mark alone is a datagram every flush; in a spool directory it would be a
            # file: there a process marks only with records)
            self._queue.append([MARK, int(mark[0]), int(mark[1])])
        if not self._queue:
            return
        head = wire.header(self.job, self._pid)
        budget = wire.MAX_DATAGRAM - len(head) - 1
        lines: list[bytes] = []
        size = marks = 0  # (a mark is no record: not counted as one)
        while self._queue:
            item = self._queue.popleft()
            line = orjson.dumps(item)
            if lines and size + len(line) + 1 > budget:
                self._enqueue(head + b"\n" + b"\n".join(lines), len(lines) - marks)
                lines, size, marks = [], 0, 0
            lines.append(line)
            size += len(line) + 1
            marks += item[0] == MARK
        if lines:
            self._enqueue(head + b"\n" + b"\n".join(lines), len(lines) - marks)

    def _enqueue(self, payload: bytes, count: int) -> None:
        self._pending.append(payload)
        self.stats.pending_bytes += len(payload)
        self._counts.append(count)
        self.stats.undelivered += count
        while self.stats.pending_bytes > self.max_pending_bytes and self._pending:
            dropped = self._pending.popleft()
            self.stats.pending_bytes -= len(dropped)
            count = self._counts.popleft()
            self.stats.dropped += count
            self.stats.undelivered -= count

    def _deliver(self) -> None:
        while self._pending:
            payload = self._pending[0]
            if not self._send(payload):
                return
            self._pending.popleft()
            self.stats.pending_bytes -= len(payload)
            count = self._counts.popleft()
            self.stats.sent += count
            self.stats.undelivered -= count

    def _agent_missing(self) -> None:
        now = time.monotonic()
        if self._absent_since is None:
            self._absent_since = now
        self.stats.agent_absent = True
        if self.stats.agent_absent_warnings == 0 and (
            now - self._absent_since >= self.warn_no_agent_after_s
        ):
            self.stats.agent_absent_warnings += 1
            log.warning(
                "failslow: no node agent takes this process's records (job %s, socket %s) for "
                "%.0f s; %d records wait (at most %d MiB are kept, then the oldest are dropped). "
                "Start `failslow agent --job %s` on this node, or check FAILSLOW_SOCKET.",
                self.job,
                self.socket_path,
                now - self._absent_since,
                self.stats.undelivered,
                self.max_pending_bytes >> 20,
                self.job,
            )

    def _agent_found(self) -> None:
        if self._absent_since is not None and self.stats.agent_absent_warnings:
            log.warning("failslow: the node agent takes this process's records again")
        self._absent_since = None
        self.stats.agent_absent = False

    def _send(self, payload: bytes) -> bool:
        if self.spool_dir is not None:
            self._file_seq += 1
            name = f"sdk-{self._pid}-{time.time_ns()}-{self._file_seq:09d}.jsonl"
            tmp = self.spool_dir / (name + ".tmp")
            tmp.write_bytes(payload)
            tmp.rename(self.spool_dir / name)
            return True
        assert self.socket_path is not None
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
        try:
            self._sock.sendto(payload, self.socket_path)
        except OSError as exc:
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                self._agent_missing()
                return False  # agent absent: keep it for later
            if exc.errno in (errno.EAGAIN, errno.ENOBUFS):
                return False  # agent busy: keep it for later
            raise
        if self._absent_since is not None:
            self._agent_found()
        return True


_default: Recorder | None = None


def configure(job: str | None = None, **kwargs: Any) -> Recorder:
    """Set up the process-wide recorder (job from ``FAILSLOW_JOB`` when not given)."""
    global _default
    job = job or os.environ.get("FAILSLOW_JOB", "default")
    kwargs.setdefault("socket_path", os.environ.get("FAILSLOW_SOCKET"))
    kwargs.setdefault("spool_dir", os.environ.get("FAILSLOW_SPOOL_DIR"))
    if _default is not None:
        _default.close(timeout_s=1.0)
    _default = Recorder(job, **kwargs)
    return _default


def recorder() -> Recorder:
    return _default or configure()
