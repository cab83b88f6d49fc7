"""One rank of the lab's torchtitan-shaped job: FSDP2 x tensor parallelism (DTensor) x
pipeline parallelism (``torch.distributed.pipelining``) on gloo (CPU).

The ranks form a ``DeviceMesh`` of shape ``(pp, dp, tp)`` named ``("pp", "dp", "tp")``, as
torchtitan builds its own. The model is a stack of MLP blocks cut into ``pp`` stages; each
stage's blocks are split the Megatron way over ``tp`` ranks (``ColwiseParallel`` then
``RowwiseParallel``: DTensor's all-reduces in the forward and backward passes), sharded with
FSDP2 over ``dp`` ranks (``fully_shard``: all-gathers of parameters, reduce-scatters of
gradients), and run by a ``ScheduleGPipe`` over ``--microbatches`` micro-batches (send/recv of
activations and gradients between stages). Every rank steps an optimizer once per step.

There is no failslow code here: the lab runs it under ``failslow run``'s environment, so every
communication is timed below the Python API, its groups are named from the mesh's dimension
names and its steps from ``optimizer.step()``. What the lab needs besides is a progress line per
step (``--progress``), a stop step (``--stop-file``) and a compute slowdown of a known factor
(``--slow-file``, :mod:`failslow.harness.lab.slowdown`).

    python -m failslow.harness.lab.titan --rank R --world 8 --pp 2 --tp 2 --master ADDR:PORT
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from failslow.harness.lab.slowdown import Slowdown


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m failslow.harness.lab.titan")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--pp", type=int, default=2, help="pipeline stages")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel degree")
    p.add_argument("--master", default="127.0.0.1:29500", help="rendezvous address:port")
    p.add_argument("--width", type=int, default=256, help="model width")
    p.add_argument("--hidden", type=int, default=1024, help="MLP hidden size (over tp)")
    p.add_argument("--blocks", type=int, default=2, help="MLP blocks per stage")
    p.add_argument("--batch", type=int, default=256, help="samples per data-parallel rank")
    p.add_argument("--microbatches", type=int, default=2)
    p.add_argument("--progress", help="append one JSON line per step here")
    p.add_argument("--stop-file", help="a file holding the step to stop after")
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: never)")
    p.add_argument("--slow-file", help="while this file holds F, compute F times slower")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


class Block(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Stage(nn.Module):
    def __init__(self, width: int, hidden: int, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, hidden) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def build(args: argparse.Namespace) -> tuple[Any, Any, nn.Module, Any]:
    """The mesh, this rank's pipeline schedule, its stage module and its optimizer."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    dp = args.world // (args.pp * args.tp)
    mesh = init_device_mesh("cpu", (args.pp, dp, args.tp), mesh_dim_names=("pp", "dp", "tp"))
    stage_index = mesh.get_local_rank("pp")
    torch.manual_seed(args.seed + stage_index)  # the same weights in a stage's replicas
    module = Stage(args.width, args.hidden, args.blocks)
    for block in module.blocks:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(module, mesh=mesh["dp"])
    stage = PipelineStage(
        module, stage_index, args.pp, torch.device("cpu"), group=mesh["pp"].get_group()
    )

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (out - target).pow(2).mean()

    schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.SGD(module.parameters(), lr=1e-3)
    return mesh, schedule, module, opt


def _stop_at(path: str | None) -> int | None:
    if not path:
        return None
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    addr, port = args.master.rsplit(":", 1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{port}",
        rank=args.rank,
        world_size=args.world,
        timeout=datetime.timedelta(minutes=10),  # a lab hang lasts until the lab resumes it
    )
    mesh, schedule, module, opt = build(args)
    first = mesh.get_local_rank("pp") == 0
    last = mesh.get_local_rank("pp") == args.pp - 1
    replica = mesh.get_local_rank("dp")
    slow = Slowdown(args.slow_file)
    progress = open(args.progress, "a", buffering=1) if args.progress else None  # noqa: SIM115
    target_w = torch.randn(args.width, args.width, generator=torch.Generator().manual_seed(7))
    step = 0
    try:
        while True:
            stop = _stop_at(args.stop_file)
            if (stop is not None and step >= stop) or (args.steps and step >= args.steps):
                break
            g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + replica)
            x = torch.randn(args.batch, args.width, generator=g)
            start = time.time_ns()
            opt.zero_grad(set_to_none=True)
            slow.begin_step(share=1.0)  # the schedule runs forward and backward inside
            if first:
                schedule.step(x)
            elif last:
                schedule.step(target=torch.tanh(x @ target_w / args.width**0.5))
            else:
                schedule.step()
            opt.step()
            slow.end_step()
            end = time.time_ns()
            if progress is not None:
                progress.write(json.dumps({"step": step, "start_ns": start, "end_ns": end}) + "\n")
            step += 1
    finally:
        if progress is not None:
            progress.close()
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    import atexit

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    code = main()
    atexit._run_exitfuncs()  # what was registered to run at exit (a telemetry flush) runs ...
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # ... but nothing of torch's is freed at exit (see train.py's main)
