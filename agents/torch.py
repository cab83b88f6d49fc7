"""PyTorch source: time every collective and p2p call of ``torch.distributed`` (optional extra).

``Instrumentation(recorder).install()`` wraps the public ``torch.distributed`` functions
(all_reduce, all_gather, all_gather_into_tensor/_single, reduce_scatter, reduce_scatter_tensor,
broadcast, reduce, all_to_all, all_to_all_single, barrier, send, recv, isend, irecv) so that each
call records its communicator, per-communicator sequence number, op, bytes, start and end on this
process's wall clock, and hands the record to the node agent through the SDK (never blocking).
Asynchronous calls (``async_op=True``, ``isend``/``irecv``) are completed from the ``Work``'s
future. Data-parallel gradients, which DDP reduces in C++, are timed by handing DDP the process
group returned by :meth:`process_group` (``DDP(model, process_group=inst.process_group(group))``):
a Python ``ProcessGroup`` that forwards to the real one and times the calls DDP's reducer makes on
it, while DDP keeps its own C++ gradient path (the 1/world-size scaling fused into the copy into
the bucket, no Python per bucket except the timing). :meth:`ddp_hook`, a comm hook with the
arithmetic of DDP's default one, does the same job for code that needs a comm hook anyway; it
costs more (an extra pass over every gradient bucket for the scaling, and a Python future
callback per bucket). Results are never changed: the wrappers call the
original function with the original arguments and return its result; errors of the
instrumentation itself are counted and swallowed, the training's own errors pass through.

On CPU/gloo the wall clock around the call is exact. On GPUs a wall clock around an asynchronous
NCCL launch measures the launch, not the collective, so calls on CUDA tensors are timed with CUDA
events instead: one recorded on the caller's current stream before the call (the moment this rank's
stream reaches the collective: its arrival) and one recorded, after completion, on a stream that
waits for the collective (the caller's stream after a synchronous call or ``wait()``; inside the
Work future's callback, whose current stream PyTorch synchronises with the work, for asynchronous
calls and DDP buckets). The watchdog thread polls the events and records ``start`` = host launch
time, ``end`` = ``start`` + the GPU time between the events (arrival to completion: the waiting for
late peers included, which is what the service's lateness needs). ``ProcessGroupNCCL``'s
on-completion hook was not used: PyTorch deprecated it in 2.6 in favour of the Flight Recorder
(which the agent reads, ``failslow.agents.sources.flight_recorder``), and it requires
``TORCH_NCCL_ENABLE_TIMING``. The CUDA path is exercised here only with stand-in events (no GPU on
the development machines); the logic around them is the same code.

A call still in flight after ``inflight_after_s`` is reported once with ``end_ns: null`` by a
watchdog thread (the training thread may be the one that is blocked); the completed record follows
when it returns. This is what lets the service name the root of a hang: the ranks that never
entered the collective the others are stuck in.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from failslow.agents.sdk import Recorder

COLLECTIVES = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "all_gather_into_tensor": "allgather",
    "all_gather_single": "allgather",
    "reduce_scatter": "reducescatter",
    "reduce_scatter_tensor": "reducescatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "all_to_all": "alltoall",
    "all_to_all_single": "alltoall",
    "barrier": "barrier",
}
P2P = {"send": "send", "recv": "recv", "isend": "send", "irecv": "recv"}
ASYNC_P2P = ("isend", "irecv")


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return 0


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, list | tuple):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def _ranks(group: Any) -> list[int]:
    """Global ranks of a process group (None or WORLD: every rank), in group order."""
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


class _TimedWork:
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


class Instrumentation:
    def __init__(
        self,
        recorder: Recorder,
        *,
        clock: Callable[[], int] = time.time_ns,
        inflight_after_s: float | None = 1.0,
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
        self._watchdog: threading.Thread | None = None
        self._stop = threading.Event()
        self.errors = 0
        self.recorded = 0
        self._originals: dict[str, Callable[..., Any]] = {}
        self._names: dict[int, str] = {}  # id(process group) -> comm id
        self._pairs: set[str] = set()
        self._seq: dict[str, int] = {}
        self._lock = threading.Lock()
        self._rank: int | None = None
        self._local = threading.local()

    # -- set-up ----------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        if self._rank is None:
            self._rank = dist.get_rank()
        return self._rank

    def install(self) -> Instrumentation:
        """Wrap the ``torch.distributed`` functions (idempotent)."""
        if self._originals:
            return self
        self.recorder.register_rank(self.rank, world_size=dist.get_world_size())
        for name in (*COLLECTIVES, *P2P):
            original = getattr(dist, name, None)
            if original is None:
                continue
            self._originals[name] = original
            setattr(dist, name, self._wrap(name, original))
        needs_thread = self.inflight_after_s is not None or self.gpu_timing is not False
        if needs_thread and self.poll_s is not None and self._watchdog is None:
            self._stop.clear()
            self._watchdog = threading.Thread(
                target=self._watch, name="failslow-inflight", daemon=True
            )
            self._watchdog.start()
        return self

    def uninstall(self) -> None:
        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals.clear()
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join(timeout=2.0)
            self._watchdog = None
        self.poll_events()

    def _watch(self) -> None:
        while not self._stop.wait(self._next_wake()):
            self.poll_events()
            self.report_inflight()

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
            tensor = _first_tensor(value)
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
        self._record(comm, seq, op, nbytes, start, self.clock(), peer)

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
        limit = self.clock() - int(self.inflight_after_s * 1e9)
        with self._lock:
            due = [(k, v) for k, v in self._inflight.items() if not v[4] and v[2] <= limit]
            for _, v in due:
                v[4] = True
        for (comm, seq), (op, nbytes, start, peer, _) in due:
            self._emit(comm, seq, op, nbytes, start, None, peer)
        self.inflight_reported += len(due)
        return len(due)

    def register_group(self, name: str, kind: str, group: Any = None) -> None:
        """Name a process group (``kind``: dp, tp, pp, ep, cp, world, other) and announce it."""
        self._names[id(group if group is not None else dist.group.WORLD)] = name
        self.recorder.register_comm(name, kind, _ranks(group))

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        with self.recorder.step(rank=self.rank, step=step):
            yield

    # -- naming ----------------------------------------------------------------------------------
    def _comm(self, group: Any) -> str:
        key = id(group if group is not None else dist.group.WORLD)
        name = self._names.get(key)
        if name is None:
            with self._lock:
                name = self._names.get(key)
                if name is None:
                    ranks = _ranks(group)
                    kind = "world" if len(ranks) == dist.get_world_size() else "other"
                    name = "world" if kind == "world" else "pg-" + "-".join(map(str, ranks))
                    self._names[key] = name
                    self.recorder.register_comm(name, kind, ranks)
        return name

    def _next(self, comm: str, step: int = 1, offset: int = 0) -> int:
        with self._lock:
            n = self._seq.get(comm, 0)
            self._seq[comm] = n + 1
        return n * step + offset

    def _p2p(self, me: int, peer: int, sending: bool) -> tuple[str, int]:
        """A pair's comm; seq = 2k + direction, so that a send and its recv agree."""
        a, b = (me, peer) if sending else (peer, me)  # the message goes a -> b
        lo, hi = min(a, b), max(a, b)
        comm = f"p2p-{lo}-{hi}"
        if comm not in self._pairs:
            self._pairs.add(comm)
            self.recorder.register_comm(comm, "p2p", [lo, hi])
        return comm, self._next(f"{comm}:{a}>{b}", 2, 0 if a < b else 1)

    # -- wrapping --------------------------------------------------------------------------------
    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        params = list(inspect.signature(original).parameters.values())
        index = {p.name: i for i, p in enumerate(params)}
        defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        op = COLLECTIVES.get(name) or P2P[name]
        p2p = name in P2P
        always_async = name in ASYNC_P2P
        payload = next(
            (
                k
                for k in ("tensor", "input_tensor", "input", "input_list", "input_tensor_list")
                if k in index
            ),
            None,
        )

        def arg(args: tuple[Any, ...], kwargs: dict[str, Any], key: str) -> Any:
            i = index.get(key)
            if i is not None and i < len(args):
                return args[i]
            return kwargs.get(key, defaults.get(key))

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._local, "inside", False):  # a wrapped call made by another one
                return original(*args, **kwargs)
            try:
                group = arg(args, kwargs, "group")
                if p2p:
                    sending = op == "send"
                    peer = arg(args, kwargs, "dst" if sending else "src")
                    if peer is None:
                        group_peer = arg(args, kwargs, "group_dst" if sending else "group_src")
                        peer = dist.get_global_rank(group, group_peer)
                    comm, seq = self._p2p(self.rank, int(peer), sending)
                else:
                    comm, peer = self._comm(group), None
                    seq = self._next(comm)
                value = arg(args, kwargs, payload) if payload else None
                nbytes = _nbytes(value)
                asynchronous = always_async or bool(arg(args, kwargs, "async_op"))
            except Exception:  # noqa: BLE001 - never into the training loop
                self.errors += 1
                return original(*args, **kwargs)
            start = self.clock()
            self._begin(comm, seq, op, nbytes, start, peer)
            event = self._event_start(value)
            self._local.inside = True
            try:
                result = original(*args, **kwargs)
            finally:
                self._local.inside = False
            if asynchronous and result is not None:
                return self._on_done(result, comm, seq, op, nbytes, start, peer, event)
            self._complete(comm, seq, op, nbytes, start, peer, event)
            return result

        return wrapper

    def _on_done(
        self,
        work: Any,
        comm: str,
        seq: int,
        op: str,
        nbytes: int,
        start: int,
        peer: int | None,
        event: Any = None,
    ) -> Any:
        """Record when the asynchronous call completes: from its future where the backend has
        one; otherwise (gloo's send/recv) when the caller's ``wait()`` returns."""

        def done(*_: Any) -> None:
            self._complete(comm, seq, op, nbytes, start, peer, event)

        try:
            work.get_future().add_done_callback(done)
            return work
        except Exception:  # noqa: BLE001 - no futures for this work
            return _TimedWork(work, done)

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

    # -- DDP -------------------------------------------------------------------------------------
    def process_group(self, group: Any = None, name: str = "dp", kind: str = "dp") -> Any:
        """A process group for DDP (``DistributedDataParallel(model, process_group=...)``) that
        forwards every call to ``group`` (None: the default group) and times the collectives DDP
        makes on it: the gradient buckets' all-reduces, the parameter broadcasts and shape checks,
        all under the comm id ``name``. DDP's own C++ gradient arithmetic is untouched, so losses
        are bit-identical, and it is cheaper than :meth:`ddp_hook` (no extra pass over the
        buckets). Calls on it through ``torch.distributed`` functions (``group=`` the returned
        group) are timed once, by those functions' wrappers, also as ``name``. It lives as long
        as the real group: destroy that one (``dist.destroy_process_group(group)``), not this."""
        real = group if group is not None else dist.group.WORLD
        timed = _TimedProcessGroup(self, real, name)
        try:  # PyTorch's private group tables, so that dist.get_rank(timed) & co. accept it
            world = dist.distributed_c10d._world
            if real in world.pg_group_ranks:
                world.pg_group_ranks[timed] = world.pg_group_ranks[real]
            if real in world.pg_map:
                world.pg_map[timed] = world.pg_map[real]
        except Exception:  # noqa: BLE001 - only dist.get_rank(timed) & co. fail without them
            self.errors += 1
        self._names[id(timed)] = name
        self.recorder.register_comm(name, kind, _ranks(real))
        return timed

    def ddp_hook(
        self, name: str = "dp", kind: str = "dp", group: Any = None
    ) -> Callable[[Any, Any], torch.futures.Future[torch.Tensor]]:
        """A DDP comm hook doing what DDP's default does (scale the bucket by 1 / group size,
        all-reduce it) and timing each bucket's all-reduce. Use it as
        ``ddp.register_comm_hook(None, instrumentation.ddp_hook())``.

        DDP's reducer multiplies by the reciprocal (``at::mul(grad, 1.0 / div_factor)``);
        dividing instead, as PyTorch's own ``allreduce_hook`` does, rounds differently when the
        group size is not a power of two, and training would no longer be bit-identical."""
        self.recorder.register_comm(name, kind, _ranks(group))  # its own id: DDP's buckets only
        all_reduce = self._originals.get("all_reduce", dist.all_reduce)
        size = dist.get_world_size(group)

        def hook(_state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:  # noqa: D401
            tensor = bucket.buffer()
            tensor.mul_(1.0 / size)
            seq = self._next(name)
            nbytes = _nbytes(tensor)
            start = self.clock()
            self._begin(name, seq, "allreduce", nbytes, start, None)
            event = self._event_start(tensor)
            fut = all_reduce(tensor, group=group, async_op=True).get_future()

            def done(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
                # on CUDA, PyTorch runs this with a current stream that waits for the all-reduce
                self._complete(name, seq, "allreduce", nbytes, start, None, event)
                return f.value()[0]

            return fut.then(done)

        # DDP checks the annotations as objects (this module's are strings)
        hook.__annotations__ = {
            "_state": object,
            "bucket": dist.GradBucket,
            "return": torch.futures.Future[torch.Tensor],
        }
        return hook


# The methods of ProcessGroup that a Python subclass can override (PyTorch's PyProcessGroup
# trampoline) and that are timed; -> the v1 op name and the argument holding the payload.
_PG_TIMED = {
    "allreduce": ("allreduce", 0),
    "allreduce_coalesced": ("allreduce", 0),
    "broadcast": ("broadcast", 0),
    "allgather": ("allgather", 1),
    "reduce_scatter": ("reducescatter", 1),
    "all_to_all_single": ("alltoall", 1),
    "barrier": ("barrier", None),
}


class _TimedProcessGroup(dist.ProcessGroup):  # type: ignore[misc]
    """A ``dist.ProcessGroup`` wrapping ``real`` (see :meth:`Instrumentation.process_group`).

    The real group's backends are registered on the wrapper, so every method it does not
    override (``_allgather_base``, ``reduce``, ``gather``, ...) goes straight to them, untimed.
    The timed ones forward to ``real``'s and complete from the returned ``Work``'s future (gloo
    and NCCL collectives have one; where one does not, the call is dropped from the in-flight
    table and counted in ``untimed``, never reported as blocked)."""

    def __init__(self, inst: Instrumentation, real: Any, name: str) -> None:
        super().__init__(real.rank(), real.size())
        self.inst, self.real, self.comm = inst, real, name
        self.untimed = 0
        self._backend_name = real._get_backend_name()
        backend_type = getattr(
            dist.ProcessGroup.BackendType,
            self._backend_name.upper(),
            dist.ProcessGroup.BackendType.CUSTOM,
        )
        for device in real._device_types:
            self._register_backend(device, backend_type, real._get_backend(device))
        self._set_default_backend(backend_type)

    def getBackendName(self) -> str:  # noqa: N802 - PyTorch's name
        return str(self._backend_name)

    def _timed(self, method: str, args: tuple[Any, ...]) -> Any:
        inst, name = self.inst, self.comm
        forward = getattr(self.real, method)
        if getattr(inst._local, "inside", False):  # timed by a torch.distributed wrapper
            return forward(*args)
        try:
            op, payload = _PG_TIMED[method]
            value = args[payload] if payload is not None else None
            nbytes = _nbytes(value)
            seq = inst._next(name)
        except Exception:  # noqa: BLE001 - never into the training loop
            inst.errors += 1
            return forward(*args)
        start = inst.clock()
        inst._begin(name, seq, op, nbytes, start, None)
        event = inst._event_start(value)
        try:
            work = forward(*args)
        except BaseException:
            inst._forget(name, seq)
            raise

        def done(*_: Any) -> None:
            # on CUDA, PyTorch runs this with a current stream that waits for the collective
            inst._complete(name, seq, op, nbytes, start, None, event)

        try:
            work.get_future().add_done_callback(done)
        except Exception:  # noqa: BLE001 - a Work without a future: not timed
            inst._forget(name, seq)
            self.untimed += 1
        return work

    def allreduce(self, *args: Any) -> Any:
        return self._timed("allreduce", args)

    def allreduce_coalesced(self, *args: Any) -> Any:
        return self._timed("allreduce_coalesced", args)

    def broadcast(self, *args: Any) -> Any:
        return self._timed("broadcast", args)

    def allgather(self, *args: Any) -> Any:
        return self._timed("allgather", args)

    def reduce_scatter(self, *args: Any) -> Any:
        return self._timed("reduce_scatter", args)

    def all_to_all_single(self, *args: Any) -> Any:
        return self._timed("all_to_all_single", args)

    def barrier(self, *args: Any) -> Any:
        return self._timed("barrier", args)
