"""One rank of the fault lab's training job: a real Megatron-style MLP on PyTorch gloo (CPU).

``world = tp x dp x pp`` ranks, Megatron's order (tensor-parallel fastest, pipeline slowest).
Each pipeline stage (``world / pp`` consecutive ranks) holds one block of the model; each
tensor-parallel group of ``tp`` consecutive ranks in it holds one copy of that block split the
Megatron way (column-parallel first layer, row-parallel second: one all-reduce in the forward
pass and one in the backward pass per step); data-parallel groups (ranks ``j, j + tp, ...`` of a
stage) average gradients with DDP. Between stages, rank ``r`` sends its activations to rank
``r + world / pp`` and receives their gradients back (``dist.send``/``dist.recv``, one
micro-batch per step). Every collective and p2p is timed by ``failslow.agents.torch`` (below
the Python API, DDP's gradient all-reduces included) and handed to the node agent's socket.

Progress goes to ``--progress`` (one JSON line per step: step, start_ns, end_ns, loss), which the
lab reads to date faults in steps. The job stops at the step written to ``--stop-file`` (the lab
writes a step far enough ahead that every rank sees it before reaching it), or after ``--steps``.

Run by ``failslow lab``; by hand: ``python -m agents.lab.train --help``.
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
    p = argparse.ArgumentParser(prog="python -m agents.lab.train")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel group size")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages")
    p.add_argument("--master", default="127.0.0.1:29500", help="rendezvous address:port (rank 0)")
    p.add_argument("--job", default="lab")
    p.add_argument("--socket", help="node agent socket (default: no telemetry)")
    p.add_argument("--spool", help="or: write telemetry files to this directory")
    p.add_argument("--progress", help="append one JSON line per step here")
    p.add_argument("--stop-file", help="a file holding the step to stop after")
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    p.add_argument(
        "--hidden", type=int, default=4096, help="MLP hidden size (total over tp and pp)"
    )
    p.add_argument("--model", type=int, default=256, help="model width")
    p.add_argument("--batch", type=int, default=512, help="samples per rank per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-instrument", action="store_true", help="train without failslow")
    p.add_argument(
        "--slow-file", help="while this file holds a factor F, compute F times slower (lab)"
    )
    return p.parse_args(argv)


class _CopyToTP(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


class ParallelMLP(nn.Module):
    """One block; ``group`` None: no tensor parallelism; ``head``: the last stage's."""

    def __init__(
        self, width: int, hidden: int, tp: int, group: Any, seed: int, head: bool = True
    ) -> None:
        super().__init__()
        if hidden % tp:
            raise ValueError("--hidden must be a multiple of --tp")
        g = torch.Generator().manual_seed(seed)  # the same full weights on every tp group
        full1 = torch.randn(width, hidden, generator=g) / width**0.5
        full2 = torch.randn(hidden, width, generator=g) / hidden**0.5
        shard = hidden // tp
        i = dist.get_rank(group) if group is not None else 0
        self.w1 = nn.Parameter(full1[:, i * shard : (i + 1) * shard].clone())
        self.w2 = nn.Parameter(full2[i * shard : (i + 1) * shard, :].clone())
        self.inp = nn.Linear(width, width)  # replicated: its gradient needs f's all-reduce
        self.head = nn.Linear(width, 1)
        with torch.no_grad():
            self.inp.weight.copy_(torch.randn(width, width, generator=g) / width**0.5)
            self.inp.bias.zero_()
            self.head.weight.copy_(torch.randn(1, width, generator=g) / width**0.5)
            self.head.bias.zero_()
        if not head:  # DDP refuses parameters without a gradient
            del self.head
        self.group = group
        self.has_head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x))
        if self.group is not None:
            x = _CopyToTP.apply(x, self.group)
        y = torch.nn.functional.gelu(x @ self.w1) @ self.w2
        if self.group is not None:
            y = _ReduceFromTP.apply(y, self.group)
        y = torch.tanh(y)
        return self.head(y).squeeze(-1) if self.has_head else y


def groups(world: int, tp: int, pp: int = 1) -> tuple[list[list[int]], list[list[int]]]:
    """Tensor-parallel groups (consecutive ranks) and data-parallel groups (stride ``tp``
    within a stage of ``world / pp`` consecutive ranks)."""
    if world % (tp * pp):
        raise ValueError("--world must be a multiple of --tp x --pp")
    stage = world // pp
    tps = [list(range(k * tp, (k + 1) * tp)) for k in range(world // tp)]
    dps = [list(range(s + j, s + stage, tp)) for s in range(0, world, stage) for j in range(tp)]
    return tps, dps


def join(rank: int, world: int, tp: int, master: str, pp: int = 1) -> tuple[Any, str, Any, str]:
    """Join the gloo job at ``master`` (``address:port`` of rank 0) and create its groups:
    ``(tensor-parallel group, its name, data-parallel group, its name)`` of this rank (no
    tensor-parallel group where ``tp`` is 1)."""
    addr, port = master.rsplit(":", 1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(minutes=10),  # a lab hang lasts until the lab resumes it
    )
    tps, dps = groups(world, tp, pp)
    my_tp = my_dp = None
    tp_name = dp_name = ""
    for k, ranks in enumerate(tps if tp > 1 else []):  # every rank creates every group, in order
        g = dist.new_group(ranks)
        if rank in ranks:
            my_tp, tp_name = g, f"tp{k}"
    for j, ranks in enumerate(dps):
        g = dist.new_group(ranks)
        if rank in ranks:
            my_dp, dp_name = g, f"dp{j}"
    return my_tp, tp_name, my_dp, dp_name


def _stop_at(path: str | None) -> int | None:
    if not path:
        return None
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None, *, exit_when_done: bool = False) -> int:
    """Train; 0. ``exit_when_done`` (the command line): end the process with ``os._exit``
    right after the process group is destroyed, before anything of torch's is freed. Freeing
    DDP, its reducer or the gloo groups can deadlock (a group's destructor joins its gloo worker
    threads while holding the GIL, and a worker with a Python object to release waits for the
    GIL): a rank that had finished every step and passed the final barrier never exited, about
    once in three full test runs in CI — first in the interpreter's teardown, then, with that
    skipped, while ``main()``'s own frame was freed (faulthandler: the main thread on
    ``code = main()``, a gloo thread with no Python frame)."""
    args = parse(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: where is it stuck?
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    my_tp, tp_name, my_dp, dp_name = join(args.rank, args.world, args.tp, args.master, args.pp)
    per_stage = args.world // args.pp
    stage = args.rank // per_stage

    inst = None
    if not args.no_instrument and (args.socket or args.spool):
        from failslow.agents.sdk import Recorder
        from failslow.agents.torch import Instrumentation

        recorder = Recorder(
            args.job, socket_path=args.socket, spool_dir=args.spool, flush_interval_s=0.5
        )
        inst = Instrumentation(recorder).install()
        if my_tp is not None:
            inst.register_group(tp_name, "tp", my_tp)

    model = ParallelMLP(
        args.model,
        args.hidden // args.pp,
        args.tp,
        my_tp,
        args.seed + stage,
        head=stage == args.pp - 1,
    )
    if inst is not None:  # DDP's gradient all-reduces are timed whatever group it is given
        inst.register_group(dp_name, "dp", my_dp)
    ddp = nn.parallel.DistributedDataParallel(model, process_group=my_dp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    replica = (args.rank % per_stage) // args.tp  # data-parallel index: the same batch in a
    # tp group and in every stage
    prev = args.rank - per_stage if stage > 0 else None
    nxt = args.rank + per_stage if stage < args.pp - 1 else None
    target_w = torch.randn(args.model, generator=torch.Generator().manual_seed(1234))
    progress = open(args.progress, "a", buffering=1) if args.progress else None  # noqa: SIM115
    slow = Slowdown(args.slow_file)

    step = 0
    finished = False
    try:
        while True:
            stop = _stop_at(args.stop_file)
            if (stop is not None and step >= stop) or (args.steps and step >= args.steps):
                break
            g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + replica)
            x = torch.randn(args.batch, args.model, generator=g)
            y = torch.tanh(x @ target_w / args.model**0.5)
            start = time.time_ns()
            if inst is not None:
                with inst.step(step):
                    loss = _train_step(ddp, opt, x, y, prev, nxt, slow)
            else:
                loss = _train_step(ddp, opt, x, y, prev, nxt, slow)
            end = time.time_ns()
            if progress is not None:
                progress.write(
                    json.dumps({"step": step, "start_ns": start, "end_ns": end, "loss": loss})
                    + "\n"
                )
            step += 1
        finished = True
    finally:
        if progress is not None:
            progress.close()
        if inst is not None:
            inst.uninstall()
            inst.recorder.flush(timeout_s=10)
            inst.recorder.close()
        if finished:  # no rank tears down while a peer's last send or all-reduce is in flight
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
        dist.destroy_process_group()
    if exit_when_done:  # everything of ours is flushed and closed; nothing of torch's is freed
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _train_step(
    ddp: nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    prev: int | None = None,
    nxt: int | None = None,
    slow: Slowdown | None = None,
) -> float:
    """One step of this rank's stage: receive activations from ``prev`` (the stage before),
    send them on to ``nxt`` and receive their gradients back; the last stage has the loss.
    ``slow``: a known compute slowdown (:mod:`failslow.harness.lab.slowdown`)."""
    opt.zero_grad(set_to_none=True)
    if prev is not None:
        x = torch.empty_like(x)
        dist.recv(x, src=prev)
        x.requires_grad_()
    if slow is not None:
        slow.begin_step()
    out = ddp(x)
    if slow is not None:
        slow.backward_begins(out)
    loss = 0.0
    if nxt is not None:
        dist.send(out.detach().contiguous(), dst=nxt)
        grad = torch.empty_like(out)
        dist.recv(grad, src=nxt)
        out.backward(grad)
    else:
        mse = torch.nn.functional.mse_loss(out, y)
        mse.backward()
        loss = float(mse.item())
    if prev is not None:
        assert x.grad is not None
        dist.send(x.grad.contiguous(), dst=prev)
    opt.step()
    if slow is not None:
        slow.end_step()
    return loss


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(exit_when_done=True))  # returns only by raising
