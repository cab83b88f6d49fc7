"""Probe campaigns: scheduled by the service, run by the node agents, fed back into incidents.

A campaign starts for an open ``slow_link`` incident that has not been probed, or a ``slow_gpu``
that passive data could not tell from its host's slow link (``evidence.ambiguous``; its ranks and
host stay, the probes' note says which it is): among its hosts
when passive data could not pin it to one NIC or one host pair (``evidence.ambiguous``, or more
than two hosts); with up to ``partners`` other hosts of the job when it names one cable or one NIC
(passive data may not tell a cable from either end's NIC: in a pipeline, a host's other
traffic can be eager sends whose timing says nothing of its NIC). It starts once the agents of
its hosts have announced a probe endpoint (or some of them, after ``endpoint_wait_s``), at most
once per ``min_interval_s`` per job, and not while the job says it is in a critical phase
(unless ``during_critical``). Its rounds come
from :func:`failslow.service.probes.schedule.plan_rounds`; the agents poll for their tasks (the
lower host of each pair sends, the other echoes), a round starts when the previous one has finished
(every task reported, failed, or timed out). The conclusion is written into the incident: its
``evidence.probes`` (every pair measured), and, when one component is slow, its ``hosts`` and a
sentence in its summary.

State is in memory: a campaign lost with a service restart is simply scheduled again (its
incident still has no ``evidence.probes``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from failslow.detectors.fleet import LinkCheck
from failslow.detectors.vocab import IncidentKind
from failslow.service.db import session_scope
from failslow.service.ids import new_id
from failslow.service.incidents.models import Incident, IncidentState
from failslow.service.incidents.service import add_notes
from failslow.service.metrics import Metrics
from failslow.service.probes.schedule import Pair, PairResult, analyse, plan_rounds
from failslow.service.probes.settings import ProbeSettings

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Task:
    id: str
    a: str  # sends
    b: str  # echoes
    state: str = "pending"  # pending | running | done | failed
    assigned_ns: int = 0
    created_ns: int = 0
    bps: float | None = None
    error: str | None = None


@dataclass(slots=True)
class Campaign:
    id: str
    job: str
    incident: str
    hosts: list[str]
    rounds: list[list[Pair]]
    started_ns: int
    round: int = -1
    tasks: dict[str, Task] = field(default_factory=dict)
    done: list[Task] = field(default_factory=list)
    state: str = "running"  # running | done | cancelled
    finished_ns: int | None = None
    conclusion: dict[str, Any] | None = None
    untested: list[str] = field(default_factory=list)  # hosts without a probe endpoint

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "incident": self.incident,
            "state": self.state,
            "hosts": self.hosts,
            "rounds": [[list(p) for p in r] for r in self.rounds],
            "round": self.round,
            "started_ns": self.started_ns,
            "finished_ns": self.finished_ns,
            "conclusion": self.conclusion,
        }


class ProbeManager:
    def __init__(
        self, *, settings: ProbeSettings, sessions: sessionmaker[Session], metrics: Metrics
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics
        self._lock = threading.Lock()
        self.endpoints: dict[str, dict[str, tuple[str, int]]] = {}  # job -> host -> (addr, ns)
        self.campaigns: dict[str, list[Campaign]] = {}
        self.critical: dict[str, bool] = {}
        self._last_start: dict[str, int] = {}
        self._first_seen: dict[str, int] = {}  # incident -> when a campaign was first wanted
        self._checked: deque[LinkCheck] = deque(maxlen=10_000)  # for the fleet ledger
        self.hangs: dict[str, list[str]] = {}  # job -> open hang incidents
        self._asked: set[tuple[str, str]] = set()  # (incident, host) asked for hang evidence
        self._read_ns = -(1 << 62)  # when the open incidents were last read

    # -- agents ----------------------------------------------------------------------------------
    def poll(self, job: str, host: str, addr: str | None) -> list[dict[str, Any]]:
        """The tasks ``host`` should run now (it sends to each peer's endpoint)."""
        now = time.time_ns()
        with self._lock:
            if addr:
                self.endpoints.setdefault(job, {})[host] = (addr, now)
            if self.critical.get(job) and not self.settings.during_critical:
                return []
            c = self._running(job)
            if c is None:
                return []
            out = []
            for t in c.tasks.values():
                if t.a != host or t.state != "pending":
                    continue
                peer = self.endpoints.get(job, {}).get(t.b)
                if peer is None:
                    self._fail(c, t, f"{t.b} has no probe endpoint")
                    continue
                t.state, t.assigned_ns = "running", now
                out.append(
                    {"id": t.id, "peer": t.b, "peer_addr": peer[0], "bytes": self.settings.bytes}
                )
            self._maybe_advance(c)
            return out

    def report(self, job: str, task_id: str, *, bps: float | None, error: str | None) -> bool:
        """A task's result; False when no running campaign of ``job`` has that task."""
        with self._lock:
            c = self._running(job)
            t = c.tasks.get(task_id) if c is not None else None
            if c is None or t is None or t.state not in ("pending", "running"):
                return False
            if error or bps is None or bps <= 0:
                self._fail(c, t, error or "no measurement")
            else:
                t.state, t.bps = "done", float(bps)
                self.metrics.probes.labels(outcome="done").inc()
            self._maybe_advance(c)
        return True

    def dumps_for(self, job: str, host: str) -> list[str]:
        """Open hang incidents of ``job`` whose evidence ``host`` was not asked for yet."""
        with self._lock:
            out = [i for i in self.hangs.get(job, []) if (i, host) not in self._asked]
            self._asked.update((i, host) for i in out)
            return out

    def forget(self, job: str) -> None:
        """Everything held for ``job`` (it left memory)."""
        with self._lock:
            self.endpoints.pop(job, None)
            self.campaigns.pop(job, None)
            self.critical.pop(job, None)
            self._last_start.pop(job, None)
            self.hangs.pop(job, None)

    def set_critical(self, job: str, critical: bool) -> None:
        with self._lock:
            self.critical[job] = critical

    def view(self, job: str) -> dict[str, Any]:
        with self._lock:
            return {
                "critical": self.critical.get(job, False),
                "endpoints": {h: a for h, (a, _) in self.endpoints.get(job, {}).items()},
                "campaigns": [c.view() for c in self.campaigns.get(job, [])],
            }

    # -- the service's loop ------------------------------------------------------------------------
    def run_due(self) -> None:
        now = time.time_ns()
        with self._lock:
            for cs in self.campaigns.values():
                for c in cs:
                    if c.state == "running":
                        self._expire(c, now)
                        self._maybe_advance(c)
        if now - self._read_ns < self.settings.incident_poll_s * 1e9:
            return
        self._read_ns = now
        with session_scope(self.sessions) as s:
            hangs: dict[str, list[str]] = {}
            for job, inc in s.execute(
                select(Incident.job_id, Incident.id).where(
                    Incident.state == IncidentState.OPEN, Incident.kind == IncidentKind.HANG
                )
            ):
                hangs.setdefault(job, []).append(inc)
            rows = s.scalars(
                select(Incident).where(
                    Incident.state == IncidentState.OPEN,
                    Incident.kind.in_((IncidentKind.SLOW_LINK, IncidentKind.SLOW_GPU)),
                )
            ).all()
            # a slow GPU is probed only where passive data could not tell it from its host's
            # slow link (``evidence.ambiguous``, detectors/report.py): probes of its host's NIC
            # decide (issue 32)
            wanted = [
                (r.job_id, r.id, list(r.hosts), (r.evidence or {}).get("candidate_edges") or [])
                for r in rows
                if "probes" not in (r.evidence or {})
                and (r.kind == IncidentKind.SLOW_LINK or (r.evidence or {}).get("ambiguous"))
            ]
        with self._lock:
            self.hangs = hangs
            live = {i for v in hangs.values() for i in v}
            self._asked = {(i, h) for i, h in self._asked if i in live}
        for job, incident, hosts, edges in wanted if self.settings.enabled else []:
            self._maybe_start(job, incident, hosts, edges, now)

    def take_link_checks(self) -> list[LinkCheck]:
        """Campaigns finished since the last call (the fleet ledger reads NICs' speeds)."""
        with self._lock:
            out = list(self._checked)
            self._checked.clear()
        return out

    def _maybe_start(
        self, job: str, incident: str, hosts: list[str], edges: list[list[str]], now: int
    ) -> None:
        with self._lock:
            if self._running(job) is not None:
                return
            if any(c.incident == incident for c in self.campaigns.get(job, [])):
                return  # tried once for this incident (a finished campaign wrote its result)
            if now - self._last_start.get(job, -(1 << 62)) < self.settings.min_interval_s * 1e9:
                return
            fresh = now - int(self.settings.endpoint_ttl_s * 1e9)
            known = self.endpoints.get(job, {})
            ready = [h for h in hosts if known.get(h, ("", 0))[1] >= fresh]
            first = self._first_seen.setdefault(incident, now)
            waited = now - first >= self.settings.endpoint_wait_s * 1e9
            if not ready or (len(ready) < len(hosts) and not waited):
                return  # wait a while for every host's agent; then test the ones that answer
            if len(hosts) <= 2:  # one cable or one NIC: each end is also tested with others
                others = sorted(h for h, (_, t) in known.items() if t >= fresh and h not in hosts)
                ready += others[: self.settings.partners]
            if len(ready) < 2:
                return
            pairs = [(str(a), str(b)) for a, b, *_ in edges if a in ready and b in ready]
            rounds = plan_rounds(ready, pairs)
            c = Campaign(new_id("prb"), job, incident, sorted(ready), rounds, now)
            c.untested = sorted(set(hosts) - set(ready))
            self._first_seen.pop(incident, None)
            self.campaigns.setdefault(job, []).append(c)
            del self.campaigns[job][: -self.settings.keep_campaigns]
            self._last_start[job] = now
            log.info(
                "probe campaign %s for %s (%s): %d hosts, %d rounds, %d pairs",
                c.id, job, incident, len(ready), len(rounds), sum(len(r) for r in rounds),
            )  # fmt: skip
            self._next_round(c, now)

    # -- internals (under the lock) ------------------------------------------------------------
    def _running(self, job: str) -> Campaign | None:
        return next((c for c in self.campaigns.get(job, []) if c.state == "running"), None)

    def _fail(self, c: Campaign, t: Task, error: str) -> None:
        t.state, t.error = "failed", error
        self.metrics.probes.labels(outcome="failed").inc()

    def _expire(self, c: Campaign, now: int) -> None:
        for t in c.tasks.values():
            if t.state == "running" and now - t.assigned_ns > self.settings.task_timeout_s * 1e9:
                self._fail(c, t, f"no result within {self.settings.task_timeout_s:.0f} s")
            elif t.state == "pending" and now - t.created_ns > self.settings.pickup_timeout_s * 1e9:
                why = "job in a critical phase" if self.critical.get(c.job) else "not picked up"
                self._fail(c, t, f"{why} for {self.settings.pickup_timeout_s:.0f} s")

    def _maybe_advance(self, c: Campaign) -> None:
        if c.state == "running" and all(t.state in ("done", "failed") for t in c.tasks.values()):
            self._next_round(c, time.time_ns())

    def _next_round(self, c: Campaign, now: int) -> None:
        c.done.extend(c.tasks.values())
        c.tasks = {}
        c.round += 1
        if c.round >= len(c.rounds):
            self._finish(c, now)
            return
        for a, b in c.rounds[c.round]:
            t = Task(new_id("tsk"), a, b, created_ns=now)
            c.tasks[t.id] = t

    def _finish(self, c: Campaign, now: int) -> None:
        results = [PairResult(t.a, t.b, t.bps, t.error) for t in c.done]
        conclusion = analyse(results, slow_below=self.settings.slow_below)
        conclusion.update(
            campaign=c.id,
            untested=c.untested,
            rounds=len(c.rounds),
            seconds=round((now - c.started_ns) / 1e9, 2),
        )
        c.state, c.finished_ns, c.conclusion = "done", now, conclusion
        measured = tuple((t.a, t.b, t.bps) for t in c.done if t.bps)
        if measured and conclusion.get("reference_bps"):
            ref = float(conclusion["reference_bps"])  # type: ignore[arg-type]
            self._checked.append(LinkCheck(c.id, c.job, measured, ref, now))
        log.info("probe campaign %s finished: %s", c.id, conclusion.get("reason"))
        try:
            with session_scope(self.sessions) as s:
                inc = s.get(Incident, c.incident)
                if inc is None:
                    return
                if conclusion["component"]:
                    conclusion["note"] = probe_note(conclusion)
                    if inc.kind == IncidentKind.SLOW_LINK:  # a GPU's ranks keep their host
                        inc.hosts = list(conclusion["hosts"])  # type: ignore[call-overload]
                elif inc.kind == IncidentKind.SLOW_GPU and clears(conclusion, list(inc.hosts)):
                    conclusion["note"] = (
                        f"Active probes: the network links of {', '.join(inc.hosts)} are not"
                        f" slow ({conclusion.get('reason')}): its GPU, not its link."
                    )
                inc.evidence = {**(inc.evidence or {}), "probes": conclusion}
                inc.summary = add_notes(inc.summary, inc.evidence)
                inc.updated_ns = now
        except Exception:  # noqa: BLE001 - a lost conclusion is logged; the campaign stays done
            log.exception("cannot write probe campaign %s into incident %s", c.id, c.incident)


def probe_note(conclusion: dict[str, Any]) -> str:
    """The summary's sentence for a conclusive campaign."""
    comp = str(conclusion.get("component") or "")
    if comp.startswith("host:"):
        return f"Active probes: the NIC of {comp[5:]} ({conclusion.get('reason')})."
    a, _, b = comp[5:].partition("|")
    return f"Active probes: the link between {a} and {b} ({conclusion.get('reason')})."


def clears(conclusion: dict[str, Any], hosts: list[str]) -> bool:
    """Whether probes found the links of ``hosts`` fine: no pair slow, two or more measured
    through each of them (too few to compare says nothing)."""
    pairs = conclusion.get("pairs") or []
    if any(p.get("slow") for p in pairs):
        return False
    through = [
        sum(1 for p in pairs if p.get("bps") and h in (p["a"], p["b"]) and "slow" in p)
        for h in hosts
    ]
    return bool(through) and min(through) >= 2
