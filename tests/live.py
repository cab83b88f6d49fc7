"""A real uvicorn server running the real app in a background thread, for agent tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn

from failslow.service.app import create_app
from failslow.service.settings import Settings
from tests.ports import free_port

__all__ = ["free_port", "live_app", "live_service"]


@contextmanager
def live_service(settings: Settings, port: int | None = None, bind: str = "127.0.0.1",
                 ) -> Iterator[str]:  # fmt: skip
    """``bind``: the address to listen on (the URL given back is always 127.0.0.1's)."""
    with live_app(create_app(settings), "/readyz", port, bind) as url:
        yield url


@contextmanager
def live_app(app: Any, ready_path: str, port: int | None = None, bind: str = "127.0.0.1",
             ) -> Iterator[str]:  # fmt: skip
    """``app`` on a real uvicorn in a background thread, once ``ready_path`` answers 200."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=bind, port=port, log_level="warning"))
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
