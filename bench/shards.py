"""One job's core (checks, join, frames) in 1 process and split over shard processes: the same
pre-encoded v2 envelopes of a ``--ranks`` job applied as fast as the core takes them, with a
detection pass's part (join, close frames, expire) four times per step as a service runs them.

    python bench/shards.py --ranks 10240 --steps 12 --shards 0 1 2

For each shard count, in a fresh process: wall seconds, records per second, the owner's and
the shards' CPU seconds, and the speed-up over one process (``--shards 0``). The frames closed
are checked to be the same in number for every shard count. The first step is a warm-up (numba
loads its kernels in every process), not timed. No HTTP, gzip, commits or detection
(``failslow bench e2e`` has those): this is the part of a job that sharding splits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

T0 = 1_780_000_000_000_000_000


def one(ranks: int, steps: int, shards: int, batch: int, passes: int) -> dict[str, object]:
    from failslow.cli import keep_freed_memory  # noqa: PLC0415
    from failslow.harness.load.fleet import proc_cpu_s  # noqa: PLC0415
    from failslow.harness.load.job import HostTemplate, JobLayout, host_name  # noqa: PLC0415
    from failslow.service.settings import Settings  # noqa: PLC0415
    from failslow.service.stream import columnar, v2apply  # noqa: PLC0415
    from failslow.service.stream.settings import StateSettings  # noqa: PLC0415
    from failslow.service.stream.state import JobState  # noqa: PLC0415
    from failslow.wire import topology, v2  # noqa: PLC0415

    keep_freed_memory(Settings().allocator_keep_mib)
    job = JobLayout(ranks, 1_000_000_000, slow=ranks // 3, fault_step=steps // 2)
    hosts = [HostTemplate(job, h) for h in range(job.hosts)]
    state = JobState("j", StateSettings(shards=shards, shard_min_ranks=1))
    for h, tmpl in enumerate(hosts):
        state.topology.touch_host(host_name(h), 0, 0.0)
        reg = tmpl.registration
        columnar.register_topology(state, host_name(h), reg["ranks"], reg["comms"])
    digests = [topology.digest(h.registration["ranks"], h.registration["comms"]) for h in hosts]
    bodies = []
    for step in range(steps):
        row = []
        for h, tmpl in enumerate(hosts):
            header = {"job": "j", "host": host_name(h), "sent_ns": T0 + (step + 1) * job.step_ns,
                      "agent": "a", "batch_seq": step, "topology": digests[h]}  # fmt: skip
            body = tmpl.body(step, T0, header)
            row.append((*v2.decode_header(body), body))
        bodies.append(row)
    state.scale_limits()  # starts the shards (their start-up is not timed)
    warm = bodies.pop(0)  # the first step is a warm-up (numba compiles in every process)
    v2apply.apply_v2_many(state, [(hd, bd, lay) for hd, lay, bd in warm])
    closed = len(state.close_frames())  # (a sharded job's frames come one pass later)
    steps -= 1
    every = max(1, len(hosts) // passes)
    shard_pids = [p.pid for p in state.shards.procs] if state.shards is not None else []
    shard_cpu0 = sum(proc_cpu_s(p) for p in shard_pids)  # type: ignore[arg-type]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for row in bodies:
        for lo in range(0, len(row), batch):
            v2apply.apply_v2_many(state, [(hd, bd, lay) for hd, lay, bd in row[lo : lo + batch]])
            if (lo // batch + 1) % max(1, every // batch) == 0:
                closed += len(state.close_frames())
    state.clock.restore(state.watermark_ns + 10 * job.step_ns)
    closed += len(state.close_frames(flush=True))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    shard_cpu = sum(proc_cpu_s(p) for p in shard_pids) - shard_cpu0  # type: ignore[arg-type]
    records = sum(h.records for h in hosts) * steps
    state.close()
    return {"shards": shards, "processes": 1 + shards, "records": records,
            "wall_s": round(wall, 3), "records_per_s": round(records / wall),
            "owner_cpu_s": round(cpu, 3), "shard_cpu_s": round(shard_cpu, 3),
            "cpu_us_per_record": round((cpu + shard_cpu) / records * 1e6, 3),
            "frames_closed": closed}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=10240)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--shards", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--batch", type=int, default=16, help="envelopes applied together")
    ap.add_argument("--passes", type=int, default=4, help="detection passes per step")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each shard count, interleaved")
    ap.add_argument("--json", type=Path, help="also write the result here")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(one(args.ranks, args.steps, args.child, args.batch, args.passes)))
        return
    runs = []
    for r in range(args.repeat):
        for n in args.shards:
            cmd = [sys.executable, __file__, "--ranks", str(args.ranks), "--steps",
                   str(args.steps), "--batch", str(args.batch), "--passes", str(args.passes),
                   "--child", str(n)]  # fmt: skip
            out = json.loads(subprocess.run(cmd, check=True, capture_output=True,
                                            text=True).stdout.strip().splitlines()[-1])  # fmt: skip
            out["run"] = r
            print(json.dumps(out), file=sys.stderr, flush=True)
            runs.append(out)
    frames = {r["frames_closed"] for r in runs}
    if len(frames) != 1:
        raise SystemExit(f"frames closed differ between runs: {sorted(frames)}")
    base = [r["records_per_s"] for r in runs if r["shards"] == 0]
    for r in runs:
        if base:
            r["speedup"] = round(r["records_per_s"] / (sum(base) / len(base)), 2)
    result = {"ranks": args.ranks, "steps": args.steps, "cores": os.cpu_count(), "runs": runs}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
