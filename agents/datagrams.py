"""The Unix datagram socket through which a host's training processes hand their records to
its node agent (the SDK's default; a spool directory is the other way)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path


def bind_socket(path: str, mode: int = 0o660) -> socket.socket:
    """The Unix datagram socket the training processes send to, bound afresh; ``mode``: who
    may send (0660: the agent's user and group; 0666: any local user)."""
    where = Path(path)
    where.parent.mkdir(parents=True, exist_ok=True)
    where.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
    sock.bind(str(where))
    os.chmod(where, mode)
    sock.settimeout(0.2)
    return sock


def receive(sock: socket.socket, stop: threading.Event, handle: Callable[[bytes], None]) -> None:
    """Hand every datagram to ``handle`` until ``stop`` is set."""
    while not stop.is_set():
        try:
            payload = sock.recv(1 << 18)
        except TimeoutError:
            continue
        except OSError:
            if stop.is_set():
                break
            raise
        handle(payload)


__all__ = ["bind_socket", "receive"]
