"""Qualification before work (docs/fleet.md): a short compute check on each host and a link check
between hosts, run by the node agents, each host compared with the fleet's norm, and what the
ledger knows of it: a go / no-go list with reasons, for an operator or a scheduler's prolog.

A run gives every host one compute task (a fixed matrix-multiply loop; its seconds) and link
tasks in a ring (host i measures the path to host i+1 with the agents' echo test), so that each
host is in two pairs: a host with a slow NIC or cable makes both its pairs slow, a healthy host
at most one. A host's link speed is the better of its pairs; it is no-go when that is below
``link_ratio`` x the norm (the median of the hosts' link speeds in this run and recent
passing ones), or its
compute is above ``compute_ratio`` x the norm. Two hosts make one pair: a slow one names both
ends (said so). A host already failed or suspect in the ledger, or with a flagged GPU or NIC, is
no-go whatever it measures; one whose agent does not answer within the timeout is no-go.

Runs and the recent norms are kept in this process's memory (bounded): a qualification is
minutes long, and a restart loses only runs in progress. A host found no-go for its link is
handed to the fleet ledger (:meth:`Qualifier.take_slow_links`): a mark on its network part, as a
slow-link incident would make.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from failslow.service.ids import new_id


class Verdict(StrEnum):
    GO = "go"
    NO_GO = "no-go"
    PENDING = "pending"


class TaskKind(StrEnum):
    COMPUTE = "compute"
    LINK = "link"


@dataclass
class Task:
    id: str
    host: str
    kind: TaskKind
    peer: str | None = None
    handed: bool = False
    result: dict[str, Any] | None = None  # {"seconds"} or {"bps"} or {"error"}


@dataclass
class Run:
    id: str
    hosts: list[str]
    created: float
    deadline: float
    nbytes: int
    iterations: int
    tasks: dict[str, Task] = field(default_factory=dict)
    addrs: dict[str, str] = field(default_factory=dict)  # host -> its echo endpoint
    seen: set[str] = field(default_factory=set)  # hosts whose agent polled
    standing: dict[str, list[str]] = field(default_factory=dict)  # host -> ledger reasons
    verdicts: dict[str, dict[str, Any]] | None = None  # once done


@dataclass(frozen=True, slots=True)
class SlowLink:
    """A host whose link a qualification found slow (for the fleet ledger)."""

    run: str
    host: str
    reason: str
    at_ns: int  # wall clock


@dataclass(frozen=True)
class Norms:
    link_ratio: float = 0.5
    compute_ratio: float = 1.25
    keep: int = 1000  # recent measurements per kind kept for the norm


class Qualifier:
    def __init__(self, norms: Norms | None = None, max_runs: int = 100) -> None:
        self.norms = norms or Norms()
        self.runs: dict[str, Run] = {}
        self.max_runs = max_runs
        self.history: dict[TaskKind, deque[float]] = {
            k: deque(maxlen=self.norms.keep) for k in TaskKind}  # fmt: skip
        self._slow_links: deque[SlowLink] = deque(maxlen=10_000)
        self._lock = threading.Lock()

    def take_slow_links(self) -> list[SlowLink]:
        """Hosts found no-go for their link since the last call."""
        with self._lock:
            out = list(self._slow_links)
            self._slow_links.clear()
        return out

    def start(self, hosts: list[str], *, timeout_s: float, nbytes: int, iterations: int,
              standing: dict[str, list[str]]) -> Run:  # fmt: skip
        now = time.monotonic()
        run = Run(new_id("qual"), hosts, now, now + timeout_s, nbytes, iterations,
                  standing=standing)  # fmt: skip
        for h in hosts:
            t = Task(new_id("qt"), h, TaskKind.COMPUTE)
            run.tasks[t.id] = t
        if len(hosts) >= 2:
            pairs = [(hosts[i], hosts[(i + 1) % len(hosts)]) for i in range(len(hosts))]
            for a, b in pairs[: 1 if len(hosts) == 2 else None]:
                t = Task(new_id("qt"), a, TaskKind.LINK, peer=b)
                run.tasks[t.id] = t
        with self._lock:
            self.runs[run.id] = run
            while len(self.runs) > self.max_runs:
                self.runs.pop(next(iter(self.runs)))
        return run

    def poll(self, host: str, addr: str | None) -> list[dict[str, Any]]:
        """The tasks this host's agent should run now (its echo endpoint noted)."""
        out = []
        with self._lock:
            for run in self.runs.values():
                if run.verdicts is not None or host not in run.hosts:
                    continue
                run.seen.add(host)
                if addr:
                    run.addrs[host] = addr
                for t in run.tasks.values():
                    if t.host != host or t.handed:
                        continue
                    if t.kind == TaskKind.COMPUTE:
                        out.append({"run": run.id, "id": t.id, "kind": t.kind,
                                    "iterations": run.iterations})  # fmt: skip
                    elif t.peer in run.addrs:  # the peer's agent is up: its endpoint is known
                        out.append({"run": run.id, "id": t.id, "kind": t.kind,
                                    "peer": t.peer, "peer_addr": run.addrs[t.peer],
                                    "bytes": run.nbytes})  # fmt: skip
                    else:
                        continue
                    t.handed = True
        return out

    def report(self, run_id: str, task_id: str, result: dict[str, Any]) -> bool:
        with self._lock:
            run = self.runs.get(run_id)
            task = run.tasks.get(task_id) if run is not None else None
            if run is None or task is None or task.result is not None or run.verdicts:
                return False
            task.result = result
            return True

    def view(self, run_id: str) -> dict[str, Any] | None:
        with self._lock:
            run = self.runs.get(run_id)
            if run is None:
                return None
            done = all(t.result is not None for t in run.tasks.values())
            if run.verdicts is None and (done or time.monotonic() >= run.deadline):
                run.verdicts = self._judge(run)
            verdicts = run.verdicts or {h: {"verdict": Verdict.PENDING, "reasons": []}
                                        for h in run.hosts}  # fmt: skip
            def having(v: Verdict) -> list[str]:
                return [h for h in run.hosts if verdicts[h]["verdict"] == v]

            return {"id": run.id, "state": "done" if run.verdicts is not None else "running",
                    "hosts": [{"host": h, **verdicts[h]} for h in run.hosts],
                    "go": having(Verdict.GO), "no_go": having(Verdict.NO_GO)}  # fmt: skip

    def _judge(self, run: Run) -> dict[str, dict[str, Any]]:
        """Verdicts, and this run's measurements added to the norms (caller holds the lock)."""
        done = [t for t in run.tasks.values() if t.result]
        compute = {t.host: float(t.result["seconds"]) for t in done  # type: ignore[index]
                   if t.kind == TaskKind.COMPUTE and "seconds" in t.result}  # type: ignore[operator]
        links = [(t.host, str(t.peer), float(t.result["bps"])) for t in run.tasks.values()
                 if t.kind == TaskKind.LINK and t.result and "bps" in t.result]  # fmt: skip
        best_of = {h: max((bps for a, b, bps in links if h in (a, b)), default=None)
                   for h in run.hosts}  # fmt: skip
        c_norm = _median(list(self.history[TaskKind.COMPUTE]) + list(compute.values()))
        l_norm = _median(list(self.history[TaskKind.LINK]) +
                         [b for b in best_of.values() if b is not None])  # fmt: skip
        out: dict[str, dict[str, Any]] = {}
        for h in run.hosts:
            reasons = list(run.standing.get(h, []))
            mine = [t for t in run.tasks.values() if t.host == h or t.peer == h]
            for t in mine:
                if t.result is None and t.kind == TaskKind.COMPUTE:
                    reasons.append(f"compute check {h}: no answer from the agent in time")
                elif t.result is None and {t.host, str(t.peer)} <= run.seen:
                    reasons.append(f"link check {t.host} -> {t.peer}: no answer in time")
                # (a link check with a silent end is that end's fault: its compute says so)
                elif t.result is not None and "error" in t.result:
                    reasons.append(f"{t.kind} check failed: {str(t.result['error'])[:200]}")
            secs = compute.get(h)
            if secs is not None and c_norm and secs > self.norms.compute_ratio * c_norm:
                reasons.append(f"compute {secs:.3f} s against the fleet norm {c_norm:.3f} s "
                               f"({secs / c_norm:.2f}x)")  # fmt: skip
            pairs = [(a if b == h else b, bps) for a, b, bps in links if h in (a, b)]
            best = best_of[h]
            if best is not None and l_norm and best < self.norms.link_ratio * l_norm:
                peers = ", ".join(p for p, _ in pairs)
                both = " (two hosts: either end may be slow)" if len(run.hosts) == 2 else ""
                reasons.append(f"link {best / 1e6:.1f} MB/s at best (to {peers}) against the "
                               f"norm {l_norm / 1e6:.1f} MB/s{both}")  # fmt: skip
                self._slow_links.append(SlowLink(run.id, h, reasons[-1], time.time_ns()))
            out[h] = {"verdict": Verdict.NO_GO if reasons else Verdict.GO, "reasons": reasons,
                      "compute_s": secs, "link_bps": best}  # fmt: skip
        # only measurements of hosts that passed feed the norm: a bad host must not lower it
        for v in out.values():
            if v["verdict"] == Verdict.GO:
                if v["compute_s"] is not None:
                    self.history[TaskKind.COMPUTE].append(v["compute_s"])
                if v["link_bps"] is not None:
                    self.history[TaskKind.LINK].append(v["link_bps"])
        return out


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


__all__ = ["Norms", "Qualifier", "Run", "TaskKind", "Verdict"]
