"""Free TCP ports for the servers tests start (services, PostgreSQL, NATS, Slurm, gloo stores).

Every port lies below the kernel's ephemeral range and is handed out at most once per test
process. A port from the ephemeral range (``bind(("127.0.0.1", 0))``) has two ways to fail:

- a client retrying it while nothing listens yet can be given that very port as its own source
  port and connect to itself (TCP simultaneous open), then wait forever for an answer from itself;
- two calls in a row can return the same port. A test then started two replicas on one port: the
  second could not bind and exited, but its readiness check had already been answered by the
  first, and the test saw one replica twice (CI: ``assert [4, 4] == [2, 2]`` in
  tests/e2e/test_failover_nats.py).

``make test`` runs tests in several pytest-xdist worker processes: each worker takes its own
slice of the range, so no two workers are ever handed the same port.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_given: set[int] = set()


def free_port() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    first = max(1024, low - 12_000)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw3" under pytest-xdist
    if worker.startswith("gw") and worker[2:].isdigit():
        workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
        width = (low - first) // workers
        first += (int(worker[2:]) % workers) * width
        low = first + width
    candidates = [p for p in range(first, low) if p not in _given]
    random.shuffle(candidates)
    for port in candidates[:500]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")
