"""A toy data-parallel "training" job instrumented with the failslow SDK.

Each rank is a process. A step is some compute (sleep) followed by a gradient "allreduce" that
is a real barrier across the ranks, so a slow rank really makes the others wait, and failslow
sees it in the durations alone. Run a service and an agent first:

    failslow serve &
    failslow agent --service http://127.0.0.1:8000 --job toy --host $(hostname) &
    python examples/train_with_sdk.py --job toy --ranks 4 --steps 300 --slow-rank 2 --slow-from 100

then watch ``curl localhost:8000/v1/jobs/toy/incidents``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import time

from failslow.agents import Recorder


def rank_main(rank: int, args: argparse.Namespace, barrier: mp.synchronize.Barrier) -> None:
    rec = Recorder(args.job, socket_path=args.socket)
    rec.register_rank(rank, gpu=rank, world_size=args.ranks)
    rec.register_comm("dp-all", "dp", list(range(args.ranks)))
    rng = random.Random(rank)
    for step in range(args.steps):
        with rec.step(rank=rank, step=step):
            compute = args.compute_s * rng.lognormvariate(0, 0.03)
            if rank == args.slow_rank and step >= args.slow_from:
                compute *= args.factor
            time.sleep(compute)  # forward + backward
            with rec.collective(rank=rank, comm="dp-all", seq=step, op="allreduce", nbytes=1 << 26):
                barrier.wait()  # the allreduce completes when the last rank arrives
                time.sleep(0.002)  # ... plus the transfer
    rec.close()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--job", default="toy")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--compute-s", type=float, default=0.05)
    ap.add_argument("--slow-rank", type=int, default=-1, help="rank to slow down (-1: none)")
    ap.add_argument("--slow-from", type=int, default=100, help="step at which it becomes slow")
    ap.add_argument("--factor", type=float, default=1.5)
    ap.add_argument("--socket", help="agent socket (default: the agent's default for --job)")
    args = ap.parse_args()
    barrier = mp.Barrier(args.ranks)
    procs = [mp.Process(target=rank_main, args=(r, args, barrier)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()


if __name__ == "__main__":
    main()
