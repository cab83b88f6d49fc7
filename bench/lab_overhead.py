"""Step-time cost of agents.torch on the fault lab's training job (4 gloo ranks on loopback,
tensor-parallel pairs x DDP, ~8 instrumented collectives per rank per step).

``--ranks 2 --tp 1`` keeps one rank per core. Runs the job alternately without and with the
instrumentation (``--pairs`` times each, ``--steps`` steps, the first 5 dropped), and reports
the median step time of each and the difference. Issue 5's target: < 1% of step time. On a
2-core machine running 4 ranks, the step time of consecutive identical runs varies by a few
percent, so the spread of the plain runs is reported next to the difference: a difference inside
it is not a measured cost.

    python bench/lab_overhead.py [--pairs 3] [--steps 40] [--json bench/results/lab_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(
    steps: int, instrument: bool, work: Path, tag: str, ranks: int = 4, tp: int = 2
) -> list[float]:
    port = _port()
    procs = []
    for r in range(ranks):
        argv = [
            sys.executable, "-m", "agents.lab.train", "--rank", str(r), "--world", str(ranks),
            "--tp", str(tp), "--master", f"127.0.0.1:{port}", "--steps", str(steps),
            "--progress", str(work / f"{tag}-{r}.jsonl"),
        ]  # fmt: skip
        argv += ["--spool", str(work / f"spool-{tag}")] if instrument else ["--no-instrument"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(argv, env=env))
    for p in procs:
        if p.wait(timeout=600) != 0:
            raise SystemExit(f"rank exited with {p.returncode}")
    lines = (work / f"{tag}-0.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines][5:]
    return [(r["end_ns"] - r["start_ns"]) / 1e9 for r in rows]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--ranks", type=int, default=4, help="4 on 2 cores oversubscribes them")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    plain: list[float] = []
    timed: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        for i in range(args.pairs):
            plain.append(
                statistics.median(run(args.steps, False, work, f"p{i}", args.ranks, args.tp))
            )
            timed.append(
                statistics.median(run(args.steps, True, work, f"t{i}", args.ranks, args.tp))
            )
            print(f"pair {i}: plain {plain[-1] * 1e3:.1f} ms, timed {timed[-1] * 1e3:.1f} ms")
    p, t = statistics.median(plain), statistics.median(timed)
    out = {
        "ranks": args.ranks,
        "tp": args.tp,
        "paired_diff_pct": [round(100 * (t - p) / p, 2) for p, t in zip(plain, timed, strict=True)],
        "steps_per_run": args.steps,
        "pairs": args.pairs,
        "plain_step_s": plain,
        "instrumented_step_s": timed,
        "median_plain_s": p,
        "median_instrumented_s": t,
        "overhead_pct": round(100 * (t - p) / p, 2),
        "plain_spread_pct": round(100 * (max(plain) - min(plain)) / p, 2),
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
