"""agents.torch's CUDA-event path on NCCL, on a machine with GPUs: the same checks as on gloo.

One rank per GPU (at most ``--ranks``; one GPU: a one-rank NCCL group). For each way of
communicating — torch.distributed's functions (sync and async), the coalescing manager,
functional collectives, DDP, FSDP2, a ``torch.compile``'d graph, and with two ranks or more
``batch_isend_irecv`` — a few steps are run; per step failslow's records are compared with two
independent counts: PyTorch's profiler (``nccl:*`` events recorded inside ProcessGroupNCCL) and
the Flight Recorder's entries (``TORCH_FR_BUFFER_SIZE``). Timing: a 1 GiB all-reduce queued
behind ~50 ms of matrix products on the same stream: the record's duration must be the
collective's GPU time (compared with the NCCL kernel's time in the profiler), not the host's
launch time (microseconds) nor the queue in front of it.

    python bench/torch_gpu.py [--ranks 8] [--json OUT]

Needs CUDA and NCCL; prints the JSON result and exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROFILER_TO_OP = {
    "nccl:all_reduce": "allreduce",
    "nccl:all_reduce_coalesced": "allreduce",
    "nccl:allreduce_coalesced": "allreduce",
    "nccl:all_gather": "allgather",
    "nccl:_all_gather_base": "allgather",
    "nccl:all_gather_into_tensor_coalesced": "allgather",
    "nccl:reduce_scatter": "reducescatter",
    "nccl:_reduce_scatter_base": "reducescatter",
    "nccl:reduce_scatter_tensor_coalesced": "reducescatter",
    "nccl:broadcast": "broadcast",
    "nccl:reduce": "reduce",
    "nccl:all_to_all": "alltoall",
    "nccl:send": "send",
    "nccl:recv": "recv",
}


class Capture:
    """A recorder that keeps what it is given (the SDK's interface, in memory)."""

    def __init__(self) -> None:
        from failslow.agents.sdk import SdkStats

        self.collectives: list[dict[str, Any]] = []
        self.stats = SdkStats()

    def start(self) -> None: ...

    def register_rank(self, *a: Any, **k: Any) -> None: ...

    def register_comm(self, *a: Any, **k: Any) -> None: ...

    def record_step(self, **k: Any) -> None: ...

    def record_collective(self, **kw: Any) -> None:
        self.collectives.append(kw)


def scenarios(rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    dev = torch.device("cuda", rank)

    def c10d(_: Any, i: int) -> None:
        t = torch.ones(1 << 16, device=dev)
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        out = torch.empty(world * (1 << 10), device=dev)
        dist.all_gather_into_tensor(out, torch.ones(1 << 10, device=dev))
        dist.reduce_scatter_tensor(torch.empty(1 << 10, device=dev), out)
        dist.broadcast(t, src=0)

    def coalesced(_: Any, i: int) -> None:
        with dist._coalescing_manager(device=dev, async_ops=True) as cm:
            dist.all_reduce(torch.ones(8, device=dev))
            dist.all_reduce(torch.ones(16, device=dev))
        cm.wait()

    def functional(_: Any, i: int) -> None:
        y = funcol.all_reduce(torch.ones(64, device=dev), "sum", dist.group.WORLD)
        y = funcol.all_gather_tensor(y, 0, dist.group.WORLD)
        y.wait() if hasattr(y, "wait") else None

    def ddp_setup() -> Any:
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
        ).to(dev)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank], bucket_cap_mb=1)
        return ddp, torch.optim.SGD(ddp.parameters(), lr=0.01)

    def fsdp_setup() -> Any:
        from torch.distributed.fsdp import fully_shard

        model = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.Linear(512, 512), torch.nn.Linear(512, 256)
        ).to(dev)
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        return model, torch.optim.SGD(model.parameters(), lr=0.01)

    def train(state: Any, i: int) -> None:
        model, opt = state
        opt.zero_grad()
        model(torch.randn(32, 256, device=dev)).pow(2).sum().backward()
        opt.step()

    def compiled_setup() -> Any:
        def f(x: torch.Tensor) -> torch.Tensor:
            y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
            return funcol.all_gather_tensor(y + 1, 0, dist.group.WORLD) * 3

        return torch.compile(f, fullgraph=True)

    def compiled(fn: Any, i: int) -> None:
        out = fn(torch.ones(1024, device=dev) * i)
        out.wait() if hasattr(out, "wait") else None

    def batch_p2p(_: Any, i: int) -> None:
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        ops = [
            dist.P2POp(dist.isend, torch.ones(1024, device=dev), nxt),
            dist.P2POp(dist.irecv, torch.empty(1024, device=dev), prv),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    out: dict[str, Any] = {
        "c10d": (None, c10d),
        "coalesced": (None, coalesced),
        "functional": (None, functional),
        "ddp": (ddp_setup, train),
        "fsdp2": (fsdp_setup, train),
        "compiled": (compiled_setup, compiled),
    }
    if world >= 2:
        out["batch_p2p"] = (None, batch_p2p)
    return out


def fr_entries() -> int:
    import pickle

    import torch

    try:
        dump = pickle.loads(torch._C._distributed_c10d._dump_nccl_trace())
    except Exception:  # noqa: BLE001
        return -1
    return len(dump.get("entries", []))


def worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCH_FR_BUFFER_SIZE="20000",
        TORCH_NCCL_TRACE_BUFFER_SIZE="20000",
    )
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from failslow.agents.torch import Instrumentation

    torch.cuda.set_device(rank)
    capture = Capture()
    inst = Instrumentation(capture, inflight_after_s=None, poll_s=None).install()  # type: ignore[arg-type]
    dist.init_process_group(
        "nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank)
    )
    result: dict[str, Any] = {"rank": rank, "world": world, "gpu_timing": inst.gpu_timing}
    for name, (setup, step) in scenarios(rank, world).items():
        try:
            state = setup() if setup else None
            steps = []
            for i in range(3):
                torch.cuda.synchronize()
                dist.barrier()
                torch.cuda.synchronize()
                _settle(inst, capture)
                before, fr0 = len(capture.collectives), fr_entries()
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    step(state, i)
                    torch.cuda.synchronize()
                _settle(inst, capture)
                got = collections.Counter(str(c["op"]) for c in capture.collectives[before:])
                counted = collections.Counter(
                    PROFILER_TO_OP[e.name] for e in prof.events() if e.name in PROFILER_TO_OP
                )
                raw = collections.Counter(
                    e.name for e in prof.events() if e.name.startswith(("nccl:", "c10d::"))
                )
                steps.append(
                    {
                        "failslow": dict(got),
                        "profiler": dict(counted),
                        "flight_recorder": fr_entries() - fr0 if fr0 >= 0 else None,
                        "profiler_names": dict(raw),
                    }
                )
            result[name] = steps
        except Exception:  # noqa: BLE001 - report it, go on with the next path
            result[name] = {"error": traceback.format_exc()[-1500:]}
    result["timing"] = timing_check(inst, capture, rank)
    result["stats"] = inst.stats()
    inst.uninstall()
    Path(out).write_text(json.dumps(result, default=str))
    dist.destroy_process_group()


def _settle(inst: Any, capture: Capture, wait_s: float = 5.0) -> None:
    """Until every call seen so far has its record (events polled here)."""
    import torch

    torch.cuda.synchronize()
    deadline = time.monotonic() + wait_s
    while len(capture.collectives) < inst.interception.intercepted and time.monotonic() < deadline:
        inst.poll_events()
        time.sleep(0.01)


def timing_check(inst: Any, capture: Capture, rank: int) -> dict[str, Any]:
    """A 1 GiB all-gather (out of place: NCCL copies even with one rank) queued behind ~80 ms of
    matrix products: the record's duration against the NCCL kernel's GPU time, the host's
    launch time and the queue in front."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device("cuda", rank)
    world = dist.get_world_size()
    big = torch.ones(1 << 28, device=dev)  # 1 GiB of float32
    gathered = torch.empty(world * big.numel(), device=dev)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(gathered, big)  # warm
    torch.cuda.synchronize()
    _settle(inst, capture)
    rows = []
    for _ in range(3):
        before = len(capture.collectives)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            q0 = torch.cuda.Event(enable_timing=True)
            q1 = torch.cuda.Event(enable_timing=True)
            q0.record()
            for _ in range(60):
                a @ a  # noqa: B018 - queue GPU work in front of the collective
            q1.record()
            t0 = time.perf_counter_ns()
            dist.all_gather_into_tensor(gathered, big, async_op=True)
            launch_ns = time.perf_counter_ns() - t0
            torch.cuda.synchronize()
        _settle(inst, capture)
        rec = [c for c in capture.collectives[before:] if c["nbytes"] == big.numel() * 4]
        kernels = [
            e.device_time_total
            for e in prof.events()
            if "nccl" in e.name.lower() and getattr(e, "device_time_total", 0) > 0
        ]
        rows.append(
            {
                "record_duration_us": (rec[0]["end_ns"] - rec[0]["start_ns"]) / 1e3
                if rec
                else None,
                "nccl_kernel_us": max(kernels) if kernels else None,
                "host_launch_us": launch_ns / 1e3,
                "queued_in_front_us": q0.elapsed_time(q1) * 1e3,
            }
        )
    return {"rows": rows}


def check(results: list[dict[str, Any]]) -> list[str]:
    problems = []
    for res in results:
        for name, steps in res.items():
            if name in ("rank", "world", "gpu_timing", "timing", "stats"):
                continue
            if isinstance(steps, dict):
                problems.append(f"rank {res['rank']} {name}: {steps['error'][-300:]}")
                continue
            for i, s in enumerate(steps):
                if s["failslow"] != s["profiler"]:
                    problems.append(f"rank {res['rank']} {name} step {i}: {s}")
        for row in res["timing"]["rows"]:
            d, k = row["record_duration_us"], row["nccl_kernel_us"]
            if d is None or k is None or not (0.8 * k <= d <= 1.5 * k + 200):
                problems.append(f"rank {res['rank']} timing: {row}")
        if res["stats"]["errors"] or res["stats"]["event_errors"]:
            problems.append(f"rank {res['rank']} errors: {res['stats']}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as mp

    if not torch.cuda.is_available():
        print("no CUDA device here", file=sys.stderr)
        return 2
    world = min(args.ranks, torch.cuda.device_count())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    outs = [str(tmp / f"torch_gpu_{r}.json") for r in range(world)]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, world, port, outs[r])) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=900)
    results = [json.loads(Path(o).read_text()) for o in outs if Path(o).exists()]
    problems = check(results) if len(results) == world else ["a rank did not finish"]
    summary = {
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "gpu": torch.cuda.get_device_name(0),
        "world": world,
        "results": results,
        "problems": problems,
        "ok": not problems,
    }
    text = json.dumps(summary, indent=1, default=str)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
