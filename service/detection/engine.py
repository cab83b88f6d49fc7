"""The detection engine: one pass per job turns newly closed frames into incidents.

A pass holds the job lock only to drain assembled collectives, close frames and take a snapshot
of blocked collectives; the detectors then run under the job's own detection lock so that ingest
is never blocked by detection. Every incident change is written in the pass's transaction. The
engine is also what the rest of the service reads detection through
(:class:`~failslow.service.stream.reading.DetectionReader`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from failslow.detectors.findings import Finding
from failslow.detectors.fleet_links import FleetTally
from failslow.detectors.hang import HangSnapshot
from failslow.detectors.pipeline import JobPipeline
from failslow.detectors.types import Frame, JobShape
from failslow.detectors.vocab import IncidentKind, Subject
from failslow.service.db import session_scope
from failslow.service.detection.history import HistoryAccumulator
from failslow.service.detection.persist import (
    ClearedBy,
    IncidentWriter,
    PassSnapshot,
    write_history,
)
from failslow.service.detection.settings import DetectionSettings, JobTuning
from failslow.service.incidents import service as incidents
from failslow.service.incidents.schemas import IncidentFilter
from failslow.service.jobs import service as jobs_db
from failslow.service.metrics import Metrics
from failslow.service.plans import service as plans
from failslow.service.stream.reading import JobNumbers
from failslow.service.stream.registry import JobRegistry
from failslow.service.stream.roles import work_weights
from failslow.service.stream.shape import (
    blocked_before_ns,
    blocked_collectives,
    hang_snapshot,
    job_shape,
)
from failslow.service.stream.state import JobState

log = logging.getLogger(__name__)
HANG_KEY = (IncidentKind.HANG, Subject.job())
# what the fleet ledger takes from a job: slot -> rank, rank -> (host, gpu), its tally
Taken = tuple[list[int], dict[int, tuple[str | None, int | None]], FleetTally]


@dataclass(slots=True)
class JobRuntime:
    pipeline: JobPipeline
    history: HistoryAccumulator
    lock: threading.Lock = field(default_factory=threading.Lock)
    shape: JobShape | None = None
    shape_version: int = -1
    # slot -> rank and rank -> (host, gpu), rebuilt when the topology changes (shape_version)
    slot_rank: list[int] = field(default_factory=list)
    rank_info: dict[int, tuple[str | None, int | None]] = field(default_factory=dict)
    # (kind, subject) -> incident id
    open: dict[tuple[IncidentKind, Subject], str] = field(default_factory=dict)
    seeded: bool = False
    shares: list[int] | None = None  # the plan's micro-batch shares the detectors assume
    backlog: list[Frame] = field(default_factory=list)  # closed, waiting for a pass
    tuned: dict[str, float] | None = None  # the overrides the pipeline runs with (None: unset)
    settings: DetectionSettings | None = None  # the job's effective settings with them
    tally: FleetTally = field(default_factory=FleetTally)  # speed, links: for the fleet ledger


class DetectionEngine:
    def __init__(
        self,
        *,
        settings: DetectionSettings,
        sessions: sessionmaker[Session],
        metrics: Metrics,
        jobs: JobRegistry,
        cleared_by: ClearedBy = lambda _session, _incident: [],
        tuning_of: Callable[[str], JobTuning] = lambda _job: JobTuning(),
    ) -> None:
        """``cleared_by(session, incident id)``: the kinds of action that succeeded on an
        incident, for the words of its resolution (the actions domain knows them).
        ``tuning_of(job)``: what operators set for the job (paused, threshold overrides)."""
        self.tuning_of = tuning_of
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics
        self.jobs = jobs
        self.writer = IncidentWriter(metrics=metrics, cleared_by=cleared_by)
        self._runtimes: dict[str, JobRuntime] = {}
        self._lock = threading.Lock()
        # told a job's last speed tally when it leaves memory (the fleet ledger: create_app)
        self.on_forget: Callable[[str, Taken], None] | None = None

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
                            major_slowdown=s.major_slowdown,
                            critical_slowdown=s.critical_slowdown,
                        ),
                        history=HistoryAccumulator(job=job, every=s.history_every_steps),
                    )
                    self._runtimes[job] = rt
        return rt

    def existing(self, job: str) -> JobRuntime | None:
        return self._runtimes.get(job)

    def adopt(self, job: str, rt: JobRuntime) -> None:
        """Resume ``job`` with detector state restored from a snapshot."""
        with self._lock:
            self._runtimes[job] = rt

    def forget(self, job: str) -> None:
        taken = self.take_tally(job) if self.on_forget is not None else None
        with self._lock:
            self._runtimes.pop(job, None)
        if taken is not None and self.on_forget is not None:
            self.on_forget(job, taken)

    # -- plans -------------------------------------------------------------------------------
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

    # -- the read interface (DetectionReader) --------------------------------------------------
    def numbers(self, job: str) -> JobNumbers | None:
        rt = self._runtimes.get(job)
        if rt is None:
            return None
        with rt.lock:
            view = rt.pipeline.job_view()
            return JobNumbers(
                frames=rt.pipeline.count,
                step=view["step"],  # type: ignore[arg-type]
                step_time_s=view["step_time_s"],
                baseline_step_time_s=view["baseline_step_time_s"],
                slowdown=view["slowdown"],
                open_subjects=tuple((str(k), str(s)) for k, s in rt.open),
            )

    def frame_times(self, job: str, *, since_step: int | None, last: int) -> list[float]:
        rt = self._runtimes.get(job)
        if rt is None:
            return []
        with rt.lock:
            return rt.pipeline.frame_times(since_index=since_step, last=last)

    def rank_scores(self, job: str) -> tuple[np.ndarray, np.ndarray] | None:
        rt = self._runtimes.get(job)
        if rt is None:
            return None
        with rt.lock:
            return rt.pipeline.rank_view()

    def rank_speed(self, job: str) -> np.ndarray | None:
        rt = self._runtimes.get(job)
        if rt is None:
            return None
        with rt.lock:
            return rt.pipeline.rank_speed()

    def take_tally(self, job: str) -> Taken | None:
        """What the job's passes saw of each rank's speed since the last call (slot -> rank,
        rank -> (host, gpu), the tally), and a fresh tally: the fleet ledger's reading."""
        rt = self._runtimes.get(job)
        if rt is None:
            return None
        with rt.lock:
            tally, rt.tally = rt.tally, FleetTally()
            return list(rt.slot_rank), dict(rt.rank_info), tally

    def job_names(self) -> list[str]:
        """The jobs detection holds in memory."""
        return list(self._runtimes)

    def work_shares(self, job: str) -> list[int] | None:
        rt = self._runtimes.get(job)
        return list(rt.shares) if rt is not None and rt.shares else None

    def jobs_with_shares(self) -> list[str]:
        return [
            j for j, rt in list(self._runtimes.items()) if rt.shares and len(set(rt.shares)) > 1
        ]

    # -- passes --------------------------------------------------------------------------------
    def run_due(self) -> int:
        """One pass over every job with new data, frames waiting, or a possible hang."""
        total = 0
        for state in self.jobs.all():
            if not state.persisted:
                continue
            rt = self._runtimes.get(state.job)
            waiting = state.waiting()
            hung = rt is not None and HANG_KEY in rt.pipeline.opened
            backlog = rt is not None and bool(rt.backlog)
            if not (state.new_data or waiting or hung or backlog):
                continue
            try:
                total += self.run_job(state)
            except Exception:  # noqa: BLE001 - one job's failure must not stop the others
                self.metrics.detection_runs.labels("error").inc()
                log.exception("detection pass failed for job %s", state.job)
        return total

    def _tune(self, rt: JobRuntime, tuning: JobTuning) -> DetectionSettings:
        """The job's effective settings; its pipeline follows a change of its overrides."""
        if rt.settings is None or rt.tuned != tuning.overrides:
            rt.settings = self.settings.tuned(tuning.overrides)
            rt.pipeline.tune(**rt.settings.detector_values())
            rt.tuned = dict(tuning.overrides)
        return rt.settings

    def run_job(self, state: JobState, *, flush: bool = False) -> int:
        rt = self.runtime(state.job)
        started = time.perf_counter()
        tuning = self.tuning_of(state.job)
        with rt.lock:
            settings = self._tune(rt, tuning)
            with state.lock:
                if not rt.seeded:
                    self._seed(rt, state)
                topo = state.topology
                # (one bound per pass: it reads every host's vouch)
                older = blocked_before_ns(state, settings.hang_timeout_floor_s)
                closed = state.close_frames(flush=flush, blocked_before_ns=older)
                state.new_data = False
                if tuning.paused:  # consumed, not analysed: nothing is judged on them later
                    self.metrics.frames_paused.inc(len(closed) + len(rt.backlog))
                    rt.backlog.clear()
                    return 0
                closed = self._take(rt, state.job, closed, flush)
                if rt.shape is None or rt.shape_version != topo.version:
                    rt.shape = job_shape(topo)
                    rt.shape_version = topo.version
                    rt.slot_rank = list(topo.slot_rank)
                    rt.rank_info = {r: (topo.ranks[r].host, topo.ranks[r].gpu)
                                    for r in topo.slot_rank}  # fmt: skip
                    if rt.shares:
                        rt.pipeline.work = work_weights(topo, rt.shares)
                shape = rt.shape
                snap = PassSnapshot(rt.slot_rank, rt.rank_info, state.watermark_ns)
                hang_input = self._hang_snapshot(rt, state, older)
            findings: list[Finding] = []
            job_rows: list[dict[str, Any]] = []
            rank_rows: list[dict[str, Any]] = []
            for frame in closed:
                findings.extend(rt.pipeline.process(frame, shape))
                scores = rt.pipeline.last_scores
                assert scores is not None
                rt.tally.observe(frame, scores, shape, rt.pipeline.last_links)
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
            if closed or findings or job_rows or rank_rows:
                self._persist(rt, state, findings, snap, job_rows, rank_rows)
        self.metrics.frames.inc(len(closed))
        self.metrics.detection_seconds.observe(time.perf_counter() - started)
        self.metrics.detection_runs.labels("ok").inc()
        return len(closed)

    def _take(self, rt: JobRuntime, job: str, closed: list[Frame], flush: bool) -> list[Frame]:
        """This pass's frames: the oldest waiting, at most ``max_frames_per_pass`` (all of them
        when flushing); the rest wait, within ``max_backlog_rank_frames`` (the oldest skipped)."""
        s = self.settings
        frames = rt.backlog + closed if rt.backlog else closed
        if flush or len(frames) <= s.max_frames_per_pass:
            rt.backlog = []
            return frames
        rt.backlog = frames[s.max_frames_per_pass :]
        bound = max(s.max_frames_per_pass, s.max_backlog_rank_frames // max(1, frames[-1].n))
        over = len(rt.backlog) - bound
        if over > 0:
            log.warning("job %s: %d frames waiting; skipping the oldest %d", job,
                        len(rt.backlog), over)  # fmt: skip
            self.metrics.frames_skipped.inc(over)
            rt.backlog = rt.backlog[over:]
        return frames[: s.max_frames_per_pass]

    def _hang_snapshot(self, rt: JobRuntime, state: JobState, older: int) -> HangSnapshot | None:
        """Collectives begun before ``older`` (the smallest timeout ago: ``blocked_before_ns``)
        and blocked, under the job lock."""
        settings = rt.settings or self.settings
        blocked = blocked_collectives(state, older_than_ns=older, typical=rt.pipeline.comm_typical)
        if (
            not blocked
            and not rt.pipeline.opened.get(HANG_KEY)
            and not self._maybe_stalled(state, settings.dead_host_after_s)
        ):
            return None
        step_time_s = float(rt.pipeline.job_view()["step_time_s"] or float("nan"))
        return hang_snapshot(state, blocked, step_time_s=step_time_s)

    def _maybe_stalled(self, state: JobState, dead_after_s: float) -> bool:
        last = state.frames.last_progress_ns
        return bool(last) and (state.watermark_ns - last) / 1e9 > dead_after_s

    def _seed(self, rt: JobRuntime, state: JobState) -> None:
        """Resume incidents that were open before a restart (called under the job lock)."""
        with session_scope(self.sessions) as s:
            rows = incidents.list_incidents(s, job=state.job, state=IncidentFilter.OPEN)
        topo = state.topology
        hosts = list(topo.hosts)
        for row in rows:
            kind = IncidentKind(row.kind)
            slots = tuple(topo.ranks[r].slot for r in row.ranks if r in topo.ranks)
            if kind == IncidentKind.SLOW_GPU:
                if not slots:
                    continue
                subject = Subject.slot(slots[0])
            else:
                subject = Subject.parse(row.subject)
            host_index = None
            if kind == IncidentKind.SLOW_NODE and row.hosts and row.hosts[0] in hosts:
                host_index = hosts.index(row.hosts[0])
            rt.pipeline.seed_open(
                kind,
                subject,
                slots=slots,
                hosts=tuple(row.hosts),
                onset_index=row.onset_step,
                onset_ns=row.onset_ns,
                host_index=host_index,
                chronic=bool((row.evidence or {}).get("chronic")),
            )
            rt.open[(kind, subject)] = row.id
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
        snap: PassSnapshot,
        job_rows: list[dict[str, Any]],
        rank_rows: list[dict[str, Any]],
    ) -> None:
        view = rt.pipeline.job_view()
        with session_scope(self.sessions) as s:
            for f in findings:
                self.writer.apply(s, job=state.job, open_ids=rt.open, f=f, snap=snap)
            jobs_db.save_job_progress(
                s,
                job=state.job,
                last_step=view["step"],  # type: ignore[arg-type]
                step_time_s=view["step_time_s"],
                baseline_step_time_s=view["baseline_step_time_s"],
            )
            write_history(s, job_rows, rank_rows, keep=self.settings.history_rank_buckets)
