"""The fleet ledger's writer: what detection saw of each part, and the incidents that named parts.

Every ``flush_interval_s`` it takes, per running job, the speed tally the detection passes kept
(per rank: frames, sum and sum of squares of log compute ratios against role peers; taken off
the detection engine, never off the ingest path) and folds it into one reading per part per job.
A host's reading is its GPUs' mean; its network part gets the host's observed time (the exposure
its incident rate is judged on) and the job's passive link reading of the host, where its
collectives could tell it apart (``detectors/fleet_links.py``). Incidents are heard as events
(opened, resolved) and read back from the database, so that what a rolled-back transaction
announced is never counted; each marks the parts it names with the job time it cost. Then
:mod:`.standing` judges the parts again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from failslow.detectors.fleet import (
    JobReading,
    LinkCheck,
    PartKind,
    link_readings,
    merge,
    pooled,
)
from failslow.detectors.impact import job_time_lost
from failslow.detectors.vocab import IncidentKind, Severity
from failslow.service.db import session_scope
from failslow.service.detection.engine import Taken
from failslow.service.fleet import hints, standing
from failslow.service.fleet.identity import Part, gpu_part, host_part, nic_part
from failslow.service.fleet.models import (
    FleetMark,
    FleetPart,
    FleetReading,
    HostInventory,
    QualHost,
    QualRun,
    in_chunks,
)
from failslow.service.fleet.qualifications import Qualifier
from failslow.service.fleet.qualify import Norms
from failslow.service.fleet.rows import (
    ensure_part,
    new_part,
    prune_readings,
    reading_of,
    rows,
    store_reading,
)
from failslow.service.fleet.settings import FleetSettings
from failslow.service.incidents.models import Incident, IncidentResolution, IncidentState
from failslow.service.incidents.service import resolution_of
from failslow.service.jobs.models import Rank
from failslow.service.metrics import Event

log = logging.getLogger(__name__)


class FleetLedger:
    def __init__(
        self,
        *,
        settings: FleetSettings,
        sessions: sessionmaker[Session],
        jobs: Callable[[], list[str]],
        take: Callable[[str], Taken | None],
        watermark: Callable[[str], int | None],
        propose: hints.Propose | None = None,
        checked: Callable[[], list[LinkCheck]] | None = None,
    ) -> None:
        """``jobs()``: the jobs detection holds; ``take(job)``: their tallies since the last
        call; ``watermark(job)``: a job's event-time now (None: not in memory); ``propose``:
        where drain hints go (the actions' ``Mitigation.propose_hint``; None: none made);
        ``checked()``: link checks finished since the last call (probe campaigns)."""
        self.propose, self.checked = propose, checked
        self.qualifier = Qualifier(sessions, Norms(link_ratio=settings.qualify_link_ratio,
                                                   compute_ratio=settings.qualify_compute_ratio),
                                   keep_runs=settings.qualify_keep_runs)  # fmt: skip
        self.settings, self.sessions = settings, sessions
        self.jobs, self.take, self.watermark = jobs, take, watermark
        self._pending: set[str] = set()  # incidents heard of since the last flush
        self._retired: list[tuple[str, Taken, int | None]] = []  # jobs that left memory
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one flush at a time (the loop's, an operator's)
        self._last = time.monotonic()  # the first flush one interval after start
        self.flushes = 0

    # -- what others tell it -------------------------------------------------------------------
    def sink(self, event: Event, attrs: dict[str, Any]) -> None:
        """An event sink (``Metrics.sinks``): incidents opened or resolved."""
        if event in (Event.INCIDENT_OPENED, Event.INCIDENT_RESOLVED) and attrs.get("incident"):
            with self._lock:
                self._pending.add(str(attrs["incident"]))

    def retire(self, job: str, taken: Taken) -> None:
        """A job leaves detection's memory: its last tally is kept for the next flush."""
        with self._lock:
            self._retired.append((job, taken, self.watermark(job)))

    # -- the flush ----------------------------------------------------------------------------
    def run_due(self) -> bool:
        now = time.monotonic()
        if not self.settings.enabled or now - self._last < self.settings.flush_interval_s:
            return False
        self._last = now
        self.flush()
        return True

    def flush(self) -> None:
        """Take every job's tally and the incidents heard of, write them, judge the parts."""
        with self._flushing:
            self._flush()

    def _flush(self) -> None:
        taken: list[tuple[str, Taken, int | None]] = []
        for job in self.jobs():
            t = self.take(job)
            if t is not None:
                taken.append((job, t, self.watermark(job)))
        with self._lock:
            taken += self._retired
            pending, self._retired, self._pending = self._pending, [], set()
        with session_scope(self.sessions) as s:
            touched: dict[str, float] = {}  # part id -> observed seconds added now
            for job, t, now_ns in taken:
                self._readings(s, job, t, now_ns or time.time_ns(), touched)
            fresh = self._marks(s, pending, touched)
            self._qualified(s, fresh, touched)
            for check in self.checked() if self.checked is not None else []:
                self._links(s, check.id, link_readings(check.pairs, check.reference),
                            check.at_ns, touched, count_job=False)  # fmt: skip
            before = {p: st for p, st in s.execute(select(FleetPart.part_id, FleetPart.state))}
            full = self.flushes % standing.FULL_EVERY == 0
            standing.judge(s, self.settings, touched=touched, fresh=fresh, full=full)
            s.flush()
            propose = self.propose
            # a full judgement offers every unfit part's hint again (idempotent by its key): one
            # skipped while its job was muted, or lost to an error, is proposed within
            # FULL_EVERY flushes
            due = hints.hints_for(s, {} if full else before) if propose is not None else []
        for job, spec, event_ns in due:  # after the commit: the action's own transaction
            try:
                propose(job, spec, event_ns)  # type: ignore[misc]
            except Exception:  # noqa: BLE001 - a hint must not stop the ledger
                log.exception("cannot propose a drain hint for %s", spec.target)
        self.flushes += 1

    # -- readings ------------------------------------------------------------------------------
    def _readings(
        self, s: Session, job: str, taken: Taken, now_ns: int, touched: dict[str, float]
    ) -> None:
        """One job's tally into its parts' readings: the rows it needs read in a few queries
        (not one per part: a 1,024-rank job has 1,300 parts), written in one flush."""
        slot_rank, rank_info, tally = taken
        hosts = sorted({h for h, _ in rank_info.values() if h})
        inv = {i.host: i for i in rows(s, HostInventory, HostInventory.host, hosts)}
        items: list[tuple[Part, JobReading]] = []
        per_host: dict[str, list[JobReading]] = {}
        for slot, rank in enumerate(slot_rank):
            host, gpu = rank_info.get(rank, (None, None))
            reading = tally.reading(slot)
            if host is None or reading is None:
                continue
            per_host.setdefault(host, []).append(reading)
            if gpu is not None:
                gpus = inv[host].gpus if host in inv else None
                items.append((gpu_part(host, gpu, gpus), reading))
        for host, readings in per_host.items():
            whole = pooled(readings)
            items.append((host_part(host), whole))
            nics = inv[host].nics if host in inv else None
            # its network: the host's observed time, and its passive link speed where the
            # job's communicators could tell it apart (detectors/fleet_links.py)
            link = tally.link_reading(host)
            net = JobReading(0, 0.0, 0.0, 0.0) if link is None else link
            items.append((nic_part(host, nics), replace(net, observed_s=whole.observed_s)))
        self._fold(s, job, items, now_ns, touched)

    def _fold(self, s: Session, job: str, items: list[tuple[Part, JobReading]], now_ns: int,
              touched: dict[str, float], *, count_job: bool = True) -> None:  # fmt: skip
        """Readings of parts in one job (or one link check, a qualification run or a probe
        campaign: ``count_job`` False, not a job the part ran) added to their rows, the parts
        created where new."""
        ids = [p.part_id for p, _ in items]
        with s.no_autoflush:
            parts = {r.part_id: r for r in rows(s, FleetPart, FleetPart.part_id, ids)}
            olds = {r.part_id: r for r in s.scalars(
                select(FleetReading).where(FleetReading.job_id == job))}  # fmt: skip
            crowded = []
            for part, reading in items:
                row = parts.get(part.part_id)
                if row is None:
                    row = parts[part.part_id] = new_part(part, now_ns)
                    s.add(row)
                row.host, row.last_seen_ns = part.host, max(row.last_seen_ns, now_ns)
                old = olds.get(part.part_id)
                if old is None:
                    row.jobs_total += count_job
                    olds[part.part_id] = FleetReading(
                        part_id=part.part_id, job_id=job, n=reading.n, mean=reading.mean,
                        var=reading.var, observed_s=reading.observed_s, first_ns=now_ns,
                        last_ns=now_ns, lost_s=reading.lost_s)  # fmt: skip
                    s.add(olds[part.part_id])
                    if row.jobs_total > self.settings.max_jobs_per_part or not count_job:
                        crowded.append(part.part_id)  # (runs are not jobs: count the rows)
                else:
                    store_reading(old, merge(reading_of(old), reading))
                    old.last_ns = max(old.last_ns, now_ns)
                touched[part.part_id] = touched.get(part.part_id, 0.0) + reading.observed_s
        s.flush()
        for part_id in crowded:
            prune_readings(s, part_id, self.settings.max_jobs_per_part)

    # -- incidents -----------------------------------------------------------------------------
    def _marks(
        self, s: Session, pending: set[str], touched: dict[str, float]
    ) -> dict[str, list[FleetMark]]:
        """Mark the parts the incidents name (new ones, and open ones' growing cost); the
        marks made now, per part. A part an incident no longer names (active probes narrowed
        a slow link to one end) loses its mark and is judged again (``touched``)."""
        unfinished = set(s.scalars(select(FleetMark.incident_id).where(FleetMark.final.is_(False))))
        ids = sorted(pending | unfinished)
        fresh: dict[str, list[FleetMark]] = {}
        for chunk in in_chunks(ids):
            had: dict[str, dict[str, FleetMark]] = {}
            for m in s.scalars(select(FleetMark).where(FleetMark.incident_id.in_(chunk))):
                had.setdefault(m.incident_id, {})[m.part_id] = m
            for inc in s.scalars(select(Incident).where(Incident.id.in_(chunk))):
                for mark in self._mark(s, inc, had.get(inc.id, {}), touched):
                    fresh.setdefault(mark.part_id, []).append(mark)
        return fresh

    def _mark(self, s: Session, inc: Incident, had: dict[str, FleetMark],
              touched: dict[str, float]) -> list[FleetMark]:  # fmt: skip
        parts = self._parts_of(s, inc)
        named = {p.part_id for p in parts}
        for part_id, old in had.items():
            if part_id in named:
                continue
            row = s.get(FleetPart, part_id)
            if row is not None:
                row.incidents_total = max(0, row.incidents_total - 1)
                row.lost_s_total = max(0.0, row.lost_s_total - old.lost_s)
            s.delete(old)
            touched.setdefault(part_id, 0.0)
        if not parts:
            return []
        final = inc.state == IncidentState.RESOLVED
        lost = lost_seconds(inc, self.watermark(inc.job_id)) / len(parts)
        hard = inc.kind == IncidentKind.HANG
        out: list[FleetMark] = []
        for part in parts:
            row = ensure_part(s, part, inc.detected_ns)
            mark = had.get(part.part_id)
            if mark is None:
                mark = FleetMark(incident_id=inc.id, part_id=part.part_id, job_id=inc.job_id,
                                 kind=inc.kind, severity=inc.severity, at_ns=inc.onset_ns,
                                 lost_s=0.0, hard=hard, final=False)  # fmt: skip
                s.add(mark)
                row.incidents_total += 1
                out.append(mark)
            row.lost_s_total += max(0.0, lost - mark.lost_s)
            mark.lost_s, mark.final, mark.severity = lost, final, inc.severity
        return out

    def _qualified(self, s: Session, fresh: dict[str, list[FleetMark]],
                   touched: dict[str, float]) -> None:  # fmt: skip
        """Qualification runs' link checks: a reading of each host's NIC (where two pairs
        measured it), and for a host found no-go for its link a mark on its network part, like
        a slow-link incident's, for each GPU found slow a mark on it, like a slow-GPU incident's
        (they cost no job time: the host took no job)."""
        runs: dict[str, list[QualHost]] = {}
        for q in self.qualifier.untaken(s):
            if self.qualifier.claim(s, q):  # (else another replica's flush took it)
                runs.setdefault(q.run_id, []).append(q)
        for run_id, hosts in runs.items():
            run = s.get(QualRun, run_id)
            at_ns = (run.done_ns if run is not None else None) or time.time_ns()
            readings = {q.host: math.log(q.link_norm / q.link_bps) for q in hosts
                        if q.link_pairs >= 2 and q.link_norm and q.link_bps}  # fmt: skip
            if readings:
                self._links(s, run_id, readings, at_ns, touched, count_job=False)
            for q in hosts:
                found = [(self._nic_of(s, q.host), IncidentKind.SLOW_LINK)] if q.slow_link else []
                inv = s.get(HostInventory, q.host) if q.slow_gpus else None
                found += [(gpu_part(q.host, int(g["index"]), inv.gpus if inv else None, g["uuid"]),
                           IncidentKind.SLOW_GPU) for g in q.slow_gpus or ()]  # fmt: skip
                for part, kind in found:
                    if s.get(FleetMark, (run_id, part.part_id)) is not None:
                        continue
                    row = ensure_part(s, part, at_ns)
                    mark = FleetMark(incident_id=run_id, part_id=part.part_id, job_id=run_id,
                                     kind=kind, severity=Severity.MAJOR, at_ns=at_ns,
                                     lost_s=0.0, hard=False, final=True)  # fmt: skip
                    s.add(mark)
                    row.incidents_total += 1
                    fresh.setdefault(part.part_id, []).append(mark)

    def _links(self, s: Session, job: str, readings: dict[str, float], at_ns: int,
               touched: dict[str, float], *, count_job: bool = True) -> None:  # fmt: skip
        """Link checks' readings (per host, log of reference over its speed) into its NIC's
        reading keyed ``job`` (the check's id: one check, one reading)."""
        items = [(self._nic_of(s, h), JobReading(1, y, 0.0, 0.0)) for h, y in readings.items()]
        self._fold(s, job, items, at_ns, touched, count_job=count_job)

    def _parts_of(self, s: Session, inc: Incident) -> list[Part]:
        """The parts an incident names: a slow GPU its GPU, a slow node or a hang its hosts, a
        slow link the network of its one or two hosts. A job slowdown names none."""
        kind = inc.kind
        if kind == IncidentKind.SLOW_GPU:
            return [p for p in (self._gpu_of(s, inc.job_id, r) for r in inc.ranks) if p]
        hosts = [h for h in inc.hosts or () if h]
        if kind in (IncidentKind.SLOW_NODE, IncidentKind.HANG):
            return [host_part(h) for h in hosts]
        if kind == IncidentKind.SLOW_LINK:
            return [self._nic_of(s, h) for h in hosts]
        return []

    def _nic_of(self, s: Session, host: str) -> Part:
        inv = s.get(HostInventory, host)
        return nic_part(host, inv.nics if inv is not None else None)

    def _gpu_of(self, s: Session, job: str, rank: int) -> Part | None:
        row = s.get(Rank, (job, rank))
        if row is None or row.host is None or row.gpu is None:
            return None
        inv = s.get(HostInventory, row.host)
        return gpu_part(row.host, row.gpu, inv.gpus if inv is not None else None)


def lost_seconds(inc: Incident, job_now_ns: int | None) -> float:
    """The job time an incident cost so far: its duration (event time) x the share of the step
    time its subject took (1 - 1/slowdown); a hang's whole duration."""
    if inc.state == IncidentState.RESOLVED:
        if resolution_of(inc) == IncidentResolution.STALE:
            end = (inc.evidence or {}).get("resolution", {}).get("last_seen_ns")  # type: ignore[union-attr]
            end_ns = int(end) if isinstance(end, int) else inc.detected_ns
        elif resolution_of(inc) == IncidentResolution.MANUAL:
            end_ns = job_now_ns or inc.detected_ns  # resolved on the wall clock: the job's now
        else:
            end_ns = inc.resolved_ns or inc.detected_ns
    else:
        end_ns = job_now_ns or inc.detected_ns
    return job_time_lost((end_ns - inc.onset_ns) / 1e9, inc.slowdown,
                         hang=inc.kind == IncidentKind.HANG)  # fmt: skip


__all__ = ["FleetLedger", "PartKind", "lost_seconds"]
