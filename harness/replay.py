"""Replay a JSONL file of v1 envelopes into a service, at real-time speed or as fast as possible."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import orjson

from failslow.agents.transport import Backoff, Sender
from failslow.agents.wire import encode_envelope


def replay(
    path: Path,
    *,
    service: str,
    speed: float | None = None,
    token: str | None = None,
    flush: bool = True,
    progress: bool = True,
    max_retries: int = 20,
) -> dict[str, Any]:
    """Send every envelope in ``path`` in order; returns counts. ``speed=None`` means max."""
    sender = Sender(service, token=token)
    backoff = Backoff()
    stats: dict[str, Any] = {
        "envelopes": 0,
        "records": 0,
        "accepted": 0,
        "duplicates": 0,
        "rejected": 0,
        "refused_envelopes": 0,
        "retries": 0,
        "jobs": [],
    }
    jobs: set[str] = set()
    first_ns: int | None = None
    wall0 = time.monotonic()
    started = time.monotonic()
    try:
        with open(path, "rb") as fh:
            for line in fh:
                if not line.strip():
                    continue
                env = orjson.loads(line)
                jobs.add(env["job"])
                if speed is not None:
                    first_ns = env["sent_ns"] if first_ns is None else first_ns
                    due = (env["sent_ns"] - first_ns) / 1e9 / speed
                    delay = due - (time.monotonic() - wall0)
                    if delay > 0:
                        time.sleep(delay)
                payload = encode_envelope(env)
                for _ in range(max_retries):
                    result = sender.post(payload)
                    if result.outcome != "retry":
                        break
                    stats["retries"] += 1
                    time.sleep(result.wait_s if result.wait_s is not None else backoff.next())
                backoff.reset()
                stats["envelopes"] += 1
                stats["records"] += len(env.get("collectives") or []) + len(env.get("steps") or [])
                if result.outcome == "ok" and result.body:
                    stats["accepted"] += result.body.get("accepted", 0)
                    stats["duplicates"] += result.body.get("duplicates", 0)
                    stats["rejected"] += len(result.body.get("rejected", []))
                else:
                    stats["refused_envelopes"] += 1
                if progress and stats["envelopes"] % 100 == 0:
                    rate = stats["records"] / max(time.monotonic() - started, 1e-9)
                    print(
                        f"\r  sent {stats['envelopes']} envelopes, "
                        f"{stats['records']} records ({rate:,.0f}/s)",
                        end="",
                        file=sys.stderr,
                        flush=True,
                    )
        if flush:
            for job in sorted(jobs):
                sender.client.post(service.rstrip("/") + f"/v1/jobs/{job}/flush", timeout=120)
    finally:
        sender.close()
    if progress:
        print(file=sys.stderr)
    stats["jobs"] = sorted(jobs)
    stats["seconds"] = round(time.monotonic() - started, 3)
    return stats
