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

from collections.abc import Callable
from typing import Any

import torch

from failslow.agents.torch.ddp import ddp_hook
from failslow.agents.torch.patching import Patching
from failslow.agents.torch.process_group import timed_group
from failslow.detectors.vocab import CommKind

__all__ = ["Instrumentation"]


class Instrumentation(Patching):
    """Times every ``torch.distributed`` call of this process (see the module's docstring):
    :meth:`install` wraps the functions, :meth:`step` marks steps, :meth:`process_group` times
    what DDP does on a group, :meth:`ddp_hook` does it as a comm hook."""

    def process_group(self, group: Any = None, name: str = "dp", kind: str = CommKind.DP) -> Any:
        """See :func:`~failslow.agents.torch.process_group.timed_group`."""
        return timed_group(self, group, name, kind)

    def ddp_hook(
        self, name: str = "dp", kind: str = CommKind.DP, group: Any = None
    ) -> Callable[[Any, Any], torch.futures.Future[torch.Tensor]]:
        """See :func:`~failslow.agents.torch.ddp.ddp_hook`."""
        return ddp_hook(self, name=name, kind=kind, group=group)
