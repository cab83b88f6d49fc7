"""Interception below the Python API: a kernel of ours on each communicating ``c10d::`` operator.

PyTorch routes every collective and point-to-point call through its dispatcher as a ``c10d::``
operator (see :mod:`failslow.agents.torch.ops`), whatever issued it: ``torch.distributed``'s
functions (also through ``distributed_c10d`` or names bound before us), ``P2POp``s, DDP's C++
reducer, functional collectives, compiled graphs. We register a Python kernel for each at the
``BackendSelect`` dispatch key, which every call passes after autograd and before the backend
(CPU, CUDA) kernel that talks to the process group. Nothing of ``torch.distributed`` is
replaced: its functions, classes, signatures, return values, exceptions, asynchrony and autograd
are PyTorch's own, and the kernel hands every call on unchanged (``redispatch`` with the same
arguments, the result returned as it came). Under a ``TorchDispatchMode`` or while tracing
(FakeTensor), the Python key handles the call first and nothing is recorded until a real call
reaches a backend.

Completion is taken from the call's ``Work``: its future where it has one (gloo and NCCL
collectives; on CUDA the callback runs on a stream that waits for the collective, which is where
the end event is recorded). Some of gloo's works have none (send, recv, reduce-scatter, the
coalesced all-reduce and all-gather): they complete when they are waited for, so such a call is
recorded when its wait returns — ``Work.wait`` (wrapped on the class once a work without a
future is seen: PyTorch's method is called and what it returns is returned) or the functional
collectives' ``wait_tensor`` operator (a kernel of ours, after it returns, completes the pending
work whose output is the tensor waited for); the watchdog looks at ``is_completed()`` for works
waited for any other way.

Any error of ours steps aside: the call proceeds untimed and ``faults`` counts it; after
``MAX_FAULTS`` the kernels pass everything through and say so once in the log.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C import DispatchKey

from failslow.agents.torch.naming import Naming
from failslow.agents.torch.ops import SPECS, UNATTRIBUTED, OpSpec
from failslow.agents.torch.timing import CallTimer, first_tensor, nbytes_of
from failslow.detectors.vocab import Op

log = logging.getLogger("failslow.torch")

MAX_FAULTS = 1000  # errors of ours after which the interception passes everything through
MAX_WAITING = 65_536  # works without a future awaiting their wait()
WAITING_EXPIRE_S = 600.0  # a work without a future never waited for is dropped after this

_C10D = torch._C._distributed_c10d
_BACKEND_SELECT = DispatchKey.BackendSelect

# One interception per process: the dispatcher's registrations are process-wide.
_active: Interception | None = None
_active_lock = threading.Lock()
_original_wait: Callable[..., Any] | None = None


def _wait(work: Any, *args: Any, **kwargs: Any) -> Any:
    """``Work.wait`` while an interception is active: PyTorch's, then note the completion."""
    assert _original_wait is not None
    result = _original_wait(work, *args, **kwargs)
    active = _active
    if active is not None and (active._waiting or active._coalesced):
        active._waited(work)
    return result


class Interception:
    """The kernels of one :class:`~failslow.agents.torch.timing.CallTimer` and its naming."""

    def __init__(self, timer: CallTimer, naming: Naming, on_first_call: Callable[[], None]) -> None:
        self.timer = timer
        self.naming = naming
        self._on_first_call = on_first_call
        self._first = True
        self.active = False
        self.intercepted = 0  # calls seen by the kernels
        self.untimed = 0  # calls that could not be timed (no work, never waited for, ...)
        self.unattributed = 0  # receives from any source
        self.faults = 0  # errors of ours (the call went on untimed)
        self.operators: list[str] = []  # the c10d operators our kernels are registered on
        self.missing: list[str] = []  # operators this PyTorch lacks or refused a kernel for
        self._lib: Any = None
        self._functional: Any = None
        # works without a future: id(work) -> (work, since, call, output data pointers)
        self._waiting: dict[int, tuple[Any, int, tuple[Any, ...], tuple[int, ...]]] = {}
        self._by_output: dict[int, int] = {}  # an output's data pointer -> id(work)
        self._coalesced: list[tuple[int, tuple[Any, ...]]] = []  # (since, call): no work

    # -- install / uninstall -----------------------------------------------------------------
    def install(self) -> bool:
        """Register the kernels; False (and nothing registered) when another interception is
        active in this process."""
        global _active
        with _active_lock:
            if _active is not None and _active is not self:
                log.warning("failslow: torch.distributed is already instrumented in this process")
                return False
            _active = self
        self._lib = torch.library.Library("c10d", "IMPL")  # noqa: TOR901 - kernels, not ops
        for spec in SPECS:
            self._register(spec.name, self._kernel(spec))
        for name in UNATTRIBUTED:
            self._register(name, self._passthrough(name, count=True))
        try:
            self._functional = torch.library.Library("_c10d_functional", "IMPL")  # noqa: TOR901
            self._register("wait_tensor", self._after_wait(), self._functional)
        except Exception:  # noqa: BLE001 - no functional collectives in this PyTorch
            self._functional = None
        self.active = True
        return True

    def _register(self, name: str, kernel: Callable[..., Any], lib: Any = None) -> None:
        lib = lib if lib is not None else self._lib
        try:
            _ = getattr(getattr(torch.ops, lib.ns), name).default  # exists in this PyTorch?
            lib.impl(name, kernel, "BackendSelect", with_keyset=True)
            self.operators.append(f"{lib.ns}::{name}")
        except Exception:  # noqa: BLE001 - an operator this PyTorch lacks: not seen
            self.missing.append(f"{lib.ns}::{name}")

    def uninstall(self) -> None:
        global _active, _original_wait
        self.active = False
        with _active_lock:
            for lib in (self._lib, self._functional):
                if lib is not None:
                    try:
                        lib._destroy()
                    except Exception:  # noqa: BLE001
                        self.faults += 1
            self._lib = self._functional = None
            if _active is self:
                _active = None
                if _original_wait is not None:
                    _C10D.Work.wait = _original_wait
                    _original_wait = None
        self._waiting.clear()
        self._by_output.clear()
        self._coalesced.clear()

    # -- the kernels -------------------------------------------------------------------------
    def _passthrough(self, name: str, count: bool) -> Callable[..., Any]:
        redispatch = getattr(torch.ops.c10d, name).default.redispatch

        def kernel(keyset: Any, *args: Any) -> Any:
            if count and self.active:
                self.intercepted += 1
                self.unattributed += 1
            return redispatch(keyset.remove(_BACKEND_SELECT), *args)

        return kernel

    def _after_wait(self) -> Callable[..., Any]:
        """``_c10d_functional::wait_tensor``: after it returns, works it may have waited for."""
        redispatch = torch.ops._c10d_functional.wait_tensor.default.redispatch

        def kernel(keyset: Any, *args: Any) -> Any:
            out = redispatch(keyset.remove(_BACKEND_SELECT), *args)
            if self._by_output:
                try:
                    key = self._by_output.get(args[0].data_ptr())
                    if key is not None:
                        self._done_waiting(key)
                except Exception:  # noqa: BLE001
                    self._fault()
            return out

        return kernel

    def _kernel(self, spec: OpSpec) -> Callable[..., Any]:
        redispatch = getattr(torch.ops.c10d, spec.name).default.redispatch
        unbox = _C10D.ProcessGroup.unbox
        timer = self.timer

        def kernel(keyset: Any, *args: Any) -> Any:
            below = keyset.remove(_BACKEND_SELECT)
            if not self.active:
                return redispatch(below, *args)
            try:
                call = self._start(spec, args, unbox(args[spec.group]))
            except Exception:  # noqa: BLE001 - never into the training loop
                self._fault()
                call = None
            if call is None:
                return redispatch(below, *args)
            try:
                out = redispatch(below, *args)
            except BaseException:
                timer._forget(call[0], call[1])
                raise
            try:
                self._finish(spec, call, out, args)
            except Exception:  # noqa: BLE001
                timer._forget(call[0], call[1])
                self._fault()
            return out

        return kernel

    def _start(self, spec: OpSpec, args: tuple[Any, ...], pg: Any) -> tuple[Any, ...] | None:
        timer = self.timer
        if self._first:
            self._first = False
            self._on_first_call()
        self.intercepted += 1
        group = self.naming.of(pg)
        peer = None
        if spec.peer is not None:
            peer = group.ranks[int(args[spec.peer])]
            sending = spec.op == Op.SEND
            comm, direction = self.naming.pair(timer.rank, peer, sending)
            a, b = (timer.rank, peer) if sending else (peer, timer.rank)
            seq = timer._next(f"{comm}:{direction}", 2, 0 if a < b else 1)
        else:
            comm = group.comm
            seq = timer._next(comm)
        value = args[spec.payload] if spec.payload is not None else None
        nbytes = nbytes_of(value)
        if timer.gpu_timing is not False and _capturing(args):
            self.untimed += 1  # inside a CUDA graph capture: nothing runs now
            return None
        start = timer.clock()
        timer._begin(comm, seq, spec.op, nbytes, start, peer)
        event = timer._event_start(value if value is not None else first_tensor(args[0]))
        return (comm, seq, spec.op, nbytes, start, peer, event)

    def _finish(self, spec: OpSpec, call: tuple[Any, ...], out: Any, args: tuple[Any, ...]) -> None:
        timer = self.timer
        if not spec.returns_work:
            timer._complete(*call)
            return
        boxed = out[-1] if isinstance(out, tuple) else out
        work = _C10D.Work.unbox(boxed) if boxed is not None else None
        if work is None:
            if _coalescing(args[spec.group]):  # issued at the end of the block, waited for
                self._await_wait(None, call, ())
            else:  # a synchronous call without a Work (NCCL's, torch >= 2.8): done, in order
                timer._complete(*call)  # on the caller's stream
            return
        try:
            future = work.get_future()
        except RuntimeError:  # some of gloo's works: completed when waited for
            outputs = out[0] if isinstance(out, tuple) else args[0]
            self._await_wait(work, call, _data_pointers(outputs))
            return

        def done(f: Any) -> None:
            try:
                f.value()
            except Exception:  # noqa: BLE001 - the call failed: it stays in flight, unrecorded
                return
            timer._complete(*call)

        future.add_done_callback(done)

    # -- works without a future ----------------------------------------------------------------
    def _await_wait(self, work: Any, call: tuple[Any, ...], outputs: tuple[int, ...]) -> None:
        """``work`` None: a call inside a coalescing block, which has no work of its own; it
        completes when the next work is waited for (the block's)."""
        global _original_wait
        if len(self._waiting) >= MAX_WAITING:
            self.timer._forget(call[0], call[1])
            self.untimed += 1
            return
        if _original_wait is None:
            with _active_lock:
                if _original_wait is None and _active is self:
                    _original_wait = _C10D.Work.wait
                    _C10D.Work.wait = _wait
        if work is None:
            self._coalesced.append((self.timer.clock(), call))
            return
        self._waiting[id(work)] = (work, self.timer.clock(), call, outputs)
        for pointer in outputs:
            self._by_output[pointer] = id(work)

    def _waited(self, work: Any) -> None:
        entry = self._waiting.get(id(work))
        if entry is not None and entry[0] is work:
            self._done_waiting(id(work))
        if self._coalesced:
            done, self._coalesced = self._coalesced, []
            for _, call in done:
                self.timer._complete(*call)

    def _done_waiting(self, key: int, completed: bool = True) -> None:
        entry = self._waiting.pop(key, None)
        if entry is None:
            return
        for pointer in entry[3]:
            if self._by_output.get(pointer) == key:
                del self._by_output[pointer]
        if completed:
            self.timer._complete(*entry[2])
        else:
            self.timer._forget(entry[2][0], entry[2][1])
            self.untimed += 1

    def poll_waiting(self, expire: bool = True) -> None:
        """Works waited for other than through ``Work.wait`` complete here; works never
        waited for are dropped after ``WAITING_EXPIRE_S`` (``expire``)."""
        expire_ns = self.timer.clock() - int(WAITING_EXPIRE_S * 1e9) if expire else -1
        while self._coalesced and self._coalesced[0][0] < expire_ns:
            _, call = self._coalesced.pop(0)
            self.timer._forget(call[0], call[1])
            self.untimed += 1
        if not self._waiting:
            return
        for key, (work, since, _, _) in list(self._waiting.items()):
            try:
                completed = bool(work.is_completed())
            except Exception:  # noqa: BLE001
                completed = False
            if completed or since < expire_ns:
                self._done_waiting(key, completed)

    def _fault(self) -> None:
        self.faults += 1
        if self.faults >= MAX_FAULTS and self.active:
            self.active = False
            log.warning(
                "failslow: %d errors in the torch.distributed instrumentation; it now passes "
                "every call through untimed",
                self.faults,
            )


def _data_pointers(value: Any) -> tuple[int, ...]:
    """Data pointers of the output tensors of a call (where ``wait_tensor`` may name them)."""
    if isinstance(value, torch.Tensor):
        return (value.data_ptr(),)
    if isinstance(value, list | tuple):
        return tuple(p for v in value for p in _data_pointers(v))
    return ()


def _coalescing(boxed_group: Any) -> bool:
    """Whether the group is inside a ``_coalescing_manager`` block (PyTorch's own table)."""
    state = getattr(dist.distributed_c10d._world, "pg_coalesce_state", None)
    return bool(state) and _C10D.ProcessGroup.unbox(boxed_group) in state


def _capturing(args: tuple[Any, ...]) -> bool:
    """Whether the call is being captured into a CUDA graph (its events could not be timed)."""
    tensor = first_tensor(args[0])
    if tensor is None or not tensor.is_cuda:
        return False
    return bool(torch.cuda.is_current_stream_capturing())


def default_group_ready() -> bool:
    return bool(dist.is_available() and dist.is_initialized())
