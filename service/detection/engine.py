"""The detection engine: one pass per job turns newly closed frames into incidents.

A pass holds the job lock only to drain assembled collectives and close frames; the detectors
then run under the job's own detection lock so that ingest is never blocked by detection.
Every incident change is written to the database in the pass's transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from detectors.pipeline import Finding, JobPipeline
from detectors.types import PeerGroups
from service.db import session_scope
from service.detection.history import HistoryAccumulator
from service.incidents import service as incidents
from service.jobs import service as jobs_db
from service.jobs.models import JobHistory, RankHistory
from service.jobs.registry import JobRegistry
from service.jobs.state import JobState
from service.metrics import Metrics
from service.settings import DetectionSettings

log = logging.getLogger(__name__)

ROLE_KINDS = ("tp", "dp", "ep", "cp")  # comms whose members do equal work


@dataclass(slots=True)
class JobRuntime:
    pipeline: JobPipeline
    history: HistoryAccumulator
    lock: threading.Lock = field(default_factory=threading.Lock)
    groups: PeerGroups | None = None
    groups_version: int = -1
    open: dict[str, str] = field(default_factory=dict)  # subject -> incident id
    open_kind: dict[str, str] = field(default_factory=dict)  # subject -> kind
    seeded: bool = False
    frames: int = 0


def peer_groups(state: JobState) -> PeerGroups:
    """Role peers from the job's comms: TP/DP/EP/CP groups, else world, else everyone."""
    topo = state.topology
    groups = [c.slots for c in topo.comms.values() if c.kind in ROLE_KINDS]
    if not groups:
        groups = [c.slots for c in topo.comms.values() if c.kind == "world"]
    if not groups and topo.n_slots >= 2:
        groups = [np.arange(topo.n_slots)]
    return PeerGroups.from_groups(groups)


def describe_rank(rank: int, host: str | None, gpu: int | None) -> str:
    where = host or "an unknown host"
    return f"GPU {gpu} on {where} (rank {rank})" if gpu is not None else f"rank {rank} on {where}"


def summary_for(f: Finding, who: str, *, resolved_step: int | None = None) -> str:
    pct = f"{(f.subject_slowdown - 1) * 100:.0f}% slower" if f.subject_slowdown else "slower"
    since = (
        f"since step {f.onset_index}"
        if f.onset_index is not None
        else "since " + time.strftime("%H:%M:%S UTC", time.gmtime(f.onset_ns / 1e9))
    )
    text = f"{who[0].upper()}{who[1:]} is {pct} than its peers {since}"
    if f.slowdown is not None:
        text += f"; job step time {(f.slowdown - 1) * 100:+.0f}%"
    text += "."
    if f.status == "resolved":
        at = f"step {resolved_step}" if resolved_step is not None else "the latest frame"
        text += f" Recovered by {at}."
    return text


class DetectionEngine:
    def __init__(
        self,
        *,
        settings: DetectionSettings,
        sessions: sessionmaker[Session],
        metrics: Metrics,
        jobs: JobRegistry,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics
        self.jobs = jobs
        self._runtimes: dict[str, JobRuntime] = {}
        self._lock = threading.Lock()

    def runtime(self, job: str) -> JobRuntime:
        rt = self._runtimes.get(job)
        if rt is None:
            with self._lock:
                rt = self._runtimes.get(job)
                if rt is None:
                    s = self.settings
                    rt = JobRuntime(
                        pipeline=JobPipeline(
                            late_fraction=s.late_fraction,
                            compute_ratio=s.compute_ratio,
                            window=s.window,
                            open_after=s.open_after,
                            resolve_after=s.resolve_after,
                            warmup_frames=s.warmup_frames,
                            baseline_frames=s.baseline_frames,
                        ),
                        history=HistoryAccumulator(job=job, every=s.history_every_steps),
                    )
                    self._runtimes[job] = rt
        return rt

    def peek(self, job: str) -> JobRuntime | None:
        return self._runtimes.get(job)

    def forget(self, job: str) -> None:
        with self._lock:
            self._runtimes.pop(job, None)

    # -- passes --------------------------------------------------------------------------------
    def run_due(self) -> int:
        """One pass over every job with new data or frames waiting; returns frames processed."""
        total = 0
        for state in self.jobs.all():
            if not state.persisted or not (
                state.new_data or state.frames.frames or state.frames.queue.slot
            ):
                continue
            try:
                total += self.run_job(state)
            except Exception:  # noqa: BLE001 - one job's failure must not stop the others
                self.metrics.detection_runs.labels("error").inc()
                log.exception("detection pass failed for job %s", state.job)
        return total

    def run_job(self, state: JobState, *, flush: bool = False) -> int:
        rt = self.runtime(state.job)
        started = time.perf_counter()
        with rt.lock:
            if not rt.seeded:
                self._seed(rt, state)
            with state.lock:
                completed = state.assembler.take_ready()
                state.frames.add_collectives(completed)
                n = state.topology.n_slots
                closed = state.frames.advance(
                    state.watermark_ns, n, flush=flush, world=state.topology.world_size
                )
                state.assembler.expire(state.watermark_ns)
                state.new_data = False
                if rt.groups is None or rt.groups_version != state.topology.version:
                    rt.groups = peer_groups(state)
                    rt.groups_version = state.topology.version
                groups = rt.groups
                slot_rank = list(state.topology.slot_rank)
                info = {
                    r: (state.topology.ranks[r].host, state.topology.ranks[r].gpu)
                    for r in slot_rank
                }
            findings: list[Finding] = []
            job_rows: list[dict[str, Any]] = []
            rank_rows: list[dict[str, Any]] = []
            for frame in closed:
                findings.extend(rt.pipeline.process(frame, groups))
                scores = rt.pipeline.last_scores
                assert scores is not None
                base = rt.pipeline.job_view()["baseline_step_time_s"]
                jr, rr = rt.history.add(frame, scores, slot_rank, base)  # type: ignore[arg-type]
                job_rows += jr
                rank_rows += rr
            if flush:
                jr, rr = rt.history.rows(slot_rank, rt.pipeline.job_view()["baseline_step_time_s"])  # type: ignore[arg-type]
                job_rows += jr
                rank_rows += rr
            rt.frames += len(closed)
            if closed or findings:
                self._persist(rt, state, findings, slot_rank, info, job_rows, rank_rows)
        self.metrics.frames.inc(len(closed))
        self.metrics.detection_seconds.observe(time.perf_counter() - started)
        self.metrics.detection_runs.labels("ok").inc()
        return len(closed)

    def _seed(self, rt: JobRuntime, state: JobState) -> None:
        with session_scope(self.sessions) as s:
            rows = incidents.list_incidents(s, job=state.job, state="open")
        for row in rows:
            rt.open[row.subject] = row.id
            rt.open_kind[row.subject] = row.kind
            if row.kind == "slow_gpu" and row.subject.startswith("rank:"):
                rank = int(row.subject.split(":", 1)[1])
                info = state.topology.ranks.get(rank)
                if info is not None:
                    rt.pipeline.seed_open(
                        info.slot, onset_index=row.onset_step, onset_ns=row.onset_ns
                    )
        rt.seeded = True

    def _persist(
        self,
        rt: JobRuntime,
        state: JobState,
        findings: list[Finding],
        slot_rank: list[int],
        info: dict[int, tuple[str | None, int | None]],
        job_rows: list[dict[str, Any]],
        rank_rows: list[dict[str, Any]],
    ) -> None:
        view = rt.pipeline.job_view()
        with session_scope(self.sessions) as s:
            for f in findings:
                self._apply_finding(s, rt, state, f, slot_rank, info)
            jobs_db.save_job_progress(
                s,
                job=state.job,
                last_step=view["step"],  # type: ignore[arg-type]
                step_time_s=view["step_time_s"],
                baseline_step_time_s=view["baseline_step_time_s"],
            )
            self._write_history(s, job_rows, rank_rows)

    def _apply_finding(
        self,
        s: Session,
        rt: JobRuntime,
        state: JobState,
        f: Finding,
        slot_rank: list[int],
        info: dict[int, tuple[str | None, int | None]],
    ) -> None:
        ranks = [slot_rank[i] for i in f.slots]
        hosts = sorted({h for r in ranks if (h := info[r][0]) is not None})
        subject = "rank:" + ",".join(str(r) for r in ranks)
        who = describe_rank(ranks[0], info[ranks[0]][0], info[ranks[0]][1])
        now_ns = state.watermark_ns
        if f.status == "opened":
            draft = incidents.IncidentDraft(
                job=state.job,
                kind=f.kind,
                subject=subject,
                ranks=ranks,
                hosts=hosts,
                slowdown=f.slowdown,
                subject_slowdown=f.subject_slowdown,
                confidence=f.confidence,
                onset_ns=f.onset_ns,
                detected_ns=f.detected_ns,
                onset_step=f.onset_index,
                detected_step=f.detected_index,
                summary=summary_for(f, who),
                evidence={**f.evidence, "reason": f.reason},
            )
            row, created = incidents.open_incident(s, draft=draft, now_ns=now_ns)
            rt.open[subject] = row.id
            rt.open_kind[subject] = f.kind
            if created:
                self.metrics.opened.labels(f.kind).inc()
                self.metrics.delay.labels(f.kind).observe(
                    max(0.0, (f.detected_ns - f.onset_ns) / 1e9)
                )
                log.info("incident %s opened: %s", row.id, draft.summary)
            return
        inc_id = rt.open.get(subject)
        row = incidents.get_incident(s, incident_id=inc_id) if inc_id else None
        if row is None:
            row = incidents.find_open(s, job=state.job, kind=f.kind, subject=subject)
        if row is None or row.state != "open":
            rt.open.pop(subject, None)
            rt.open_kind.pop(subject, None)
            return
        if f.status == "updated":
            incidents.refresh_incident(
                s,
                incident=row,
                slowdown=f.slowdown,
                subject_slowdown=f.subject_slowdown,
                confidence=f.confidence,
                summary=summary_for(f, who),
                evidence={**f.evidence, "reason": f.reason},
                now_ns=now_ns,
            )
        elif f.status == "resolved":
            incidents.resolve_incident(
                s,
                incident=row,
                resolved_ns=f.detected_ns if f.detected_ns else now_ns,
                resolved_step=f.detected_index,
                evidence={"reason": f.reason, "lateness_s": f.evidence.get("lateness_s")},
            )
            row.summary = (
                row.summary.rstrip(".")
                + "."
                + (
                    f" Recovered by step {f.detected_index}."
                    if f.detected_index is not None
                    else " Recovered."
                )
            )
            rt.open.pop(subject, None)
            rt.open_kind.pop(subject, None)
            self.metrics.resolved.labels(f.kind).inc()
            log.info("incident %s resolved", row.id)

    @staticmethod
    def _write_history(
        s: Session, job_rows: list[dict[str, Any]], rank_rows: list[dict[str, Any]]
    ) -> None:
        if not job_rows and not rank_rows:
            return
        try:
            with s.begin_nested():
                jobs_db.add_history(s, job_rows=job_rows, rank_rows=rank_rows)
        except IntegrityError:
            # A bucket already written (flush, or a restart mid-bucket): merge row by row.
            for row in job_rows:
                s.merge(JobHistory(**row))
            for row in rank_rows:
                s.merge(RankHistory(**row))
