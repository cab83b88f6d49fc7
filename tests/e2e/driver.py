"""A stand-in training job for e2e tests: 8 ranks on 2 hosts, real time, via the SDK.

Usage: python driver.py SOCK_DIR JOB SECONDS OUT_JSON
"""

from __future__ import annotations

import json
import random
import sys
import time

from failslow.agents.sdk import Recorder


def main() -> None:
    sock_dir, job, seconds, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    recs = {
        h: Recorder(job, socket_path=f"{sock_dir}/h{h}.sock", flush_interval_s=0.02) for h in (0, 1)
    }
    for h, rec in recs.items():
        for r in range(4 * h, 4 * h + 4):
            rec.register_rank(r, gpu=r % 4, world_size=8)
        rec.register_comm("world", "dp", list(range(8)))
    rng = random.Random(0)
    total = 0
    per_host = {"h0": 0, "h1": 0}
    step = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        t0 = time.time_ns()
        time.sleep(0.02)
        arrive = [time.time_ns() + int(rng.uniform(0, 2e6)) for _ in range(8)]
        end = max(arrive) + 1_000_000
        for r in range(8):
            rec = recs[r // 4]
            rec.record_collective(
                rank=r,
                comm="world",
                seq=step,
                op="allreduce",
                nbytes=1024,
                start_ns=arrive[r],
                end_ns=end,
            )
            rec.record_step(rank=r, step=step, start_ns=t0, end_ns=end)
            total += 2
            per_host[f"h{r // 4}"] += 2
        step += 1
    ok = all(rec.flush(timeout_s=30) for rec in recs.values())
    for rec in recs.values():
        rec.close()
    with open(out, "w") as fh:
        json.dump(
            {
                "records": total,
                "per_host": per_host,
                "steps": step,
                "flushed": ok,
                "dropped": sum(r.stats.dropped for r in recs.values()),
            },
            fh,
        )


if __name__ == "__main__":
    main()
