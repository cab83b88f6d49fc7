"""Cost of agents.torch on a real 2-rank gloo job (CPU): per collective call, and per training step.

Per call: the same 2,000 small all_reduces with and without the instrumentation, CPU time of the
calling thread per call (the wall time of a gloo all_reduce is dominated by the rendezvous, so
the difference of CPU time is what the wrapper adds). Per step: a DDP training loop (an MLP,
several gradient buckets) timed with and without it (DDP's buckets timed below the Python
API; ``instrumented_hook``: with the comm hook ``ddp_hook`` as well), median of 5 alternating
runs. Targets (issue 5): < 20 µs per collective, < 1% of step time.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from failslow.agents.sdk import Recorder  # noqa: E402
from failslow.agents.torch import Instrumentation  # noqa: E402

CALLS = 2000


def per_call(inst: Instrumentation | None, calls: int = CALLS) -> float:
    """CPU time of this thread per ``dist.all_reduce`` of 16 floats, in µs."""
    t = torch.ones(16)
    dist.barrier()
    start = time.thread_time_ns()
    for _ in range(calls):
        dist.all_reduce(t)
    return (time.thread_time_ns() - start) / calls / 1e3


def step_loop(inst: Instrumentation | None, steps: int = 40, way: str = "group") -> float:
    """``way``: with ``inst``, ``group`` (DDP as it comes; its group named by
    Instrumentation.process_group) or ``hook`` (Instrumentation.ddp_hook); without,
    ``python_hook`` runs PyTorch's own Python all-reduce hook (the cost of any Python comm
    hook), anything else plain DDP."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
    )
    group = inst.process_group() if inst is not None and way == "group" else None
    ddp = DDP(model, bucket_cap_mb=0.5, process_group=group)
    if inst is not None and way == "hook":
        ddp.register_comm_hook(None, inst.ddp_hook())
    elif inst is None and way == "python_hook":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        ddp.register_comm_hook(None, allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    times = []
    for i in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        ctx = inst.step(i) if inst is not None else None
        if ctx is not None:
            ctx.__enter__()
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        if ctx is not None:
            ctx.__exit__(None, None, None)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[5:])


def worker(rank: int, port: int, spool: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    rec = Recorder("bench", spool_dir=spool, flush_interval_s=0.05)
    inst = Instrumentation(rec)
    calls = {"plain": [], "instrumented": []}
    steps = {"plain": [], "python_hook": [], "instrumented": [], "instrumented_hook": []}
    for _ in range(5):
        calls["plain"].append(per_call(None))
        steps["plain"].append(step_loop(None))
        steps["python_hook"].append(step_loop(None, way="python_hook"))
        inst.install()
        calls["instrumented"].append(per_call(inst))
        steps["instrumented"].append(step_loop(inst))
        steps["instrumented_hook"].append(step_loop(inst, way="hook"))
        inst.uninstall()
    rec.close()
    if rank == 0:
        res = {k: statistics.median(v) for k, v in calls.items()}
        st = {k: statistics.median(v) for k, v in steps.items()}
        Path(out).write_text(
            json.dumps(
                {
                    "all_reduce_cpu_us_per_call": {k: round(v, 2) for k, v in res.items()},
                    "added_us_per_collective": round(res["instrumented"] - res["plain"], 2),
                    "ddp_step_ms": {k: round(v * 1e3, 3) for k, v in st.items()},
                    "step_overhead_percent": round(
                        100 * (st["instrumented"] - st["plain"]) / st["plain"], 2
                    ),
                    "step_overhead_hook_percent": round(
                        100 * (st["instrumented_hook"] - st["plain"]) / st["plain"], 2
                    ),
                    "step_overhead_hook_vs_python_hook_percent": round(
                        100 * (st["instrumented_hook"] - st["python_hook"]) / st["python_hook"], 2
                    ),
                    "records": inst.recorded,
                    "errors": inst.errors,
                }
            )
        )
    dist.destroy_process_group()


def main() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        mp.spawn(worker, args=(port, os.path.join(d, "spool"), out), nprocs=2, join=True)
        result = json.loads(Path(out).read_text())
    print(json.dumps(result, indent=2))
    from bench.common import save

    save("torch_overhead", result)


if __name__ == "__main__":
    main()
