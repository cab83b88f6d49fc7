"""The concurrent pairs and single faults on a layout the suite does not use: tp2 pp4 dp4, 4 GPUs
a host (32 ranks, 8 hosts; stage s on node-(2s) and node-(2s+1)), through a real service.

    .venv/bin/python -m bench.eval.layouts [--seeds N] [--plain] [--only a,b]

The suite's concurrent cases (``bench/eval/concurrent.py``) run on tp4 pp2 dp8 with 8 GPUs a
host; here a deeper pipeline with a longer bubble and fewer ranks per host: whether placement
holds on a shape it was not built on, and what the delays are. ``--plain``: envelopes that vouch
for nothing, flushed every 0.5 s (``failslow eval --plain-envelopes --batch-s 0.5``). Prints a
line per case and exits 1 where a fault was missed, misplaced or anything false was reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

from bench.eval.runner import Service, run_case
from bench.eval.suite import NOISE, Case
from failslow.harness.simulator import Fault, Layout, Scenario

LAYOUT = Layout(tp=2, pp=4, dp=4, gpus_per_host=4)
FIRST_AT, SECOND_AT = 60, 100
FIRST = {
    "gpu": Fault("slow_gpu", FIRST_AT, factor=1.5, ranks=(5,)),  # node-001, stage 0
    "node": Fault("slow_node", FIRST_AT, factor=1.5, hosts=("node-002",)),
    "nic": Fault("slow_nic", FIRST_AT, factor=3.0, hosts=("node-003",)),
    "pair": Fault("slow_link", FIRST_AT, factor=3.0, hosts=("node-000", "node-002")),
}
SECOND = {
    "gpu": Fault("slow_gpu", SECOND_AT, factor=1.5, ranks=(22,)),  # node-005, stage 2
    "node": Fault("slow_node", SECOND_AT, factor=1.5, hosts=("node-006",)),
    "nic": Fault("slow_nic", SECOND_AT, factor=3.0, hosts=("node-004",)),
    "pair": Fault("slow_link", SECOND_AT, factor=3.0, hosts=("node-005", "node-007")),
    "hang": Fault("hang", SECOND_AT, ranks=(27,)),  # node-006, the last stage
}
# alone: a slow cable between stages 2 and 3, and a rank stopped in each stage
SINGLE = {"pair": SECOND["pair"]} | {
    f"hang-stage{r // 8}": Fault("hang", SECOND_AT, ranks=(r,)) for r in (3, 11, 19, 27)
}


def cases(seeds: int, plain: bool) -> list[Case]:
    out = []

    def add(name: str, family: str, faults: tuple[Fault, ...], seed: int) -> None:
        hang = faults[-1].kind == "hang"
        steps = SECOND_AT + 30 if hang else 160
        sc = Scenario(job=f"{name}-32r-s{seed}", layout=LAYOUT, faults=faults, noise=NOISE,
                      steps=steps, seed=seed, hang_tail_s=20.0)  # fmt: skip
        if plain:
            sc = dataclasses.replace(sc, vouch=False, batch_s=0.5)
        out.append(Case(sc.job, family, sc, faults[-1].factor))

    for seed in range(seeds):
        for a, first in FIRST.items():
            for b, second in SECOND.items():
                add(
                    f"concurrent-{a}-then-{b}", f"pattern:concurrent:{a}+{b}", (first, second), seed
                )
        for name, fault in SINGLE.items():
            add(name, fault.kind, (fault,), seed)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--plain", action="store_true", help="envelopes that vouch for nothing")
    ap.add_argument("--only", help="cases whose name contains this (a,b: either)")
    args = ap.parse_args(argv)
    todo = [c for c in cases(args.seeds, args.plain)
            if not args.only or any(o in c.name for o in args.only.split(","))]  # fmt: skip
    svc = Service(None, Path(tempfile.mkdtemp(prefix="failslow-layouts-")))
    bad = 0
    try:
        for n, case in enumerate(todo, 1):
            s, _, _ = run_case(svc, case)
            ok = s.detected and s.localized and s.false_incidents == 0
            bad += not ok
            mark = "" if ok else "  <-- wrong"
            print(f"[{n:2d}/{len(todo)}] {case.name:36s} found={s.detected!s:5s} "
                  f"placed={s.localized!s:5s} delay={s.delay_steps} steps "
                  f"false={s.false_incidents}{mark}", flush=True)  # fmt: skip
    finally:
        svc.close()
    print(f"{len(todo) - bad} of {len(todo)} right")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
