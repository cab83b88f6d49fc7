"""One agent process for every job on a node: ``failslow agent`` without ``--job``.

Training processes of any job send to one socket; the job of each payload comes from its head
(the SDK writes it), and each job gets its own :class:`~failslow.agents.agent.NodeAgent` — its
own outbox and state under ``<state-root>/<job>``, its own stream to the service, its own
active-probe poller (the probe echo listener is shared) — started on the job's first payload.
A job silent for ``idle_after_s`` whose outbox is empty is stopped; on a restart, every job
with envelopes left in its outbox is started again so that nothing is lost. At most
``max_jobs`` jobs at once: payloads of more are counted (``refused_jobs``) and dropped.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from failslow.agents import wire
from failslow.agents.agent import NodeAgent
from failslow.agents.datagrams import bind_socket, receive

log = logging.getLogger(__name__)
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}")  # the API's identifier


class JobAgents:
    def __init__(
        self,
        *,
        socket_path: str,
        state_root: str | Path,
        make_agent: Callable[[str, Path], NodeAgent],
        make_probes: Callable[[str, NodeAgent], Any] | None = None,
        max_jobs: int = 64,
        idle_after_s: float = 3600.0,
        socket_mode: int = 0o660,
    ) -> None:
        """``make_agent(job, state_dir)``: a job's agent, not started; ``make_probes(job,
        agent)``: its started probe worker (or None)."""
        self.socket_path, self.state_root = socket_path, Path(state_root)
        self.make_agent, self.make_probes = make_agent, make_probes
        self.max_jobs, self.idle_after_s = max_jobs, idle_after_s
        self.socket_mode = socket_mode
        self.agents: dict[str, NodeAgent] = {}
        self.probes: dict[str, Any] = {}
        self.last_seen: dict[str, float] = {}
        self.bad_messages = 0
        self.refused_jobs = 0  # records of jobs past max_jobs
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sock: socket.socket | None = None

    # -- jobs ----------------------------------------------------------------------------------
    def agent(self, job: str) -> NodeAgent | None:
        """The job's agent, started on first use (None past ``max_jobs``)."""
        agent = self.agents.get(job)
        if agent is not None:
            return agent
        with self._lock:
            agent = self.agents.get(job)
            if agent is not None:
                return agent
            if len(self.agents) >= self.max_jobs:
                return None
            agent = self.make_agent(job, self.state_root / job)
            agent.start()
            self.agents[job] = agent
            self.last_seen[job] = time.monotonic()
            if self.make_probes is not None:
                self.probes[job] = self.make_probes(job, agent)
            log.info("job %s: agent %s started", job, agent.agent_id)
            return agent

    def add_payload(self, payload: bytes) -> None:
        try:
            head, items = wire.decode_payload(payload)
        except (ValueError, orjson.JSONDecodeError):
            self.bad_messages += 1
            return
        job = head.get("job")
        if not isinstance(job, str) or not JOB_ID.fullmatch(job):
            self.bad_messages += 1
            return
        agent = self.agent(job)
        if agent is None:
            self.refused_jobs += len(items)
            return
        self.last_seen[job] = time.monotonic()
        agent.add_items(items, pid=wire.sender_pid(head))

    def _stop_job(self, job: str, drain_timeout_s: float) -> None:
        with self._lock:
            agent = self.agents.pop(job, None)
            probes = self.probes.pop(job, None)
            self.last_seen.pop(job, None)
        if probes is not None:
            probes.stop()
        if agent is not None:
            agent.stop(drain_timeout_s=drain_timeout_s)
            log.info(
                "job %s: agent stopped (%s)", job, "idle" if not self._stop.is_set() else "exit"
            )

    # -- loops ---------------------------------------------------------------------------------
    def _socket_loop(self) -> None:
        self._sock = bind_socket(self.socket_path, self.socket_mode)
        receive(self._sock, self._stop, self.add_payload)

    def _reap_loop(self) -> None:
        while not self._stop.wait(min(30.0, self.idle_after_s / 4)):
            now = time.monotonic()
            for job, seen in list(self.last_seen.items()):
                agent = self.agents.get(job)
                if agent is not None and now - seen > self.idle_after_s and not len(agent.outbox):
                    self._stop_job(job, drain_timeout_s=1.0)

    def start(self) -> JobAgents:
        if self.state_root.is_dir():  # jobs with envelopes still to deliver, from before
            for d in sorted(p for p in self.state_root.iterdir() if p.is_dir()):
                outbox = d / "outbox"
                if JOB_ID.fullmatch(d.name) and outbox.is_dir() and any(outbox.iterdir()):
                    self.agent(d.name)
        for target in (self._socket_loop, self._reap_loop):
            t = threading.Thread(target=target, name=f"agents-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, *, drain_timeout_s: float = 5.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2.0)
        for job in list(self.agents):
            self._stop_job(job, drain_timeout_s)
        if self._sock is not None:
            self._sock.close()
        Path(self.socket_path).unlink(missing_ok=True)

    # -- what the health endpoint and the stats files show ---------------------------------------
    def health(self, *, stale_after_s: float = 60.0) -> tuple[bool, dict[str, object]]:
        dead = [t.name for t in self._threads if not t.is_alive()]
        jobs = {job: a.health(stale_after_s=stale_after_s) for job, a in list(self.agents.items())}
        ok = not dead and all(h for h, _ in jobs.values())
        return ok, {
            "dead_threads": dead,
            "jobs": {j: info for j, (_, info) in jobs.items()},
            "bad_messages": self.bad_messages,
            "refused_jobs": self.refused_jobs,
        }

    def write_stats(self) -> None:
        for agent in list(self.agents.values()):
            agent.write_stats()
