"""Small builders for v1 envelopes used across tests."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# ../shared next to the repository (datasets, telemetry fixtures); FAILSLOW_SHARED_DIR overrides
SHARED = Path(
    os.environ.get("FAILSLOW_SHARED_DIR") or Path(__file__).resolve().parents[2] / "shared"
)

T0 = 1_780_000_000_000_000_000
MS = 1_000_000


def envelope(
    *,
    job: str = "job-a",
    host: str = "h0",
    sent_ns: int = T0,
    ranks: list[dict[str, Any]] | None = None,
    comms: list[dict[str, Any]] | None = None,
    collectives: list[dict[str, Any]] | None = None,
    steps: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    env: dict[str, Any] = {"job": job, "host": host, "sent_ns": sent_ns}
    for name, value in (
        ("ranks", ranks),
        ("comms", comms),
        ("collectives", collectives),
        ("steps", steps),
    ):
        if value is not None:
            env[name] = value
    env.update(extra)
    return env


def coll(
    rank: int,
    seq: int,
    start: int,
    end: int | None,
    *,
    comm: str = "dp-0",
    op: str = "allreduce",
    nbytes: int = 1024,
    peer: int | None = None,
) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "rank": rank,
        "comm": comm,
        "seq": seq,
        "op": op,
        "bytes": nbytes,
        "start_ns": start,
        "end_ns": end,
    }
    if peer is not None:
        rec["peer"] = peer
    return rec


def step(rank: int, idx: int, start: int, end: int) -> dict[str, Any]:
    return {"rank": rank, "step": idx, "start_ns": start, "end_ns": end}


def two_hosts() -> tuple[dict[str, Any], dict[str, Any]]:
    """Announcements for a 4-rank job: ranks 0,1 on h0 and 2,3 on h1, one dp comm of all four."""
    comm = {"comm": "dp-0", "kind": "dp", "ranks": [0, 1, 2, 3]}
    h0 = {
        "ranks": [{"rank": 0, "gpu": 0, "world_size": 4}, {"rank": 1, "gpu": 1, "world_size": 4}],
        "comms": [comm],
    }
    h1 = {
        "ranks": [{"rank": 2, "gpu": 0, "world_size": 4}, {"rank": 3, "gpu": 1, "world_size": 4}],
        "comms": [comm],
    }
    return h0, h1
