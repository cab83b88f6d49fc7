"""A toy data-parallel job that reports to failslow *and follows its plan* (closed loop).

Each rank is a process working through its share of the global batch: ``shares[rank]``
micro-batches per step (equal at first), then a gradient "allreduce" that is a real barrier, so a
slow rank makes everybody wait. Rank 0 polls the plan with ``PlanClient`` (a conditional GET, 304
while nothing changes) and hands a new version to every rank two steps ahead, so all ranks switch
at the same step boundary, the way a real job would broadcast it from rank 0. When failslow
rebalances, the slow rank gets fewer micro-batches and the step time comes back down.

    failslow serve &
    failslow agent --service http://127.0.0.1:8000 --job toy --host $(hostname) &
    python examples/train_with_plan.py --service http://127.0.0.1:8000 --job toy \\
        --ranks 4 --steps 400 --slow-rank 2 --slow-from 100

then watch ``curl localhost:8000/v1/jobs/toy/actions`` and ``.../plan``. The step times this
prints (one line every 20 steps) show the recovery.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import statistics
import time

from failslow.agents import Recorder
from failslow.agents.plan import PlanClient

LEAD = 2  # steps between rank 0 seeing a plan and every rank applying it


def rank_main(
    rank: int,
    args: argparse.Namespace,
    barrier: mp.synchronize.Barrier,
    shares: mp.sharedctypes.SynchronizedArray,  # type: ignore[type-arg]
    switch_at: mp.sharedctypes.Synchronized,  # type: ignore[type-arg]
    pending: mp.sharedctypes.SynchronizedArray,  # type: ignore[type-arg]
) -> None:
    rec = Recorder(args.job, socket_path=args.socket)
    rec.register_rank(rank, gpu=rank, world_size=args.ranks)
    rec.register_comm("dp-all", "dp", list(range(args.ranks)))
    plans = (
        PlanClient(args.service, args.job, global_batch=args.ranks * args.microbatches)
        if rank == 0
        else None
    )
    rng = random.Random(rank)
    mine = args.microbatches
    times: list[float] = []
    for step in range(args.steps):
        # -- step boundary: apply a plan that is due, and (rank 0) look for a new one --------
        if step == switch_at.value:
            mine = pending[rank]
        if plans is not None and step % args.poll_every == 0:
            plan = plans.poll()
            if plan is not None and plan.microbatch_shares is not None:
                for r in range(args.ranks):
                    pending[r] = plan.microbatches(r, default=args.microbatches)
                switch_at.value = step + LEAD
                plans.ack(plan, step + LEAD)  # detectors judge each rank by its share from then
                print(f"step {step}: plan v{plan.version} shares {list(pending)}", flush=True)
        started = time.monotonic()
        with rec.step(rank=rank, step=step):
            for _ in range(mine):  # forward + backward of one micro-batch
                t = args.compute_s * rng.lognormvariate(0, 0.03)
                if rank == args.slow_rank and step >= args.slow_from:
                    t *= args.factor
                time.sleep(t)
            with rec.collective(rank=rank, comm="dp-all", seq=step, op="allreduce", nbytes=1 << 26):
                barrier.wait()
                time.sleep(0.002)
        times.append(time.monotonic() - started)
        if rank == 0 and step % 20 == 19:
            print(f"step {step + 1}: step time {statistics.median(times[-20:]):.3f} s", flush=True)
    shares[rank] = mine
    rec.close()
    if plans is not None:
        plans.close()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--service", default="http://127.0.0.1:8000")
    ap.add_argument("--job", default="toy")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--microbatches", type=int, default=4, help="per rank, before any plan")
    ap.add_argument("--compute-s", type=float, default=0.01, help="per micro-batch")
    ap.add_argument("--slow-rank", type=int, default=-1, help="rank to slow down (-1: none)")
    ap.add_argument("--slow-from", type=int, default=100, help="step at which it becomes slow")
    ap.add_argument("--factor", type=float, default=1.5)
    ap.add_argument("--poll-every", type=int, default=5, help="steps between plan polls")
    ap.add_argument("--socket", help="agent socket (default: the agent's default for --job)")
    args = ap.parse_args()
    barrier = mp.Barrier(args.ranks)
    shares = mp.Array("i", [args.microbatches] * args.ranks)
    pending = mp.Array("i", [args.microbatches] * args.ranks)
    switch_at = mp.Value("i", -1)
    procs = [
        mp.Process(target=rank_main, args=(r, args, barrier, shares, switch_at, pending))
        for r in range(args.ranks)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    print("final shares:", list(shares))


if __name__ == "__main__":
    main()
