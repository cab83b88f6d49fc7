"""Harness commands of the ``failslow`` CLI: simulate, replay, demo, lab. Imports are lazy."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def cmd_simulate(args: argparse.Namespace) -> int:
    from failslow.agents.wire import encode_envelope
    from failslow.harness.simulator.layout import Layout
    from failslow.harness.simulator.scenario import Scenario, parse_fault

    layout = Layout(tp=args.tp, pp=args.pp, dp=args.dp, gpus_per_host=args.gpus_per_host)
    faults = tuple(parse_fault(f) for f in args.fault)
    scenario = Scenario(
        job=args.job, layout=layout, steps=args.steps, faults=faults, seed=args.seed
    )
    sim = scenario.simulation()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    n_env = n_rec = 0
    started = time.monotonic()
    with open(out, "wb") as fh:
        for env in scenario.envelopes(sim):
            fh.write(encode_envelope(env, compress=False) + b"\n")
            n_env += 1
            n_rec += len(env["collectives"]) + len(env["steps"])
            if not args.quiet and n_env % 200 == 0:
                print(
                    f"\r  simulated {sim.now:7.1f}s, {n_rec} records",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
    labels = scenario.labels(sim)
    labels_path = Path(args.labels or str(out) + ".labels.json")
    labels_path.write_text(json.dumps(labels, indent=2))
    if not args.quiet:
        print(
            f"\rwrote {n_env} envelopes / {n_rec} records ({layout.world} ranks, "
            f"{args.steps} steps) to {out} in {time.monotonic() - started:.1f}s; "
            f"labels in {labels_path}",
            file=sys.stderr,
        )
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from failslow.harness.replay import replay

    speed = None if args.speed == "max" else float(args.speed)
    summary = replay(
        Path(args.file),
        service=args.service,
        speed=speed,
        token=args.token or os.environ.get("FAILSLOW_TOKEN"),
        flush=not args.no_flush,
        progress=not args.quiet,
    )
    print(json.dumps(summary, indent=2))
    return 0 if summary["refused_envelopes"] == 0 else 1


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from failslow.harness.demo import register as register_demo
    from failslow.harness.lab.cli import register as register_lab
    from failslow.harness.load.e2e import register as register_e2e

    register_demo(sub)
    register_lab(sub)
    bench = sub.add_parser("bench", help="benchmarks that need no source checkout")
    register_e2e(bench.add_subparsers(dest="bench", required=True))
    p = sub.add_parser(
        "simulate", help="simulate a TP x PP x DP job; write v1 envelopes (JSONL) + labels"
    )
    p.add_argument("--job", default="sim-job")
    p.add_argument("--tp", type=int, default=4)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--dp", type=int, default=8)
    p.add_argument("--gpus-per-host", type=int, default=8)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        help="kind:key=value,... e.g. slow_gpu:rank=5,start=100,factor=1.5 (repeatable); kinds: "
        "slow_gpu slow_node slow_nic slow_link hang dead_host job_slowdown; keys: rank host "
        "start end factor period (host=a+b for slow_link)",
    )
    p.add_argument("--out", required=True, help="output JSONL file")
    p.add_argument("--labels", help="labels JSON (default OUT.labels.json)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("replay", help="send a JSONL file of envelopes to a service")
    p.add_argument("file")
    p.add_argument("--service", required=True)
    p.add_argument("--speed", default="max", help="'max' or a factor of real time (1 = real time)")
    p.add_argument("--token")
    p.add_argument("--no-flush", action="store_true", help="do not flush the jobs at the end")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_replay)
