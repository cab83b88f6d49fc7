"""PyTorch source: time every communication of a ``torch.distributed`` program (optional extra).

``Instrumentation(recorder).install()`` — or no code at all: ``failslow run -- torchrun ...``
(:mod:`failslow.agents.torch.autoload`) — records, for each collective and point-to-point call,
its communicator, the per-communicator sequence number, the op, the bytes, and when this rank
entered and left it, and hands the record to the node agent through the SDK (never blocking).

**Where it looks.** Below the Python API: every communication PyTorch makes passes its
dispatcher as a ``c10d::`` operator, and a kernel of ours on each of them times the call
(:mod:`~failslow.agents.torch.dispatch`). That sees ``torch.distributed``'s functions however
they are reached, ``P2POp``/``batch_isend_irecv`` and ``torch.distributed.pipelining``, the
coalescing manager, DDP's C++ gradient buckets, and the functional collectives of DTensor,
FSDP2 and ``torch.compile``'d graphs — and changes nothing of ``torch.distributed``: no function
or class is replaced, every call goes on with its own arguments and returns its own result. It
may be installed before ``init_process_group``.

**Names.** Groups are named on first use (:mod:`~failslow.agents.torch.naming`): by hand
(:meth:`Instrumentation.register_group`), else from ``DeviceMesh``'s dimension names and
Megatron-Core's groups (``dp``, ``tp``, ``pp``, ``cp``, ``ep``), else ``world`` / ``other``.
Point-to-point calls go to the pair's comm ``p2p-<a>-<b>``.

**Steps.** ``with instrumentation.step(i):`` marks steps; a script that marks none gets one per
``step()`` of its first optimizer (:mod:`~failslow.agents.torch.steps`).

**Timing.** On CPU/gloo the wall clock around the call, its end taken when its ``Work``
completes (its future; for gloo's send/recv, when it is waited for). On GPUs a wall clock around
an asynchronous NCCL launch measures the launch, so calls on CUDA tensors are timed with CUDA
events instead: one recorded on the caller's stream before the call (when this rank's stream
reaches the collective: its arrival), one after completion on a stream that waits for it (in
the ``Work`` future's callback). The watchdog thread polls the events and records ``start`` =
host launch time, ``end`` = ``start`` + the GPU time between the events (arrival to completion,
the wait for late peers included, which the service's lateness needs).

A call still in flight after ``inflight_after_s`` is reported once with ``end_ns: null`` by the
watchdog thread (the training thread may be the one that is blocked); the completed record
follows. This is what lets the service name the root of a hang.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from failslow.agents.sdk import Recorder
from failslow.agents.torch.ddp import ddp_hook
from failslow.agents.torch.dispatch import Interception
from failslow.agents.torch.naming import Naming
from failslow.agents.torch.steps import Steps
from failslow.agents.torch.timing import CallTimer
from failslow.detectors.vocab import CommKind

__all__ = ["Instrumentation"]


class Instrumentation(CallTimer):
    """Times every communication of this process (see the module's docstring)."""

    def __init__(self, recorder: Recorder, *, auto_steps: bool = True, **kwargs: Any) -> None:
        """``auto_steps``: mark a step at each ``step()`` of the first optimizer while the
        script marks none itself. Other arguments: :class:`CallTimer`."""
        super().__init__(recorder, **kwargs)
        self.naming = Naming(recorder.register_comm)
        self.steps = Steps(recorder, self._rank_if_known, self.clock)
        self.interception = Interception(self, self.naming, self._first_call)
        self.auto_steps = auto_steps
        self.installed = False
        self._rank_announced = False
        self._install_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------------
    def install(self) -> Instrumentation:
        """Start timing (idempotent; before or after ``init_process_group``). The threads start
        at the first communication."""
        with self._install_lock:
            if self.installed:
                return self
            if not self.interception.install():
                return self
            self.installed = True
            self.recorder.watermark = self.watermark  # (docs/ingest-v1.md, "Completeness")
            if self.auto_steps:
                self.steps.watch_optimizers()
            if dist.is_available() and dist.is_initialized():
                self._announce_rank()
        return self

    def uninstall(self) -> None:
        with self._install_lock:
            self.interception.uninstall()
            self.steps.unwatch()
            self._stop_watchdog()
            if getattr(self.recorder, "watermark", None) == self.watermark:
                self.recorder.watermark = None
            self.installed = False

    # -- what the training script may call -------------------------------------------------------
    def register_group(self, name: str, kind: str, group: Any = None) -> None:
        """Name a process group (``kind``: dp, tp, pp, ep, cp, world, other) and announce it."""
        try:
            self.naming.register(group, name, kind)
        except Exception:  # noqa: BLE001 - never into the training loop
            self.errors += 1

    @contextlib.contextmanager
    def step(self, step: int, work: float | None = None) -> Iterator[None]:
        """Mark a training step: ``with inst.step(i): ...`` (``work``: see the SDK)."""
        with self.steps.step(step, work):
            yield

    def process_group(self, group: Any = None, name: str = "dp", kind: str = CommKind.DP) -> Any:
        """Name ``group`` (None: the default group) and return it, the same object. DDP's
        buckets are timed below the Python API whichever group DDP is given; this only names
        it (kept for scripts written for earlier versions, which handed DDP a wrapper)."""
        self.register_group(name, kind, group)
        return group

    def ddp_hook(
        self, name: str = "dp", kind: str = CommKind.DP, group: Any = None
    ) -> Callable[[Any, Any], torch.futures.Future[torch.Tensor]]:
        """See :func:`~failslow.agents.torch.ddp.ddp_hook`."""
        self.register_group(name, kind, group)
        return ddp_hook(group)

    def stats(self) -> dict[str, Any]:
        """What the instrumentation saw and did (also in ``failslow doctor``'s report)."""
        sdk = self.recorder.stats
        return {
            "installed": self.installed,
            "intercepting": self.interception.active,
            "operators": list(self.interception.operators),
            "operators_missing": list(self.interception.missing),
            "calls_seen": self.interception.intercepted,
            "recorded": self.recorded,
            "untimed": self.interception.untimed,
            "unattributed": self.interception.unattributed,
            "errors": self.errors + self.interception.faults + self.steps.errors,
            "event_errors": self.event_errors,
            "inflight_reported": self.inflight_reported,
            "auto_steps": self.steps.auto_steps,
            "explicit_steps": self.steps.explicit,
            "gpu_timing": self.gpu_timing,
            "groups": {
                g.comm: {"kind": g.kind, "ranks": len(g.ranks)} for g in self.naming.groups()
            },
            "sdk": {
                "recorded": sdk.recorded,
                "sent": sdk.sent,
                "dropped": sdk.dropped,
                "errors": sdk.errors,
                "undelivered": sdk.undelivered,
            },
        }

    # -- inside ----------------------------------------------------------------------------------
    def _first_call(self) -> None:
        """The process's first communication: the recorder's and the watchdog's threads start
        here (a process that never communicates runs none)."""
        with self._install_lock:
            self.recorder.start()
            self._announce_rank()
            self.steps.first_call()
            if self.installed:
                self._start_watchdog()

    def _announce_rank(self) -> None:
        if self._rank_announced:
            return
        self._rank_announced = True
        gpu = None
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                gpu = int(torch.cuda.current_device())
        except Exception:  # noqa: BLE001
            gpu = None
        self.recorder.register_rank(self.rank, gpu=gpu, world_size=dist.get_world_size())

    def _rank_if_known(self) -> int | None:
        if self._rank is not None:
            return self._rank
        if dist.is_available() and dist.is_initialized():
            return self.rank
        return None

    def _poll_more(self) -> None:
        self.interception.poll_waiting()

    def _next_wake(self) -> float:
        wake = super()._next_wake()
        pending = self.interception._waiting or self.interception._coalesced
        return min(wake, 1.0) if pending else wake
