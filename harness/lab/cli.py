"""``failslow lab``'s command line: arguments, checks of the machine, the run, the JSON."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from failslow.harness.lab import run as lab_run
from failslow.harness.lab.report import FAULTS, LabFault
from failslow.harness.lab.run import Lab
from failslow.harness.lab.system import LabError, preflight


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "lab",
        help="real faults in a real PyTorch job on this machine (root, netns, cgroup v1)",
        description=lab_run.__doc__.split("\n\n")[0] if lab_run.__doc__ else None,
    )
    p.add_argument("--ranks", type=int, default=4, help="ranks, one namespace each (default 4)")
    p.add_argument(
        "--model",
        choices=["mlp", "titan"],
        default="mlp",
        help="mlp: Megatron-style MLP, DDP, explicit instrumentation (harness/lab/train.py); "
        "titan: FSDP2 x TP (DTensor) x PP (pipelining) on a DeviceMesh, instrumented the "
        "failslow run way (harness/lab/titan.py; needs --tp and --pp, default 2 and 2)",
    )
    p.add_argument("--tp", type=int, help="tensor-parallel group size (default 2; 1 with --pp > 1)")
    p.add_argument(
        "--pp",
        type=int,
        default=1,
        help="pipeline stages (default 1); --pp 2: 2 stages x 2 data-parallel ranks",
    )
    p.add_argument(
        "--fault",
        default="all",
        help="compute, link, hang, slow, none, all (compute, link, hang), or a "
        "comma-separated list (default all)",
    )
    p.add_argument("--target", type=int, default=1, help="the rank to fault (default 1)")
    p.add_argument("--json", dest="json_out", help="write the results here")
    p.add_argument("--service", help="use this service (reachable from the namespaces)")
    p.add_argument("--token", help="bearer token for --service (ingest and read)")
    p.add_argument("--port", type=int, default=8077, help="port of the service started here")
    p.add_argument("--job", default="lab")
    p.add_argument("--batch", type=int, default=1536, help="samples per rank per step")
    p.add_argument(
        "--cpu-quota",
        type=float,
        default=0.25,
        help="compute fault: the fraction of its healthy CPU the rank keeps (default 0.25; "
        "healthy = one CPU, or CPUs/ranks where ranks outnumber CPUs)",
    )
    p.add_argument("--link-rate", default="100mbit", help="link fault: tbf rate")
    p.add_argument(
        "--slow-factor",
        type=float,
        default=1.8,
        help="slow fault: the rank's compute takes this many times as long (default 1.8)",
    )
    p.add_argument("--warmup", type=int, default=60, help="healthy steps before the first fault")
    p.add_argument("--healthy-steps", type=int, default=300, help="steps of --fault none")
    p.add_argument("--settle-steps", type=int, default=30, help="steps between faults")
    p.add_argument(
        "--hold-steps", type=int, default=20, help="steps a fault lasts after it was found"
    )
    p.add_argument("--detect-timeout", type=float, default=60.0, help="seconds to find a fault")
    p.add_argument("--resolve-timeout", type=float, default=60.0, help="seconds to resolve it")
    p.add_argument("--max-delay-steps", type=float, default=10, help="pass mark (default 10)")
    p.add_argument("--prefix", default="fsl", help="name prefix of namespaces, links, cgroups")
    p.add_argument("--net", type=int, default=77, help="use 10.NET.0.0/24")
    p.add_argument("--workdir", help="logs, database, progress (default: a new temp dir)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    missing = preflight()
    if missing:
        print(
            "failslow lab needs: " + "; ".join(missing) + ". It creates network namespaces, "
            "veth pairs, a bridge, tc qdiscs and cgroups, so run it as root on Linux with "
            "iproute2 and the cgroup v1 cpu controller mounted.",
            file=sys.stderr,
        )
        return 2
    faults = list(FAULTS) if args.fault == "all" else args.fault.split(",")
    bad = [f for f in faults if f not in (*LabFault, "none")]
    if bad or ("none" in faults and len(faults) > 1):
        print(f"failslow lab: unknown --fault {args.fault!r}", file=sys.stderr)
        return 2
    if args.model == "titan" and args.pp == 1 and args.tp is None:
        args.pp, args.tp = 2, 2
    if args.tp is None:
        args.tp = 2 if args.pp == 1 else 1
    if (
        not 2 <= args.ranks <= 64
        or args.tp < 1
        or args.pp < 1
        or args.ranks % (args.tp * args.pp)
        or not 0 <= args.target < args.ranks
    ):
        print(
            "failslow lab: 2..64 ranks, a multiple of --tp x --pp, --target < --ranks",
            file=sys.stderr,
        )
        return 2
    args.faults = faults
    try:
        lab = Lab(args)
    except LabError as exc:
        print(f"failslow lab: {exc}", file=sys.stderr)
        return 2

    def _term(*_: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _term)
    try:
        out = lab.run()
    except LabError as exc:
        print(f"failslow lab: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("failslow lab: interrupted; cleaning up", file=sys.stderr)
        return 130
    finally:
        lab.close()
        signal.signal(signal.SIGTERM, previous)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")
    return 0 if out["ok"] else 1
