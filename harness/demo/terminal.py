"""The demo's output: coloured lines on a terminal, plain ones in a log; free ports."""

from __future__ import annotations

import socket
import sys
import time

BOLD, DIM, RED, GREEN, YELLOW, RESET = (
    "\033[1m",
    "\033[2m",
    "\033[31m",
    "\033[32m",
    "\033[33m",
    "\033[0m",
)



class Terminal:
    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last_status = 0.0

    def c(self, code: str, text: str) -> str:
        return f"{code}{text}{RESET}" if self.tty else text

    def line(self, text: str) -> None:
        if self.tty:
            sys.stdout.write("\r\033[K")
        print(text, flush=True)

    def status(self, text: str) -> None:
        if self.tty:
            sys.stdout.write("\r\033[K" + text)
            sys.stdout.flush()
        elif time.monotonic() - self.last_status >= 5:
            print(text, flush=True)
            self.last_status = time.monotonic()


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def pick_port(preferred: int) -> int:
    if port_free(preferred):
        return preferred
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
