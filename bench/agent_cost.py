"""Agent and SDK cost per record.

* SDK: wall time per ``record_collective`` call in the calling (training) thread, and total CPU
  per record in the process including the SDK's background encoder thread.
* Agent: CPU seconds of a real ``failslow agent`` process (read from /proc) divided by the
  records it received, batched, gzipped, spooled (fsync on) and delivered to a real service.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import CLI, cpu_seconds, free_port, save, start_service  # noqa: E402
from failslow.agents.sdk import Recorder  # noqa: E402


def sdk_call_cost(calls: int) -> dict[str, float]:
    rec = Recorder("bench", socket_path="/nonexistent/sock", start=False, max_queue=calls + 1)
    t = time.perf_counter()
    for i in range(calls):
        rec.record_collective(
            rank=3, comm="dp-0", seq=i, op="allreduce", nbytes=1 << 20, start_ns=i, end_ns=i + 5
        )
    per_call = (time.perf_counter() - t) / calls
    return {"sdk_call_ns": round(per_call * 1e9)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=400_000)
    args = ap.parse_args()
    result: dict[str, object] = sdk_call_cost(1_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        port = free_port()
        service = start_service(work, port)
        sock = str(work / "agent.sock")
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAILSLOW_")}
        agent = subprocess.Popen(
            CLI
            + [
                "agent",
                "--service",
                f"http://127.0.0.1:{port}",
                "--job",
                "bench",
                "--host",
                "h0",
                "--socket",
                sock,
                "--state-dir",
                str(work / "agent"),
                "--log-level",
                "warning",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        while not os.path.exists(sock):
            time.sleep(0.05)
        stats_file = work / "agent" / "stats.json"
        rec = Recorder("bench", socket_path=sock, flush_interval_s=0.01)
        for r in range(8):
            rec.register_rank(r, gpu=r, world_size=8)
        rec.register_comm("tp-0", "tp", list(range(8)))
        agent_cpu0 = cpu_seconds(agent.pid)
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        n = args.records // 8
        for i in range(n):
            now = (
                time.time_ns()
            )  # record times and envelope times come from one clock, as in real use
            for r in range(8):
                rec.record_collective(
                    rank=r,
                    comm="tp-0",
                    seq=i,
                    op="allreduce",
                    nbytes=1 << 24,
                    start_ns=now + r,
                    end_ns=now + 900,
                )
            if i % 2000 == 0:
                time.sleep(0.001)  # let the SDK thread keep up, as a training loop would
        rec.flush(timeout_s=120)
        sdk_cpu = time.process_time() - cpu0
        total = n * 8
        deadline = time.monotonic() + 300
        stats: dict[str, int] = {}
        while time.monotonic() < deadline:
            try:
                stats = json.loads(stats_file.read_text())
            except (OSError, ValueError):
                stats = {}
            if stats.get("records_accepted", 0) + stats.get("records_duplicate", 0) >= total:
                break
            time.sleep(0.2)
        wall = time.perf_counter() - t0
        agent_cpu = cpu_seconds(agent.pid) - agent_cpu0
        rec.close()
        agent.terminate()
        agent.wait()
        service.terminate()
        service.wait()
    result.update(
        {
            "records": total,
            "delivered": stats.get("records_accepted", 0),
            "envelopes": stats.get("envelopes_sent", 0),
            "sdk_process_cpu_us_per_record": round(sdk_cpu / total * 1e6, 2),
            "agent_cpu_s": round(agent_cpu, 2),
            "agent_cpu_us_per_record": round(agent_cpu / total * 1e6, 2),
            "end_to_end_s": round(wall, 2),
        }
    )
    save("agent_cost", result)


if __name__ == "__main__":
    main()
