"""Scenarios for tests/agents/test_torch_paths.py, run inside real gloo ranks (spawned).

Each scenario runs a few steps of one way PyTorch communicates. Around every step PyTorch's own
profiler counts the backend's communication events (``gloo:all_reduce``, ``gloo:send``, ...:
recorded inside ProcessGroupGloo, not by the dispatcher that failslow's kernels sit on); the
test compares failslow's records of the same step with that count.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import all_reduce as bound_before_install  # a name bound early
from torch.profiler import ProfilerActivity, profile

# gloo implements reduce-scatter with an all-reduce; the other backend events are one to one
BACKEND_TO_OP = {
    "gloo:all_reduce": "allreduce",
    "gloo:all_gather": "allgather",
    "gloo:broadcast": "broadcast",
    "gloo:reduce": "reduce",
    "gloo:gather": "reduce",
    "gloo:scatter": "broadcast",
    "gloo:all_to_all": "alltoall",
    "gloo:barrier": "barrier",
    "gloo:send": "send",
    "gloo:recv": "recv",
}


class Capture:
    """A recorder that keeps records in memory (the SDK's interface, no thread)."""

    def __init__(self) -> None:
        self.collectives: list[dict[str, Any]] = []
        self.steps: list[tuple[int, int]] = []
        self.comms: dict[str, tuple[str, list[int]]] = {}
        self.ranks: list[tuple[int, int | None]] = []
        self._lock = threading.Lock()

        class _Stats:
            recorded = sent = dropped = errors = undelivered = 0

        self.stats = _Stats()

    def start(self) -> None:
        return None

    def register_rank(
        self, rank: int, *, gpu: int | None = None, world_size: int | None = None
    ) -> None:
        self.ranks.append((rank, world_size))

    def register_comm(self, comm: str, kind: str, ranks: list[int]) -> None:
        self.comms[comm] = (str(kind), list(ranks))

    def record_collective(self, **kw: Any) -> None:
        with self._lock:
            self.collectives.append(kw)

    def record_step(
        self, *, rank: int, step: int, start_ns: int, end_ns: int, work: Any = None
    ) -> None:
        self.steps.append((rank, step))

    def step(self, *, rank: int, step: int, work: Any = None) -> Any:
        import contextlib

        @contextlib.contextmanager
        def cm() -> Any:
            yield
            self.steps.append((rank, step))

        return cm()


def _c10d_calls(rank: int) -> None:
    t = torch.ones(8) + rank
    dist.all_reduce(t)
    dist.distributed_c10d.all_reduce(t)
    bound_before_install(t)
    dist.all_reduce(t, async_op=True).wait()
    dist.all_gather_into_tensor(torch.empty(16), torch.ones(8))
    dist.all_gather([torch.empty(2), torch.empty(2)], torch.ones(2))
    dist.broadcast(t, src=0)
    dist.reduce(t, dst=0)
    dist.gather(torch.ones(2), [torch.empty(2), torch.empty(2)] if rank == 0 else None, dst=0)
    dist.scatter(torch.empty(2), [torch.ones(2), torch.ones(2)] if rank == 0 else None, src=0)
    dist.all_to_all_single(torch.empty(4), torch.ones(4))
    dist.barrier()


def _p2p_calls(rank: int) -> None:
    peer = 1 - rank
    if rank == 0:
        dist.send(torch.ones(4), dst=1)
        dist.isend(torch.ones(4), dst=1).wait()
    else:
        dist.recv(torch.empty(4), src=0)
        dist.irecv(torch.empty(4), src=0).wait()
    ops = [
        dist.P2POp(dist.isend, torch.ones(3) * rank, peer),
        dist.P2POp(dist.irecv, torch.empty(3), peer),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def _coalesced_calls(rank: int) -> None:
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(torch.ones(2))
        dist.all_reduce(torch.ones(3))
    cm.wait()
    dist.all_reduce_coalesced([torch.ones(2), torch.ones(5)])


def _functional_calls(rank: int) -> None:
    import torch.distributed._functional_collectives as funcol

    out = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)
    out = funcol.all_gather_tensor(out, 0, dist.group.WORLD)
    out = funcol.reduce_scatter_tensor(out, "sum", 0, dist.group.WORLD)
    out.wait() if hasattr(out, "wait") else None


class _Steps:
    """Scenarios made of steps: ``setup()`` once, then ``step(i)`` a few times."""

    def __init__(self, setup: Callable[[int], Any], step: Callable[[Any, int], None]) -> None:
        self.setup = setup
        self.step = step


def _ddp_setup(rank: int) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=0.01)


def _train_step(state: Any, i: int) -> None:
    model, opt = state
    opt.zero_grad()
    model(torch.randn(8, 16)).pow(2).sum().backward()
    opt.step()


def _fsdp2_setup(rank: int) -> Any:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)
    )
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _tp_setup(rank: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _pp_setup(rank: int) -> Any:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.manual_seed(0)
    stage_mod = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh())
    stage = PipelineStage(stage_mod, rank, 2, torch.device("cpu"))

    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (out - target).pow(2).mean()

    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=loss)  # every stage: backward too
    return schedule, torch.optim.SGD(stage_mod.parameters(), lr=0.01), rank


def _pp_step(state: Any, i: int) -> None:
    schedule, opt, rank = state
    opt.zero_grad()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(i))
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=torch.zeros(4, 16))
    opt.step()


def _compiled_setup(rank: int) -> Any:
    import torch.distributed._functional_collectives as funcol

    def f(x: torch.Tensor) -> torch.Tensor:
        y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
        return funcol.all_gather_tensor(y + 1, 0, dist.group.WORLD) * 3

    return torch.compile(f, fullgraph=True)


def _compiled_step(fn: Any, i: int) -> None:
    out = fn(torch.ones(4) * i)
    out.wait() if hasattr(out, "wait") else float(out.sum())


SCENARIOS: dict[str, Any] = {
    "c10d": _c10d_calls,
    "p2p": _p2p_calls,
    "coalesced": _coalesced_calls,
    "functional": _functional_calls,
    "ddp": _Steps(_ddp_setup, _train_step),
    "fsdp2": _Steps(_fsdp2_setup, _train_step),
    "dtensor_tp": _Steps(_tp_setup, _train_step),
    "pipelining": _Steps(_pp_setup, _pp_step),
    "compiled": _Steps(_compiled_setup, _compiled_step),
}
STEPS = 3


def backend_counts(prof: Any) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    for event in prof.events():
        op = BACKEND_TO_OP.get(event.name)
        if op is not None:
            counts[op] += 1
    return dict(counts)


def worker(rank: int, port: int, names: list[str], out: str) -> None:
    """One rank: every scenario in turn; per step, failslow's records and the backend's count."""
    warnings.simplefilter("ignore", FutureWarning)  # reduce_scatter_tensor's deprecation (2.13)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from failslow.agents.torch import Instrumentation

    capture = Capture()
    inst = Instrumentation(capture, inflight_after_s=None, poll_s=None)  # type: ignore[arg-type]
    inst.install()  # before the process group exists
    dist.init_process_group("gloo", rank=rank, world_size=2)
    results: dict[str, Any] = {}
    for name in names:
        scenario = SCENARIOS[name]
        state = scenario.setup(rank) if isinstance(scenario, _Steps) else None
        dist.barrier()
        steps = []
        for i in range(STEPS if state is not None else 1):
            before = len(capture.collectives)
            seen = inst.interception.intercepted
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                if state is None:
                    scenario(rank)
                else:
                    scenario.step(state, i)
            _settle(inst, capture, inst.interception.intercepted - seen, before)
            got = collections.Counter(str(c["op"]) for c in capture.collectives[before:])
            steps.append({"failslow": dict(got), "backend": backend_counts(prof)})
            dist.barrier()  # not inside the profiled step
        results[name] = steps
    inst.uninstall()
    results["_records"] = [
        (c["comm"], c["seq"], str(c["op"]), c["nbytes"], c["start_ns"], c["end_ns"], c["peer"])
        for c in capture.collectives
    ]
    results["_comms"] = {k: (str(kind), r) for k, (kind, r) in capture.comms.items()}
    results["_stats"] = inst.stats()
    results["_steps"] = capture.steps
    with open(out, "w") as f:
        json.dump(results, f, default=str)
    dist.destroy_process_group()


def _settle(inst: Any, capture: Capture, calls: int, before: int) -> None:
    """Wait until every call of the step has completed and been recorded (callbacks run on
    gloo's threads)."""
    import time

    deadline = time.monotonic() + 10
    while len(capture.collectives) - before < calls and time.monotonic() < deadline:
        inst.poll_events()
        time.sleep(0.005)
