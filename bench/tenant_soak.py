"""Two tenants on one service (issue 31's soak): an honest 1,024-rank job with a slow GPU
(``failslow bench e2e``, real-time v2 telemetry over HTTP) alone, then again while a hostile
tenant, scoped to ``teamA-*``, runs the issue's cases 2-5 as fast as it can:

2. bundles of 64 heartbeats for jobs nobody registered (each job new);
3. range registrations of new jobs, each within its own bound, to take the service's members;
4. registrations declaring a world of 2^31-1 ranks;
5. envelopes of 12,000 step records of a one-rank job it registered.

Each phase runs on a fresh service (its own database) with ``max_jobs`` 64. Reported: the
honest job's detection (found, delay in steps), its errors (records not acknowledged), the
hostile requests by status, and the service's RSS (sampled every 0.5 s, shard and worker
processes included).

    python bench/tenant_soak.py [--steps 60] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from failslow.harness.load.fleet import children, proc_rss_mib
from failslow.wire import v2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import CLI, ROOT, free_port  # noqa: E402

HOSTILE = {"Authorization": "Bearer hostile"}
T0 = 1_780_000_000_000_000_000


def _service(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAILSLOW_")}
    env.update({
        "FAILSLOW_DATABASE_URL": f"sqlite:///{work}/soak.db",
        "FAILSLOW_AUTH__INGEST_SCOPES": json.dumps({"honest": ["e2e"], "hostile": ["teamA-*"]}),
        "FAILSLOW_AUTH__READ_TOKENS": json.dumps(["honest"]),
        "FAILSLOW_STATE__MAX_JOBS": "64",
    })  # fmt: skip
    port = free_port()
    log = open(work / "service.log", "wb")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen([*CLI, "serve", "--port", str(port), "--log-level", "warning"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return proc, url
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the service did not start")


def _rss(pid: int) -> float:
    total = 0.0
    for p in [pid, *children(pid)]:
        with contextlib.suppress(OSError):
            total += proc_rss_mib(p)
    return total


def _hostile(url: str, stop: threading.Event, counts: Counter[str]) -> None:
    n = 0
    with httpx.Client(timeout=60, headers=HOSTILE) as c:
        one = {"sent_ns": T0, "ranks": [{"rank": 0, "gpu": 0, "world_size": 1}], "comms": []}
        r = c.put(f"{url}/v2/jobs/teamA-burst/topology/h0", json=one)
        digest = r.json().get("digest", "x") if r.status_code == 200 else "x"
        seq, step = 0, 0
        while not stop.is_set():
            n += 1
            bodies = [v2.encode({"job": f"teamA-u{n}-{i}", "host": "h0", "sent_ns": T0,
                                 "agent": "a", "batch_seq": 0, "topology": "0" * 16}, {}, {})
                      for i in range(64)]  # fmt: skip
            r = c.post(f"{url}/v2/ingest/bundle", content=v2.encode_bundle(bodies),
                       headers={"Content-Type": v2.BUNDLE_MEDIA_TYPE})  # fmt: skip
            counts[f"case2 bundle {r.status_code}"] += 1
            for item in r.json().get("items", []) if r.status_code == 200 else []:
                counts[f"case2 body {item.get('status', 200)}"] += 1
            world = {"comm": "w", "kind": "dp", "ranks": {"start": 0, "stop": 100_000}}
            reg = {"sent_ns": T0, "ranks": [{"rank": 0, "gpu": 0}], "comms": [world]}
            r = c.put(f"{url}/v2/jobs/teamA-r{n % 200}/topology/h0", json=reg)
            counts[f"case3 {r.status_code}"] += 1
            huge = {"sent_ns": T0, "ranks": [{"rank": 0, "gpu": 0, "world_size": 2**31 - 1}],
                    "comms": []}  # fmt: skip
            r = c.put(f"{url}/v2/jobs/teamA-w{n}/topology/h0", json=huge)
            counts[f"case4 {r.status_code}"] += 1
            k = 12_000
            steps = {"rank": [0] * k, "step": list(range(step, step + k)),
                     "start_ns": [T0 + i * 1000 for i in range(step, step + k)],
                     "end_ns": [T0 + i * 1000 + 900 for i in range(step, step + k)]}  # fmt: skip
            empty = {"rank": [], "comm": [], "seq": [], "op": [], "bytes": [], "peer": [],
                     "start_ns": [], "end_ns": []}  # fmt: skip
            body = v2.encode({"job": "teamA-burst", "host": "h0", "sent_ns": T0 + (step + k) * 1000,
                              "agent": "a", "batch_seq": seq, "topology": digest}, empty, steps)
            r = c.post(f"{url}/v2/ingest", content=body,
                       headers={"Content-Type": v2.MEDIA_TYPE})  # fmt: skip
            counts[f"case5 {r.status_code}"] += 1
            seq, step = seq + 1, step + k


def _phase(steps: int, hostile: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="failslow-soak-") as tmp:
        proc, url = _service(Path(tmp))
        stop = threading.Event()
        counts: Counter[str] = Counter()
        rss: list[float] = []

        def sample() -> None:
            while not stop.is_set():
                rss.append(_rss(proc.pid))
                time.sleep(0.5)

        threads = [threading.Thread(target=sample, daemon=True)]
        if hostile:
            threads.append(threading.Thread(target=_hostile, args=(url, stop, counts),
                                            daemon=True))  # fmt: skip
        for t in threads:
            t.start()
        try:
            out = Path(tmp) / "e2e.json"
            subprocess.run([*CLI, "bench", "e2e", "--ranks", "1024", "--steps", str(steps),
                            "--fault", "slow_gpu", "--service", url, "--token", "honest",
                            "--json", str(out)], check=False, timeout=1800)  # fmt: skip
            honest = json.loads(out.read_text()) if out.exists() else {"failed": True}
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=120)
            stopping = time.monotonic()
            proc.terminate()
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            shutdown_s = time.monotonic() - stopping
            log_tail = (Path(tmp) / "service.log").read_text(errors="replace")[-1500:]
    keep = ("found", "delay_steps", "errors", "first_errors", "records", "lag_steps_p50",
            "lag_steps_max", "other_incidents")  # fmt: skip
    return {"honest": {k: honest.get(k) for k in keep}, "hostile_requests": dict(counts),
            "rss_mib_max": round(max(rss), 1) if rss else None,
            "rss_mib_last": round(rss[-1], 1) if rss else None,
            "shutdown_s": round(shutdown_s, 1), "service_log_tail": log_tail}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    result = {}
    for name, hostile in (("alone", False), ("with_hostile_tenant", True)):
        print(f"phase {name} ...", file=sys.stderr, flush=True)
        result[name] = _phase(args.steps, hostile)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    a, b = result["alone"]["honest"], result["with_hostile_tenant"]["honest"]
    same = a.get("found") and b.get("found") and not b.get("errors")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
