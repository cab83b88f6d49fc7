"""A ``ProcessGroup`` for DDP that forwards to the real one and times what DDP's reducer calls
on it (the gradient buckets' all-reduces, broadcasts), leaving DDP's C++ gradient path alone."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from failslow.agents.torch.timing import CallTimer, group_ranks, nbytes_of
from failslow.detectors.vocab import Op


def timed_group(inst: CallTimer, group: Any, name: str, kind: str) -> Any:
    """A process group for DDP (``DistributedDataParallel(model, process_group=...)``) that
    forwards every call to ``group`` (None: the default group) and times the collectives DDP
    makes on it: the gradient buckets' all-reduces, the parameter broadcasts and shape checks,
    all under the comm id ``name``. DDP's own C++ gradient arithmetic is untouched, so losses
    are bit-identical, and it is cheaper than a comm hook (no extra pass over the buckets).
    Calls on it through ``torch.distributed`` functions (``group=`` the returned group) are
    timed once, by those functions' wrappers, also as ``name``. It lives as long as the real
    group: destroy that one (``dist.destroy_process_group(group)``), not this."""
    real = group if group is not None else dist.group.WORLD
    timed = TimedProcessGroup(inst, real, name)
    try:  # PyTorch's private group tables, so that dist.get_rank(timed) & co. accept it
        world = dist.distributed_c10d._world
        if real in world.pg_group_ranks:
            world.pg_group_ranks[timed] = world.pg_group_ranks[real]
        if real in world.pg_map:
            world.pg_map[timed] = world.pg_map[real]
    except Exception:  # noqa: BLE001 - only dist.get_rank(timed) & co. fail without them
        inst.errors += 1
    inst._names[id(timed)] = name
    inst.recorder.register_comm(name, kind, group_ranks(real))
    return timed


# The methods of ProcessGroup that a Python subclass can override (PyTorch's PyProcessGroup
# trampoline) and that are timed; -> the v1 op name and the argument holding the payload.
_PG_TIMED = {
    "allreduce": (Op.ALLREDUCE, 0),
    "allreduce_coalesced": (Op.ALLREDUCE, 0),
    "broadcast": (Op.BROADCAST, 0),
    "allgather": (Op.ALLGATHER, 1),
    "reduce_scatter": (Op.REDUCESCATTER, 1),
    "all_to_all_single": (Op.ALLTOALL, 1),
    "barrier": (Op.BARRIER, None),
}


class TimedProcessGroup(dist.ProcessGroup):  # type: ignore[misc]
    """A ``dist.ProcessGroup`` wrapping ``real`` (see :func:`timed_group`).

    The real group's backends are registered on the wrapper, so every method it does not
    override (``_allgather_base``, ``reduce``, ``gather``, ...) goes straight to them, untimed.
    The timed ones forward to ``real``'s and complete from the returned ``Work``'s future (gloo
    and NCCL collectives have one; where one does not, the call is dropped from the in-flight
    table and counted in ``untimed``, never reported as blocked)."""

    def __init__(self, inst: CallTimer, real: Any, name: str) -> None:
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
            nbytes = nbytes_of(value)
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
