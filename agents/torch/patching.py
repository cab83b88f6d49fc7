"""Interception: the public ``torch.distributed`` functions are wrapped so that every call is
named (communicator, sequence number, op, bytes) and timed; process groups get comm ids."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from failslow.agents.torch.timing import CallTimer, TimedWork, group_ranks, nbytes_of
from failslow.detectors.vocab import CommKind, Op

COLLECTIVES = {
    "all_reduce": Op.ALLREDUCE,
    "all_gather": Op.ALLGATHER,
    "all_gather_into_tensor": Op.ALLGATHER,
    "all_gather_single": Op.ALLGATHER,
    "reduce_scatter": Op.REDUCESCATTER,
    "reduce_scatter_tensor": Op.REDUCESCATTER,
    "broadcast": Op.BROADCAST,
    "reduce": Op.REDUCE,
    "all_to_all": Op.ALLTOALL,
    "all_to_all_single": Op.ALLTOALL,
    "barrier": Op.BARRIER,
}
P2P = {"send": Op.SEND, "recv": Op.RECV, "isend": Op.SEND, "irecv": Op.RECV}
ASYNC_P2P = ("isend", "irecv")




class Patching(CallTimer):
    """Wraps and unwraps ``torch.distributed``'s functions; names groups and pairs."""

    def install(self) -> Patching:
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
        self._start_watchdog()
        return self

    def uninstall(self) -> None:
        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals.clear()
        self._stop_watchdog()

    def register_group(self, name: str, kind: str, group: Any = None) -> None:
        """Name a process group (``kind``: dp, tp, pp, ep, cp, world, other) and announce it."""
        self._names[id(group if group is not None else dist.group.WORLD)] = name
        self.recorder.register_comm(name, kind, group_ranks(group))

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
                    ranks = group_ranks(group)
                    world = len(ranks) == dist.get_world_size()
                    kind = CommKind.WORLD if world else CommKind.OTHER
                    name = "world" if world else "pg-" + "-".join(map(str, ranks))
                    self._names[key] = name
                    self.recorder.register_comm(name, kind, ranks)
        return name

    def _p2p(self, me: int, peer: int, sending: bool) -> tuple[str, int]:
        """A pair's comm; seq = 2k + direction, so that a send and its recv agree."""
        a, b = (me, peer) if sending else (peer, me)  # the message goes a -> b
        lo, hi = min(a, b), max(a, b)
        comm = f"p2p-{lo}-{hi}"
        if comm not in self._pairs:
            self._pairs.add(comm)
            self.recorder.register_comm(comm, CommKind.P2P, [lo, hi])
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
                    sending = op == Op.SEND
                    peer = arg(args, kwargs, "dst" if sending else "src")
                    if peer is None:
                        group_peer = arg(args, kwargs, "group_dst" if sending else "group_src")
                        peer = dist.get_global_rank(group, group_peer)
                    comm, seq = self._p2p(self.rank, int(peer), sending)
                else:
                    comm, peer = self._comm(group), None
                    seq = self._next(comm)
                value = arg(args, kwargs, payload) if payload else None
                nbytes = nbytes_of(value)
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
            return TimedWork(work, done)
