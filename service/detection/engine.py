"""The detection engine: one pass per job turns newly closed frames into incidents.

A pass holds the job lock only to drain assembled collectives, close frames and take a snapshot
of blocked collectives; the detectors then run under the job's own detection lock so that ingest
is never blocked by detection. Every incident change is written in the pass's transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from failslow.detectors.findings import Finding
from failslow.detectors.hang import HangSnapshot
from failslow.detectors.pipeline import JobPipeline
from failslow.detectors.types import JobShape
from failslow.service.actions.models import Action
from failslow.service.db import session_scope
from failslow.service.detection.history import HistoryAccumulator
from failslow.service.detection.shape import blocked_collectives, hang_snapshot, job_shape
from failslow.service.detection.text import summary_for
from failslow.service.incidents import service as incidents
from failslow.service.jobs import service as jobs_db
from failslow.service.jobs.models import JobHistory, RankHistory
from failslow.service.jobs.registry import JobRegistry
from failslow.service.jobs.state import JobState
from failslow.service.metrics import Metrics
from failslow.service.plans import service as plans
from failslow.service.plans.work import dp_index, work_weights
from failslow.service.settings import DetectionSettings

log = logging.getLogger(__name__)


@dataclass(slots=True)
class JobRuntime:
    pipeline: JobPipeline
    history: HistoryAccumulator
    lock: threading.Lock = field(default_factory=threading.Lock)
    shape: JobShape | None = None
    shape_version: int = -1
    open: dict[tuple[str, str], str] = field(default_factory=dict)  # (kind, subject) -> incident id
    seeded: bool = False
    frames: int = 0
    shares: list[int] | None = None  # the plan's micro-batch shares the detectors assume


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """What a pass copies out of the job state under its lock."""

    slot_rank: list[int]
    info: dict[int, tuple[str | None, int | None]]  # rank -> (host, gpu)
    now_ns: int


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
                            link_ratio=s.link_ratio,
                            job_slowdown_ratio=s.job_slowdown_ratio,
                            window=s.window,
                            open_after=s.open_after,
                            resolve_after=s.resolve_after,
                            warmup_frames=s.warmup_frames,
                            baseline_frames=s.baseline_frames,
                            hang_floor_s=s.hang_timeout_floor_s,
                            hang_startup_s=s.hang_startup_timeout_s,
                            dead_after_s=s.dead_host_after_s,
                        ),
                        history=HistoryAccumulator(job=job, every=s.history_every_steps),
                    )
                    self._runtimes[job] = rt
        return rt

    def set_plan_shares(
        self, state: JobState, shares: list[int] | None, *, from_step: int | None = None
    ) -> None:
        """The job applies a plan with new micro-batch shares from ``from_step``: from that
        step on, compare compute per unit of work."""
        rt = self.runtime(state.job)
        with rt.lock:
            with state.lock:
                weights = work_weights(state.topology, shares)
            rt.pipeline.set_work(weights, from_index=from_step)
            rt.shares = list(shares) if shares else None

    def jobs_with_shares(self) -> list[str]:
        """Jobs whose detectors follow unequal micro-batch shares (a rebalanced plan)."""
        return [
            j for j, rt in list(self._runtimes.items()) if rt.shares and len(set(rt.shares)) > 1
        ]

    def dp_speeds(self, state: JobState, dp_size: int) -> list[float]:
        """Per data-parallel index: the slowest member's recent speed per unit of work."""
        rt = self.peek(state.job)
        if rt is None or dp_size < 1:
            return []
        with rt.lock:
            score = rt.pipeline.rank_speed()
        with state.lock:
            dp_of, _ = dp_index(state.topology)
            slots = {r: state.topology.ranks[r].slot for r in dp_of if r in state.topology.ranks}
        out = [float("inf")] * dp_size
        for r, d in dp_of.items():
            slot = slots.get(r)
            if slot is None or slot >= score.size or d >= dp_size:
                continue
            out[d] = min(out[d], float(score[slot]))
        return [v if v != float("inf") else float("nan") for v in out]

    def peek(self, job: str) -> JobRuntime | None:
        return self._runtimes.get(job)

    def forget(self, job: str) -> None:
        with self._lock:
            self._runtimes.pop(job, None)

    # -- passes --------------------------------------------------------------------------------
    def run_due(self) -> int:
        """One pass over every job with new data, frames waiting, or a possible hang."""
        total = 0
        for state in self.jobs.all():
            if not state.persisted:
                continue
            rt = self._runtimes.get(state.job)
            waiting = bool(state.frames.frames or state.frames.queue or state.assembler.pending)
            hung = rt is not None and ("hang", "job") in rt.pipeline.opened
            if not (state.new_data or waiting or hung):
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
            with state.lock:
                if not rt.seeded:
                    self._seed(rt, state)
                topo = state.topology
                state.drain_ready()
                closed = state.frames.advance(
                    state.watermark_ns, topo.n_slots, flush=flush, world=topo.world_size
                )
                state.assembler.expire(state.watermark_ns)
                state.new_data = False
                if rt.shape is None or rt.shape_version != topo.version:
                    rt.shape = job_shape(topo)
                    rt.shape_version = topo.version
                    if rt.shares:
                        rt.pipeline.work = work_weights(topo, rt.shares)
                shape = rt.shape
                snap = _Snapshot(
                    list(topo.slot_rank),
                    {r: (topo.ranks[r].host, topo.ranks[r].gpu) for r in topo.slot_rank},
                    state.watermark_ns,
                )
                hang_input = self._hang_snapshot(rt, state)
            findings: list[Finding] = []
            job_rows: list[dict[str, Any]] = []
            rank_rows: list[dict[str, Any]] = []
            for frame in closed:
                findings.extend(rt.pipeline.process(frame, shape))
                scores = rt.pipeline.last_scores
                assert scores is not None
                base = rt.pipeline.job_view()["baseline_step_time_s"]
                jr, rr = rt.history.add(frame, scores, snap.slot_rank, base)  # type: ignore[arg-type]
                job_rows += jr
                rank_rows += rr
            if hang_input is not None:
                slot_of = {r: i for i, r in enumerate(snap.slot_rank)}
                findings.extend(rt.pipeline.check_hang(hang_input, slot_of))
            if flush:
                base = rt.pipeline.job_view()["baseline_step_time_s"]
                jr, rr = rt.history.rows(snap.slot_rank, base)  # type: ignore[arg-type]
                job_rows += jr
                rank_rows += rr
            rt.frames += len(closed)
            if closed or findings or job_rows or rank_rows:
                self._persist(rt, state, findings, snap, job_rows, rank_rows)
        self.metrics.frames.inc(len(closed))
        self.metrics.detection_seconds.observe(time.perf_counter() - started)
        self.metrics.detection_runs.labels("ok").inc()
        return len(closed)

    def _hang_snapshot(self, rt: JobRuntime, state: JobState) -> HangSnapshot | None:
        """Collectives blocked for longer than the smallest timeout, under the job lock."""
        floor_ns = int(self.settings.hang_timeout_floor_s * 1e9)
        blocked = blocked_collectives(
            state, older_than_ns=state.watermark_ns - floor_ns, typical=rt.pipeline.comm_typical
        )
        if (
            not blocked
            and not rt.pipeline.opened.get(("hang", "job"))
            and not self._maybe_stalled(state)
        ):
            return None
        step_time_s = float(rt.pipeline.job_view()["step_time_s"] or float("nan"))
        return hang_snapshot(state, blocked, step_time_s=step_time_s)

    def _maybe_stalled(self, state: JobState) -> bool:
        last = state.frames.last_progress_ns
        return bool(last) and (state.watermark_ns - last) / 1e9 > self.settings.dead_host_after_s

    def _seed(self, rt: JobRuntime, state: JobState) -> None:
        """Resume incidents that were open before a restart (called under the job lock)."""
        with session_scope(self.sessions) as s:
            rows = incidents.list_incidents(s, job=state.job, state="open")
        topo = state.topology
        hosts = list(topo.hosts)
        for row in rows:
            kind, subject = row.kind, row.subject
            slots = tuple(topo.ranks[r].slot for r in row.ranks if r in topo.ranks)
            key_subject = subject
            if kind == "slow_gpu":
                if not slots:
                    continue
                key_subject = f"slot:{slots[0]}"
            host_index = None
            if kind == "slow_node" and row.hosts and row.hosts[0] in hosts:
                host_index = hosts.index(row.hosts[0])
            rt.pipeline.seed_open(
                kind,
                key_subject,
                slots=slots,
                hosts=tuple(row.hosts),
                onset_index=row.onset_step,
                onset_ns=row.onset_ns,
                host_index=host_index,
            )
            rt.open[(kind, key_subject)] = row.id
        with session_scope(self.sessions) as s:
            applied = plans.applied_shares(s, job=state.job)
        if applied is not None:  # the shares the job runs under, from the step it said
            shares, step = applied
            rt.pipeline.set_work(work_weights(topo, shares), from_index=step)
            rt.shares = list(shares)
        rt.seeded = True

    def _persist(
        self,
        rt: JobRuntime,
        state: JobState,
        findings: list[Finding],
        snap: _Snapshot,
        job_rows: list[dict[str, Any]],
        rank_rows: list[dict[str, Any]],
    ) -> None:
        view = rt.pipeline.job_view()
        with session_scope(self.sessions) as s:
            for f in findings:
                self._apply_finding(s, rt, state, f, snap)
            jobs_db.save_job_progress(
                s,
                job=state.job,
                last_step=view["step"],  # type: ignore[arg-type]
                step_time_s=view["step_time_s"],
                baseline_step_time_s=view["baseline_step_time_s"],
            )
            self._write_history(s, job_rows, rank_rows)

    @staticmethod
    def _subject(f: Finding, ranks: list[int]) -> str:
        if f.kind == "slow_gpu":
            return "rank:" + ",".join(str(r) for r in ranks)
        return f.subject

    def _apply_finding(
        self, s: Session, rt: JobRuntime, state: JobState, f: Finding, snap: _Snapshot
    ) -> None:
        ranks = sorted(snap.slot_rank[i] for i in f.slots if i < len(snap.slot_rank))
        if f.kind == "slow_link":
            ranks = []
        hosts = list(f.hosts) or sorted({h for r in ranks if (h := snap.info[r][0]) is not None})
        subject = self._subject(f, ranks)
        key = (f.kind, f.subject)
        now_ns = snap.now_ns
        summary = summary_for(f, ranks, hosts, snap.info)
        evidence = {**f.evidence, "reason": f.reason}
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
                summary=summary,
                evidence=evidence,
            )
            row, created = incidents.open_incident(s, draft=draft, now_ns=now_ns)
            rt.open[key] = row.id
            if created:
                self.metrics.opened.labels(f.kind).inc()
                self.metrics.delay.labels(f.kind).observe(
                    max(0.0, (f.detected_ns - f.onset_ns) / 1e9)
                )
                log.info("incident %s opened: %s", row.id, summary)
            return
        inc_id = rt.open.get(key)
        row = incidents.get_incident(s, incident_id=inc_id) if inc_id else None
        if row is None:
            row = incidents.find_open(s, job=state.job, kind=f.kind, subject=subject)
        if row is None or row.state != "open":
            rt.open.pop(key, None)
            return
        if f.status == "updated":
            if f.kind == "hang":
                row.ranks, row.hosts = ranks, hosts
            row.onset_ns, row.onset_step = f.onset_ns, f.onset_index  # re-dated with more data
            incidents.refresh_incident(
                s,
                incident=row,
                slowdown=f.slowdown,
                subject_slowdown=f.subject_slowdown,
                confidence=f.confidence,
                summary=summary,
                evidence=evidence,
                now_ns=now_ns,
            )
        elif f.status == "resolved":
            incidents.resolve_incident(
                s,
                incident=row,
                resolved_ns=f.detected_ns or now_ns,
                resolved_step=f.detected_index,
                evidence={"reason": f.reason},
            )
            fixed = s.scalars(
                select(Action.kind)
                .where(
                    Action.incident_id == row.id,
                    Action.state == "succeeded",
                    Action.kind.in_(("rebalance", "replan", "restart")),
                )
                .order_by(Action.created_ns)
            ).all()
            verb = f"Cleared after {' + '.join(dict.fromkeys(fixed))}" if fixed else "Recovered"
            at = (
                f" {verb} by step {f.detected_index}."
                if f.detected_index is not None
                else f" {verb}."
            )
            if fixed:
                row.evidence = {**row.evidence, "cleared_after": list(dict.fromkeys(fixed))}
            row.summary = row.summary.rstrip(".") + "." + at
            rt.open.pop(key, None)
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
