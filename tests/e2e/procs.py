"""Running real failslow processes from tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from failslow.harness.lab.remote import agent_stats  # noqa: F401 - the e2e tests read it here

CLI = [sys.executable, "-m", "failslow.cli"]


def env_for(db: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAILSLOW_")}
    env.update(
        {
            "FAILSLOW_DATABASE_URL": f"sqlite:///{db}",
            "FAILSLOW_DETECTION__INTERVAL_S": "0.1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start a process logging to ``log``; :func:`stop` closes the log again."""
    with open(log, "ab") as fh:  # the child keeps its own descriptor
        return subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT)


def start_service(
    port: int, db: Path, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    proc = spawn(CLI + ["serve", "--port", str(port)], env or env_for(db), log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"service exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("service not ready")


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def spawn_agent(
    url: str, job: str, host: str, state: Path, sock: Path, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """A node agent process fed over ``sock`` (the SDK's socket), retrying quickly."""
    return spawn(
        CLI + ["agent", "--service", url, "--job", job, "--host", host, "--socket", str(sock),
               "--state-dir", str(state), "--flush-interval", "0.2", "--heartbeat", "1",
               "--max-backoff", "0.5"],
        env, log,
    )  # fmt: skip



@contextmanager
def service(port: int, db: Path, log: Path) -> Iterator[str]:
    proc = start_service(port, db, log)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)
