"""A real uvicorn server running the real app in a background thread, for agent tests."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from failslow.service.app import create_app
from failslow.service.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rendezvous_port() -> int:
    """A free port below the kernel's ephemeral range, for a server that clients may try before
    it listens (a gloo job's TCPStore on rank 0). A port from :func:`free_port` lies inside that
    range: a client retrying it while nothing listens can be given that very port as its own
    source port and connect to itself (TCP simultaneous open), then wait forever for an answer
    from itself."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = list(range(max(1024, low - 12_000), low))
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


@contextmanager
def live_service(settings: Settings, port: int | None = None) -> Iterator[str]:
    with live_app(create_app(settings), "/readyz", port) as url:
        yield url


@contextmanager
def live_app(app: Any, ready_path: str, port: int | None = None) -> Iterator[str]:
    """``app`` on a real uvicorn in a background thread, once ``ready_path`` answers 200."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + ready_path, timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    else:
        raise RuntimeError(f"{url} did not start")
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """The predicate's first truthy value within ``timeout``, else its last (falsy) one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(interval)
    return predicate()
