"""Ingest throughput: records/s through HTTP into one service process, detection running.

Envelopes come from the simulator (a 64-rank TP x PP x DP job) and are gzip-encoded before the
clock starts, so the client spends its CPU on sending. Client and server share this machine.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import cpu_seconds, free_port, save, start_service  # noqa: E402
from failslow.harness.simulator import Layout, Scenario  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--clients", type=int, default=4, help="concurrent HTTP clients")
    ap.add_argument("--batch", type=float, default=2.0, help="seconds of records per envelope")
    args = ap.parse_args()

    sc = Scenario(
        job="bench",
        layout=Layout(tp=4, pp=2, dp=8, gpus_per_host=8),
        steps=args.steps,
        batch_s=args.batch,
    )
    print(f"simulating {args.steps} steps of a 64-rank job...", file=sys.stderr)
    bodies: list[tuple[str, int, bytes, int]] = []  # host, records, gzip body, raw size
    for env in sc.envelopes():
        raw = orjson.dumps(env)
        bodies.append(
            (
                env["host"],
                len(env["collectives"]) + len(env["steps"]),
                gzip.compress(raw, 3),
                len(raw),
            )
        )
    records = sum(n for _, n, _, _ in bodies)
    hosts = sorted({h for h, *_ in bodies})
    # Envelopes of one host must stay in order: each client sends whole hosts.
    per_client: list[list[bytes]] = [[] for _ in range(args.clients)]
    for host, _, body, _ in bodies:
        per_client[hosts.index(host) % args.clients].append(body)
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        proc = start_service(Path(tmp), port)
        url = f"http://127.0.0.1:{port}/v1/ingest"
        latencies: list[float] = []
        lock = threading.Lock()

        def run(chunk: list[bytes]) -> None:
            with httpx.Client(
                headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
            ) as c:
                for body in chunk:
                    t = time.perf_counter()
                    r = c.post(url, content=body)
                    r.raise_for_status()
                    with lock:
                        latencies.append(time.perf_counter() - t)

        cpu0 = cpu_seconds(proc.pid)
        t0 = time.perf_counter()
        threads = [threading.Thread(target=run, args=(chunk,)) for chunk in per_client]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        elapsed = time.perf_counter() - t0
        cpu = cpu_seconds(proc.pid) - cpu0
        flush = httpx.post(f"http://127.0.0.1:{port}/v1/jobs/bench/flush", timeout=120).json()
        incidents = httpx.get(f"http://127.0.0.1:{port}/v1/jobs/bench/incidents").json()
        proc.terminate()
        proc.wait()
    lat = sorted(latencies)
    save(
        "ingest_throughput",
        {
            "records": records,
            "envelopes": len(bodies),
            "mean_records_per_envelope": round(records / len(bodies)),
            "uncompressed_mib": round(sum(u for *_, u in bodies) / 2**20, 1),
            "clients": args.clients,
            "seconds": round(elapsed, 3),
            "records_per_s": round(records / elapsed),
            "envelopes_per_s": round(len(bodies) / elapsed, 1),
            "service_cpu_s": round(cpu, 2),
            "service_cpu_us_per_record": round(cpu / records * 1e6, 2),
            "latency_ms": {
                "p50": round(statistics.median(lat) * 1e3, 1),
                "p99": round(lat[int(len(lat) * 0.99) - 1] * 1e3, 1),
            },
            "frames_after_flush": flush.get("step"),
            "incidents": len(incidents),
            "incident_summaries": [
                f"{i['kind']} {i['ranks']} {i['hosts']}: {i['summary']}" for i in incidents
            ],
        },
    )


if __name__ == "__main__":
    main()
