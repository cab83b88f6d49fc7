"""A real uvicorn server running the real app in a background thread, for agent tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from failslow.service.app import create_app
from failslow.service.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def live_service(settings: Settings, port: int | None = None) -> Iterator[str]:
    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    else:
        raise RuntimeError("service did not start")
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
