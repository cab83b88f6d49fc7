"""The v2 ingest path in one process, without HTTP: CPU per envelope and per record of decoding,
applying (checks, staging, step records) and draining (join, lateness, frames), after a warm-up
step, for one job of ``--ranks`` ranks (the TP8 x PP4 layout of ``failslow bench e2e``).

    python bench/v2_core.py --ranks 10240 --steps 8

What ``failslow bench e2e`` adds on top of this is HTTP, gzip, the commit and detection.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from failslow.cli import keep_freed_memory  # noqa: E402
from failslow.harness.load.job import HostTemplate, JobLayout, host_name  # noqa: E402
from failslow.service.settings import Settings  # noqa: E402
from failslow.service.stream import columnar, v2apply  # noqa: E402
from failslow.service.stream.settings import StateSettings  # noqa: E402
from failslow.service.stream.state import JobState  # noqa: E402
from failslow.wire import topology, v2  # noqa: E402

T0 = 1_780_000_000_000_000_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=10240)
    ap.add_argument("--steps", type=int, default=8, help="the first is a warm-up")
    ap.add_argument(
        "--joins-per-step", type=int, default=1,
        help="join this many times per step, as a service does while a step's envelopes arrive "
        "(every detection pass: 4 a second)",
    )  # fmt: skip
    ap.add_argument(
        "--batch", type=int, default=1,
        help="apply this many envelopes together, as the service does with those that arrive "
        "before its next commit (v2apply.apply_v2_many)",
    )  # fmt: skip
    ap.add_argument(
        "--allocator-keep-mib", type=int, default=Settings().allocator_keep_mib,
        help="as `failslow serve` sets glibc's allocator (FAILSLOW_ALLOCATOR_KEEP_MIB); 0: "
        "glibc's defaults",
    )
    args = ap.parse_args()
    keep_freed_memory(args.allocator_keep_mib)
    job = JobLayout(args.ranks, 1_000_000_000)
    hosts = [HostTemplate(job, h) for h in range(job.hosts)]
    state = JobState("j", StateSettings())
    t = time.process_time()
    for h, tmpl in enumerate(hosts):
        state.topology.touch_host(host_name(h), 0, 0.0)
        reg = tmpl.registration
        columnar.register_topology(state, host_name(h), reg["ranks"], reg["comms"])
    registration_ms = (time.process_time() - t) / len(hosts) * 1e3
    digests = [topology.digest(h.registration["ranks"], h.registration["comms"]) for h in hosts]
    cpu = {"decode": 0.0, "apply": 0.0, "drain": 0.0}
    clock = time.process_time
    every = max(1, len(hosts) // args.joins_per_step)
    for step in range(args.steps):
        if step == 1:
            cpu = dict.fromkeys(cpu, 0.0)
        group: list[tuple[dict, bytes, v2.Layout]] = []
        for h, tmpl in enumerate(hosts):
            header = {"job": "j", "host": host_name(h), "sent_ns": T0 + (step + 1) * job.step_ns,
                      "agent": "a", "batch_seq": step, "topology": digests[h]}  # fmt: skip
            body = tmpl.body(step, T0, header)
            a = clock()
            group.append((*v2.decode_header(body), body))
            b = clock()
            cpu["decode"] += b - a
            if len(group) == args.batch or h + 1 == len(hosts):
                with state.lock:
                    v2apply.apply_v2_many(state, [(hd, bd, lay) for hd, lay, bd in group])
                group = []
                cpu["apply"] += clock() - b
            if (h + 1) % every == 0 and h + 1 < len(hosts):
                c = clock()
                state.drain_ready()
                cpu["drain"] += clock() - c
        c = clock()
        state.drain_ready()
        state.frames.advance(state.watermark_ns, state.topology.n_slots, world=args.ranks)
        state.expire()
        cpu["drain"] += clock() - c
    envelopes = len(hosts) * (args.steps - 1)
    records = sum(h.records for h in hosts) * (args.steps - 1)
    total = sum(cpu.values())
    print(json.dumps({
        "ranks": args.ranks,
        "joins_per_step": args.joins_per_step,
        "batch": args.batch,
        "allocator_keep_mib": args.allocator_keep_mib,
        "registration_ms_per_host": round(registration_ms, 2),
        "us_per_record": round(total / records * 1e6, 3),
        "us_per_envelope": {k: round(v / envelopes * 1e6, 1) for k, v in cpu.items()},
        "records_per_envelope": round(records / envelopes, 1),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
