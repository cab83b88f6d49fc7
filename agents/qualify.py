"""The node's side of qualification (docs/fleet.md): poll ``/v1/fleet/agents/{host}/tasks``, run
the checks the service hands out, report them.

- ``compute``: a fixed loop of 512 x 512 float32 matrix multiplies (numpy, on the CPU; on a GPU
  node the same check with the job's framework is future work), timed in ``ROUNDS`` rounds; the
  fastest round, scaled to the whole loop, is the result: another process's burst of CPU on the
  node lengthens some rounds, a slow part lengthens every one.
- ``link``: the probes' echo test (:func:`failslow.agents.probe.measure`) to a peer's endpoint;
  this node answers its peers' tests on ``listen``.

Runs inside ``failslow agent --qualify-listen ADDR:PORT``, or alone for nodes that run no job
yet: ``python -m failslow.agents.qualify --service URL --host NAME --listen ADDR:PORT``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from typing import Any

import httpx
import numpy as np

from failslow.agents.probe import EchoServer, measure

log = logging.getLogger(__name__)

SIZE = 512
ROUNDS = 5


def compute_check(iterations: int) -> float:
    """Seconds for ``iterations`` fixed matrix multiplies (the same work on every node): the
    fastest of up to ``ROUNDS`` rounds, per multiply, times ``iterations``."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((SIZE, SIZE), dtype=np.float32)
    b = rng.standard_normal((SIZE, SIZE), dtype=np.float32)
    rounds = max(1, min(ROUNDS, iterations))
    per, best = iterations // rounds, float("inf")
    for i in range(rounds):
        n = per + (iterations % rounds if i == rounds - 1 else 0)
        t0 = time.perf_counter()
        for _ in range(n):
            a = np.tanh(a @ b)  # tanh keeps the values bounded: the same work each time
        best = min(best, (time.perf_counter() - t0) / n)
    return best * iterations


class QualifyWorker:
    def __init__(self, *, service: str, host: str, listen: str, advertise: str | None = None,
                 token: str | None = None, poll_s: float = 1.0) -> None:  # fmt: skip
        self.service, self.host = service.rstrip("/"), host
        self.server = EchoServer(listen)
        self.advertise = advertise or self.server.addr
        self.poll_s = poll_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(timeout=30.0, headers=headers)
        self.ran = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="failslow-qualify", daemon=True)

    def start(self) -> QualifyWorker:
        self.server.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.server.close()
        self.http.close()

    def run_once(self) -> int:
        r = self.http.get(f"{self.service}/v1/fleet/agents/{self.host}/tasks",
                          params={"probe_addr": self.advertise})  # fmt: skip
        if r.status_code != 200:
            raise RuntimeError(f"qualification tasks: HTTP {r.status_code}: {r.text[:200]}")
        body: dict[str, Any] = r.json()
        self.poll_s = float(body.get("poll_s", self.poll_s))
        for task in body.get("tasks", []):
            result: dict[str, Any]
            try:
                if task["kind"] == "compute":
                    result = {"seconds": compute_check(int(task["iterations"]))}
                else:
                    result = measure(task["peer_addr"], int(task["bytes"]))
            except (OSError, ValueError) as exc:
                result = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            self.http.post(f"{self.service}/v1/fleet/qualifications/{task['run']}/tasks/"
                           f"{task['id']}", json=result)  # fmt: skip
            self.ran += 1
            log.info("qualification %s %s: %s", task["run"], task["kind"], result)
        return len(body.get("tasks", []))

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.run_once()
            except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                log.debug("qualification poll failed: %s", exc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Answer the service's qualification checks.")
    p.add_argument("--service", required=True)
    p.add_argument("--host", default=os.uname().nodename)
    p.add_argument("--listen", required=True, help="ADDR:PORT for peers' link checks")
    p.add_argument("--advertise", help="ADDR:PORT peers should connect to, if different")
    p.add_argument("--token", default=os.environ.get("FAILSLOW_TOKEN"))
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s qualify: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    worker = QualifyWorker(service=args.service, host=args.host, listen=args.listen,
                           advertise=args.advertise, token=args.token).start()  # fmt: skip
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    worker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
