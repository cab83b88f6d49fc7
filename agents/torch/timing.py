"""Timing of calls: the in-flight table, CUDA events polled off the training thread, the
watchdog that reports calls blocked in flight, and the records handed to the SDK."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from failslow.agents.sdk import Recorder


def nbytes_of(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    if isinstance(value, list | tuple):
        return sum(nbytes_of(v) for v in value)
    return 0


def first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, list | tuple):
        for v in value:
            t = first_tensor(v)
            if t is not None:
                return t
    return None


def group_ranks(group: Any) -> list[int]:
    """Global ranks of a process group (None or WORLD: every rank), in group order."""
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


VOUCH_MARGIN_NS = 20_000_000  # (see CallTimer.watermark)


class TimedWork:
    """A ``Work`` whose completion is noted at the first successful ``wait()``."""

    def __init__(self, work: Any, done: Callable[[], None]) -> None:
        self._work = work
        self._done: Callable[[], None] | None = done

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        if self._done is not None:
            done, self._done = self._done, None
            done()
        return result

    def is_completed(self) -> bool:
        completed = bool(self._work.is_completed())
        if completed and self._done is not None:
            done, self._done = self._done, None
            done()
        return completed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class CallTimer:
    """Times calls and records them (the half of :class:`Instrumentation` that knows nothing of
    how calls are intercepted)."""

    def __init__(
        self,
        recorder: Recorder,
        *,
        clock: Callable[[], int] = time.time_ns,
        inflight_after_s: float | None = 0.25,
        gpu_timing: bool | None = None,
        event_factory: Callable[[], Any] | None = None,
        poll_s: float | None = 0.25,
        keep_thread_states: bool = True,
    ) -> None:
        """``inflight_after_s``: report calls blocked this long as in flight (None: never).
        ``gpu_timing``: time calls with CUDA events — None: calls on CUDA tensors, when CUDA is
        available; True: every call; False: never. ``event_factory`` makes the events (default
        ``torch.cuda.Event(enable_timing=True)``; anything with ``record()``, ``query()`` and
        ``elapsed_time(other)`` in ms). ``poll_s``: how often a background thread polls the
        events of GPU-timed calls (calls in flight are checked when they become due, see
        :meth:`_next_wake`); None: no thread, the caller runs :meth:`poll_events` and
        :meth:`report_inflight` itself. ``keep_thread_states``: see :meth:`_keep_thread_state`."""
        self.recorder = recorder
        self.clock = clock
        self.inflight_after_s = inflight_after_s
        self.poll_s = poll_s
        if gpu_timing is None and not torch.cuda.is_available():
            gpu_timing = False
        self.gpu_timing = gpu_timing
        self._new_event = event_factory or (lambda: torch.cuda.Event(enable_timing=True))
        self._events: list[tuple[Any, Any, tuple[Any, ...]]] = []  # (start, end, record)
        self.event_errors = 0
        self.inflight_reported = 0
        self.keep_thread_states = keep_thread_states
        self.thread_states_kept = 0
        # (comm, seq, rank-side key) -> [op, nbytes, start, peer, reported]
        self._inflight: dict[tuple[str, int], list[Any]] = {}
        self._last_scan_ns = 0  # when report_inflight last reported every call then due
        self._watchdog: threading.Thread | None = None
        self._stop = threading.Event()
        self.errors = 0
        self.recorded = 0
        self._seq: dict[str, int] = {}
        self._lock = threading.Lock()
        self._rank: int | None = None
        self._local = threading.local()

    @property
    def rank(self) -> int:
        if self._rank is None:
            self._rank = dist.get_rank()
        return self._rank

    def _start_watchdog(self) -> None:
        needs_thread = self.inflight_after_s is not None or self.gpu_timing is not False
        if needs_thread and self.poll_s is not None and self._watchdog is None:
            self._stop.clear()
            self._watchdog = threading.Thread(
                target=self._watch, name="failslow-inflight", daemon=True
            )
            self._watchdog.start()

    def _stop_watchdog(self) -> None:
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join(timeout=2.0)
            self._watchdog = None
        self.poll_events()

    def _watch(self) -> None:
        while not self._stop.wait(self._next_wake()):
            try:
                self.poll_events()
                self.report_inflight()
                self._poll_more()
            except Exception:  # noqa: BLE001 - the watchdog must outlive any error of ours
                self.errors += 1

    def _poll_more(self) -> None:
        """More to look at on each wake-up (subclasses)."""

    def _next_wake(self) -> float:
        """Seconds the watchdog may sleep: every ``poll_s`` while calls may be GPU-timed (their
        events need polling); otherwise until the oldest unreported call in flight becomes due
        (``inflight_after_s`` when none is in flight). A blocked call is thus reported as soon as
        it is due, and a CPU job's watchdog wakes about once per ``inflight_after_s`` instead of
        several times a second (each wake-up costs CPU on the training's cores)."""
        wake = self.poll_s if self.poll_s is not None and self.gpu_timing is not False else 60.0
        if self.inflight_after_s is not None:
            with self._lock:
                starts = [v[2] for v in self._inflight.values() if not v[4]]
            now = self.clock()
            due = (min(starts) if starts else now) + int(self.inflight_after_s * 1e9)
            wake = min(wake, max(0.02, (due - now) / 1e9))
        return wake

    # -- GPU timing ------------------------------------------------------------------------------
    def _event_start(self, value: Any) -> Any:
        """A started CUDA event when this call is timed on the GPU, else None."""
        if self.gpu_timing is False:
            return None
        if self.gpu_timing is None:
            tensor = first_tensor(value)
            if tensor is None or not tensor.is_cuda:
                return None
        return self._recorded_event()

    def _recorded_event(self) -> Any:
        """A new event recorded on the current stream; None (counted) if that fails, and the
        call falls back to the wall clock."""
        try:
            event = self._new_event()
            event.record()
            return event
        except Exception:  # noqa: BLE001
            self.event_errors += 1
            return None

    def _complete(
        self,
        comm: str,
        seq: int,
        op: str,
        nbytes: int,
        start: int,
        peer: int | None,
        event: Any,
    ) -> None:
        """The call has returned (synchronous) or completed (asynchronous): record it now on the
        wall clock, or once its end event has happened on the GPU."""
        if self.keep_thread_states and not getattr(self._local, "kept", False):
            self._keep_thread_state()
        end_event = self._recorded_event() if event is not None else None
        if end_event is not None:
            with self._lock:
                self._events.append((event, end_event, (comm, seq, op, nbytes, start, peer)))
            return
        self._record_now(comm, seq, op, nbytes, start, peer)

    def _keep_thread_state(self) -> None:
        """Keep this thread's Python thread state if it is one of the backend's own threads.

        Asynchronous work completes on the backend's C++ threads (gloo's workers, NCCL's
        watchdog), and its future runs our callback there. pybind11 gives such a thread a fresh
        Python thread state for every call into Python and deletes it afterwards, which costs
        ~50 µs per call, most of the price of timing a DDP bucket (measured: 8 buckets per step,
        +590 µs of CPU with an empty Python callback, +50 µs with the state kept). One extra
        ``PyGILState_Ensure`` (never released) keeps the state for the thread's lifetime: one
        thread state per backend thread, freed with the interpreter. Python's own threads are
        left alone."""
        self._local.kept = True
        if not isinstance(threading.current_thread(), getattr(threading, "_DummyThread", ())):
            return
        try:
            ctypes.pythonapi.PyGILState_Ensure()
            self.thread_states_kept += 1
        except Exception:  # noqa: BLE001 - only slower without it
            self.errors += 1

    def poll_events(self) -> int:
        """Record the GPU-timed calls whose end event has happened; returns how many."""
        with self._lock:
            pending, self._events = self._events, []
        if not pending:
            return 0
        keep, done = [], []
        for item in pending:
            begin, end, record = item
            try:
                if not end.query():
                    keep.append(item)
                    continue
                duration_ns = int(round(float(begin.elapsed_time(end)) * 1e6))
            except Exception:  # noqa: BLE001 - a broken event: drop it, count it
                self.event_errors += 1
                continue
            done.append((record, max(0, duration_ns)))
        if keep:
            with self._lock:
                self._events[:0] = keep
        for (comm, seq, op, nbytes, start, peer), duration_ns in done:
            self._record(comm, seq, op, nbytes, start, start + duration_ns, peer)
        return len(done)

    def report_inflight(self) -> int:
        """Report (once each) the calls in flight for longer than ``inflight_after_s``."""
        if self.inflight_after_s is None:
            return 0
        now = self.clock()
        limit = now - int(self.inflight_after_s * 1e9)
        with self._lock:
            due = [(k, v) for k, v in self._inflight.items() if not v[4] and v[2] <= limit]
            for _, v in due:
                v[4] = True
            blocked = any(v[4] for v in self._inflight.values())
        for (comm, seq), (op, nbytes, start, peer, _) in due:
            self._emit(comm, seq, op, nbytes, start, None, peer)
        self.inflight_reported += len(due)
        self._last_scan_ns = now  # (after they were handed to the recorder)
        if blocked:
            # a call blocked this long may be a hang in the making: hand over now (and at each
            # scan while it lasts), so the node agent's mark moves on (agents/urgency.py)
            self.recorder.hand_over_soon()
        return len(due)

    def watermark(self) -> tuple[int, int] | None:
        """What the recorder's next hand-over vouches for (docs/ingest-v1.md, "Completeness"):
        ``(complete_ns, inflight_after_ns)``, None when nothing (in-flight reporting off, or
        not scanned yet). Every call that ended by ``complete_ns`` is in the recorder's queue:
        wall-clock ends are read and queued under the lock this reads the clock under, GPU-timed
        calls still unresolved began after it (their end is at least their start); every call
        begun ``inflight_after_ns`` before it and not ended was reported by the last scan.
        ``VOUCH_MARGIN_NS`` earlier still: a step's end is read before it is queued."""
        if self.inflight_after_s is None or not self._last_scan_ns:
            return None
        with self._lock:
            now = self.clock()
            pending = min((rec[4] for _, _, rec in self._events), default=now)
        complete = min(now, self._last_scan_ns, pending) - VOUCH_MARGIN_NS
        return max(0, complete), int(self.inflight_after_s * 1e9)

    def _next(self, comm: str, step: int = 1, offset: int = 0) -> int:
        with self._lock:
            n = self._seq.get(comm, 0)
            self._seq[comm] = n + 1
        return n * step + offset

    def _begin(
        self, comm: str, seq: int, op: str, nbytes: int, start: int, peer: int | None
    ) -> None:
        with self._lock:
            self._inflight[(comm, seq)] = [op, nbytes, start, peer, False]

    def _forget(self, comm: str, seq: int) -> None:
        """Drop a call from the in-flight table (completed, failed or not timed)."""
        with self._lock:
            self._inflight.pop((comm, seq), None)

    def _record(
        self,
        comm: str,
        seq: int,
        op: str,
        nbytes: int,
        start: int,
        end: int | None,
        peer: int | None,
    ) -> None:
        self._forget(comm, seq)
        self._emit(comm, seq, op, nbytes, start, end, peer)

    def _record_now(
        self, comm: str, seq: int, op: str, nbytes: int, start: int, peer: int | None
    ) -> None:
        """A call that ended now, on the wall clock: its end read and queued under the lock
        (:meth:`watermark` reads the clock under it: no end it vouches for is still unqueued)."""
        with self._lock:
            self._inflight.pop((comm, seq), None)
            self._emit(comm, seq, op, nbytes, start, self.clock(), peer)

    def _emit(
        self,
        comm: str,
        seq: int,
        op: str,
        nbytes: int,
        start: int,
        end: int | None,
        peer: int | None,
    ) -> None:
        try:
            self.recorder.record_collective(
                rank=self.rank,
                comm=comm,
                seq=seq,
                op=op,
                nbytes=nbytes,
                start_ns=start,
                end_ns=end,
                peer=peer,
            )
            self.recorded += 1
        except Exception:  # noqa: BLE001
            self.errors += 1
