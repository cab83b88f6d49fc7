"""Active link probes on the node: an echo endpoint, a pairwise bandwidth test, and a worker that
fetches the service's probe tasks and reports their results.

The test between hosts A (client) and B (echo): A sends an 8-byte length ``n`` and ``n`` bytes;
B reads them all and sends ``n`` bytes back. A times its upload until the first byte of the
answer arrives (B has received everything) and the download from there to the last byte. A
slow NIC or cable slows one direction or both; the slower direction is what is reported. Plain
TCP on the path the job's traffic takes (agents run on the nodes, in their network namespace).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

log = logging.getLogger(__name__)

MAX_BYTES = 64 << 20
CHUNK = 1 << 16


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = sock.recv(min(CHUNK, n - len(buf)))
        if not got:
            raise ConnectionError("peer closed the connection")
        buf += got
    return bytes(buf)


def _drain(sock: socket.socket, n: int) -> None:
    left = n
    while left:
        got = sock.recv(min(CHUNK, left))
        if not got:
            raise ConnectionError("peer closed the connection")
        left -= len(got)


def _send_n(sock: socket.socket, n: int, max_bps: float | None = None) -> None:
    """Send ``n`` bytes, paced to at most ``max_bps`` (probes must not hog a training link)."""
    block = b"\0" * CHUNK
    left = n
    t0 = time.perf_counter()
    while left:
        k = min(CHUNK, left)
        sock.sendall(block[:k])
        left -= k
        if max_bps:
            ahead = (n - left) / max_bps - (time.perf_counter() - t0)
            if ahead > 0:
                time.sleep(ahead)


class EchoServer:
    """Answers each connection's ``n`` bytes with ``n`` bytes (n <= 64 MiB)."""

    def __init__(self, addr: str, *, timeout_s: float = 30.0, max_bps: float | None = None) -> None:
        host, _, port = addr.rpartition(":")
        self.max_bps = max_bps
        self.sock = socket.create_server((host, int(port)), reuse_port=False)
        self.addr = f"{host}:{self.sock.getsockname()[1]}"
        self.timeout_s = timeout_s
        self.served = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="failslow-probe-echo", daemon=True)

    def start(self) -> EchoServer:
        self._thread.start()
        return self

    def _serve(self) -> None:
        self.sock.settimeout(0.5)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(self.timeout_s)
                (n,) = struct.unpack("!Q", _recv_exact(conn, 8))
                if n > MAX_BYTES:
                    return
                _drain(conn, n)
                _send_n(conn, n, self.max_bps)
                self.served += 1
            except OSError as exc:
                log.info("probe echo: %s", exc)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.sock.close()


def measure(
    peer_addr: str, nbytes: int, *, timeout_s: float = 30.0, max_bps: float | None = None
) -> dict[str, float]:
    """Bandwidth to and from ``peer_addr``'s echo endpoint: ``up_bps``, ``down_bps``, ``bps``."""
    host, _, port = peer_addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.settimeout(timeout_s)
        t0 = time.perf_counter()
        s.sendall(struct.pack("!Q", nbytes))
        _send_n(s, nbytes, max_bps)
        first = s.recv(1)
        if not first:
            raise ConnectionError("peer closed the connection")
        t1 = time.perf_counter()
        _drain(s, nbytes - 1)
        t2 = time.perf_counter()
    up = nbytes / max(t1 - t0, 1e-9)
    down = nbytes / max(t2 - t1, 1e-9)
    return {"up_bps": up, "down_bps": down, "bps": min(up, down)}


class ProbeWorker:
    """Polls ``/v1/jobs/{job}/hosts/{host}/tasks`` and does what it is given: bandwidth tests,
    one at a time (with ``listen``: this node also answers its peers' tests), and hang evidence
    (Flight Recorder dumps and NCCL RAS, see :mod:`failslow.agents.diagnose`) for the local
    ranks."""

    def __init__(
        self,
        *,
        service: str,
        job: str,
        host: str,
        listen: str | None = None,
        advertise: str | None = None,
        token: str | None = None,
        poll_s: float = 1.0,
        max_bps: float | None = None,
        ranks: Callable[[], list[int]] = list,
        dump_prefix: str | None = None,
        pipe_prefix: str | None = None,
        ras_cmd: str | None = None,
    ) -> None:
        """``max_bps``: pace this node's probe traffic (both the tests it runs and its echoes).
        ``ranks``: the local ranks (whose Flight Recorders to read)."""
        self.service = service.rstrip("/")
        self.job, self.host = job, host
        self.max_bps = max_bps
        self.server = EchoServer(listen, max_bps=max_bps) if listen else None
        self.advertise = advertise or (self.server.addr if self.server else None)
        self.ranks = ranks
        self.dump_prefix, self.pipe_prefix, self.ras_cmd = dump_prefix, pipe_prefix, ras_cmd
        self.hang_reports = 0
        self.poll_s = poll_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(timeout=10.0, headers=headers)
        self.ran = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="failslow-probes", daemon=True)

    def start(self) -> ProbeWorker:
        if self.server is not None:
            self.server.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self.server is not None:
            self.server.close()
        self.http.close()

    def run_once(self) -> int:
        r = self.http.get(
            f"{self.service}/v1/jobs/{self.job}/hosts/{self.host}/tasks",
            params={"probe_addr": self.advertise} if self.advertise else {},
        )
        if r.status_code != 200:
            raise RuntimeError(f"probe tasks: HTTP {r.status_code}: {r.text[:200]}")
        body: dict[str, Any] = r.json()
        self.poll_s = float(body.get("poll_s", self.poll_s))
        for task in body.get("probes", []):
            try:
                result: dict[str, Any] = measure(
                    task["peer_addr"], int(task["bytes"]), max_bps=self.max_bps
                )
            except (OSError, ValueError) as exc:
                result = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                self.errors += 1
            self.http.post(f"{self.service}/v1/jobs/{self.job}/probes/{task['id']}", json=result)
            self.ran += 1
            log.info("probe to %s: %s", task["peer"], result)
        for incident in body.get("dumps", []):
            self.report_hang(str(incident))
        return len(body.get("probes", [])) + len(body.get("dumps", []))

    def report_hang(self, incident: str) -> None:
        from failslow.agents.diagnose import collect

        evidence = collect(
            sorted(self.ranks()),
            dump_prefix=self.dump_prefix,
            pipe_prefix=self.pipe_prefix,
            ras_cmd=self.ras_cmd,
        )
        r = self.http.post(
            f"{self.service}/v1/jobs/{self.job}/incidents/{incident}/hang-evidence",
            json={"host": self.host, **evidence},
        )
        self.hang_reports += 1
        log.info("hang evidence for %s: HTTP %d, %d errors", incident, r.status_code,
                 len(evidence["errors"]))  # fmt: skip

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.run_once()
            except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                log.debug("probe poll failed: %s", exc)
