"""The node's side of qualification (docs/fleet.md): poll ``/v1/fleet/agents/{host}/tasks``, run
the checks the service hands out, report them.

- ``compute``: a fixed loop of matrix multiplies on every GPU at once (PyTorch, CUDA events) or,
  on a node without them, on the CPU (numpy): :mod:`failslow.agents.compute`. Each GPU is
  reported with its model and UUID; the service judges it against its model's norm.
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
from typing import Any

import httpx

from failslow.agents.compute import ComputeDevice, compute_check
from failslow.agents.probe import EchoServer, measure

log = logging.getLogger(__name__)

class QualifyWorker:
    def __init__(self, *, service: str, host: str, listen: str, advertise: str | None = None,
                 token: str | None = None, poll_s: float = 1.0,
                 compute: ComputeDevice = ComputeDevice.AUTO) -> None:  # fmt: skip
        self.service, self.host = service.rstrip("/"), host
        self.compute = compute
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
                    result = compute_check(int(task["iterations"]), self.compute)
                else:
                    result = measure(task["peer_addr"], int(task["bytes"]))
            except (OSError, ValueError, RuntimeError) as exc:  # (CUDA errors are RuntimeError)
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
    p.add_argument("--compute", choices=list(ComputeDevice), default=ComputeDevice.AUTO,
                   help="where the compute check runs (auto: the GPUs where PyTorch sees them)")
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s qualify: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    worker = QualifyWorker(service=args.service, host=args.host, listen=args.listen,
                           advertise=args.advertise, token=args.token,
                           compute=ComputeDevice(args.compute)).start()  # fmt: skip
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    worker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
