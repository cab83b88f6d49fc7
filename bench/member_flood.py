"""Memory under a flood of large communicators: many jobs, each one v1 envelope announcing two
communicators of ``--members`` ranks (what issue 17 found: ~30 MiB of RSS per such envelope and
nothing bounding the jobs together). Reports the service's RSS as jobs arrive and where the
service starts refusing (the per-job cap, then ``max_total_comm_members`` over all jobs).

    python bench/member_flood.py --jobs 80 --members 100000
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port, save, start_service  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=80)
    ap.add_argument("--members", type=int, default=100_000)
    args = ap.parse_args()
    n = args.members
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        proc = start_service(Path(tmp), port)
        url = f"http://127.0.0.1:{port}/v1/ingest"
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        rows = []
        try:
            base = rss_mib(proc.pid)
            for j in range(args.jobs):
                env = {"job": f"flood-{j}", "host": "h0", "sent_ns": time.time_ns(),
                       "comms": [{"comm": f"c{k}", "kind": "dp", "ranks": list(range(n))}
                                 for k in range(2)]}  # fmt: skip
                body = gzip.compress(orjson.dumps(env), compresslevel=1)
                r = httpx.post(url, content=body, headers=headers, timeout=60)
                rejected = r.json().get("rejected", []) if r.status_code == 200 else []
                rows.append({"job": j, "status": r.status_code, "comms_rejected": len(rejected),
                             "reason": rejected[0]["reason"] if rejected else None,
                             "rss_mib": round(rss_mib(proc.pid), 1)})  # fmt: skip
                if j % 10 == 0 or rejected:
                    print(rows[-1], file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    accepted = [r for r in rows if r["comms_rejected"] == 0]
    result = {
        "jobs": args.jobs,
        "members_per_comm": n,
        "envelope_gzip_bytes": len(body),
        "rss_mib_at_start": round(base, 1),
        "jobs_fully_accepted": len(accepted),
        "first_refusal": next((r for r in rows if r["comms_rejected"]), None),
        "rss_mib_max": max(r["rss_mib"] for r in rows),
        "rss_mib_per_accepted_job": round(
            (accepted[-1]["rss_mib"] - base) / len(accepted), 1) if accepted else None,
    }  # fmt: skip
    save("member_flood", result)


if __name__ == "__main__":
    main()
