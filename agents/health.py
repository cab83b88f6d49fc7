"""The node agent's own health and metrics over HTTP (``failslow agent --metrics-listen``):
``/healthz`` (200 while every loop runs and the service took an envelope or heartbeat within a
minute, 503 with the reason otherwise: a Kubernetes liveness or readiness probe), ``/metrics``
(Prometheus text: the agent's counters, outbox and delivery age, labelled with the training job
and host as the service's series are). Plain ``http.server``: the agents carry no service stack.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# counters (monotonic) among the agent's stats; the others are gauges
COUNTERS = frozenset({
    "records_in", "records_sealed", "records_accepted", "records_duplicate", "records_rejected",
    "envelopes_sent", "heartbeats", "retries", "refused_envelopes", "bad_messages",
    "foreign_job_messages", "dropped_records", "unencodable_records", "registrations",
    "auth_failures", "disk_errors", "urgent_envelopes",
})  # fmt: skip


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(target: Any, stale_after_s: float = 60.0) -> str:
    """The metrics of a node agent, or of every job's agent of a :class:`JobAgents`, in the
    Prometheus text format (version 0.0.4): one family per name, a sample per job."""
    agents = list(target.agents.values()) if hasattr(target, "agents") else [target]
    families: dict[str, tuple[str, list[str]]] = {}

    def sample(metric: str, kind: str, labels: str, value: float | int) -> None:
        families.setdefault(metric, (kind, []))[1].append(f"{metric}{{{labels}}} {value}")

    for agent in agents:
        agent._refresh_stats()
        labels = f'training_job="{_escape(agent.job)}",host="{_escape(agent.host)}"'
        for name, value in asdict(agent.stats).items():
            if not isinstance(value, int) or isinstance(value, bool):
                continue
            kind = "counter" if name in COUNTERS else "gauge"
            sample(f"failslow_agent_{name}" + ("_total" if kind == "counter" else ""), kind,
                   labels, value)  # fmt: skip
        ok, info = agent.health(stale_after_s=stale_after_s)
        sample("failslow_agent_healthy", "gauge", labels, int(ok))
        if info["seconds_since_delivery"] is not None:
            sample("failslow_agent_delivery_age_seconds", "gauge", labels,
                   info["seconds_since_delivery"])  # fmt: skip
        sample("failslow_agent_uptime_seconds", "gauge", labels,
               round(time.monotonic() - agent.started, 1))  # fmt: skip
    out = []
    for metric, (kind, lines) in families.items():
        out += [f"# TYPE {metric} {kind}", *lines]
    if hasattr(target, "agents"):
        out += ["# TYPE failslow_agent_jobs gauge", f"failslow_agent_jobs {len(agents)}",
                "# TYPE failslow_agent_refused_job_records_total counter",
                f"failslow_agent_refused_job_records_total {target.refused_jobs}"]  # fmt: skip
    return "\n".join(out) + "\n"


class HealthServer:
    def __init__(self, agent: Any, listen: str, *, stale_after_s: float = 60.0) -> None:
        host, _, port = listen.rpartition(":")
        agent_ref = agent

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?")[0] == "/healthz":
                    ok, info = agent_ref.health(stale_after_s=stale_after_s)
                    body = json.dumps({"status": "ok" if ok else "unhealthy", **info}).encode()
                    self._send(200 if ok else 503, "application/json", body)
                elif self.path.split("?")[0] == "/metrics":
                    self._send(
                        200,
                        "text/plain; version=0.0.4",
                        exposition(agent_ref, stale_after_s).encode(),
                    )
                else:
                    self._send(404, "text/plain", b"/healthz or /metrics\n")

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:  # scrapes every 15 s: no log line each
                return

        self.server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
        self.server.daemon_threads = True
        self.address = f"{self.server.server_address[0]}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="agent-health",
                                        daemon=True)  # fmt: skip

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_health(target: Any, listen: str | None) -> HealthServer | None:
    """Start the health server for ``target`` on ``listen`` (None: not served); raises
    SystemExit with a one-line message when it cannot listen."""
    if not listen:
        return None
    try:
        return HealthServer(target, listen).start()
    except (OSError, ValueError) as exc:
        raise SystemExit(f"failslow agent: cannot listen on {listen}: {exc}") from None
