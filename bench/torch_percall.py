"""CPU added per ``torch.distributed`` call by agents.torch, without a second rank's noise.

One gloo rank (a real process group of size 1, so the call itself is short and steady), the same
``dist.all_reduce`` of 16 floats 3,000 times plain and 3,000 times through failslow's
dispatcher kernel, alternated 9 times; the CPU time of the calling thread per call, minimum over
the 9 rounds of each (the minimum is the run least disturbed by the machine). Issue 5's target:
< 20 µs per collective on CPU.
``bench/torch_overhead.py`` measures the same on 2 ranks, where each call waits for the peer and
the machine's noise is larger.

    python bench/torch_percall.py [--rounds 9] [--calls 3000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--json")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    from bench.torch_overhead import per_call
    from failslow.agents.sdk import Recorder
    from failslow.agents.torch import Instrumentation

    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    with tempfile.TemporaryDirectory() as d:
        rec = Recorder("percall", spool_dir=d)
        inst = Instrumentation(rec)
        plain, wrapped = [], []
        for _ in range(args.rounds):
            plain.append(per_call(None, args.calls))
            inst.install()
            wrapped.append(per_call(inst, args.calls))
            inst.uninstall()
        rec.close()
    dist.destroy_process_group()
    out = {
        "calls_per_round": args.calls,
        "rounds": args.rounds,
        "plain_us_per_call_min": round(min(plain), 2),
        "instrumented_us_per_call_min": round(min(wrapped), 2),
        "added_us_per_call": round(min(wrapped) - min(plain), 2),
        "target_us": 20.0,
        "records": inst.recorded,
    }
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
