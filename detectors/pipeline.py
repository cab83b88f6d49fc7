"""Per-job detection pipeline: frames (and hang snapshots) in, findings out.

Each frame is scored by the detectors (peer lateness and compute, slow nodes, link bandwidth),
recorded in the job's history (:mod:`~failslow.detectors.history`), and fused into persistent
conditions (:mod:`~failslow.detectors.conditions`), whose findings carry numbers and reasons
(:mod:`~failslow.detectors.report`). Pure and clock-free: ``detected_ns`` is the end of the newest
frame a decision used, so detection delay does not depend on replay speed.
"""

from __future__ import annotations

import numpy as np

from failslow.detectors.conditions import Conditions, Key
from failslow.detectors.defaults import DEFAULTS
from failslow.detectors.findings import Finding, OpenCondition
from failslow.detectors.hang import HangDetector, HangSnapshot
from failslow.detectors.history import FrameHistory
from failslow.detectors.link import LinkDetector, LinkScores
from failslow.detectors.straggler import FrameScores, PeerLatenessDetector, node_scores
from failslow.detectors.types import Frame, JobShape
from failslow.detectors.vocab import IncidentKind, Subject

__all__ = ["Finding", "JobPipeline"]


class JobPipeline:
    """Detector state for one job: its history, its open conditions, its detectors."""

    def __init__(
        self,
        *,
        late_fraction: float = DEFAULTS.late_fraction,
        compute_ratio: float = DEFAULTS.compute_ratio,
        link_ratio: float = DEFAULTS.link_ratio,
        job_slowdown_ratio: float = DEFAULTS.job_slowdown_ratio,
        window: int = DEFAULTS.window,
        open_after: int = DEFAULTS.open_after,
        resolve_after: int = DEFAULTS.resolve_after,
        warmup_frames: int = DEFAULTS.warmup_frames,
        baseline_frames: int = DEFAULTS.baseline_frames,
        baseline_block: int = DEFAULTS.baseline_block,
        history: int = DEFAULTS.history,
        update_every: int = DEFAULTS.update_every,
        hang_startup_s: float = DEFAULTS.hang_startup_s,
        hang_floor_s: float = DEFAULTS.hang_floor_s,
        dead_after_s: float = DEFAULTS.dead_after_s,
        major_slowdown: float = DEFAULTS.major_slowdown,
        critical_slowdown: float = DEFAULTS.critical_slowdown,
    ) -> None:
        self.detector = PeerLatenessDetector(
            late_fraction=late_fraction, compute_ratio=compute_ratio
        )
        self.links = LinkDetector(slow_ratio=link_ratio)
        self.late_fraction = late_fraction
        self.compute_ratio = compute_ratio
        self.window = window
        self.warmup_frames = warmup_frames
        self.update_every = update_every
        self.history = FrameHistory(
            history=history,
            window=window,
            baseline_frames=baseline_frames,
            baseline_block=baseline_block,
            warmup=warmup_frames,
        )
        self.conditions = Conditions(
            history=self.history,
            links=self.links,
            hangs=HangDetector(
                floor_s=hang_floor_s, dead_after_s=dead_after_s, startup_s=hang_startup_s
            ),
            late_fraction=late_fraction,
            compute_ratio=compute_ratio,
            job_slowdown_ratio=job_slowdown_ratio,
            window=window,
            open_after=open_after,
            resolve_after=resolve_after,
            severity=(major_slowdown, critical_slowdown),
        )
        self.last_scores: FrameScores | None = None
        self.last_links: LinkScores | None = None
        self.shape: JobShape | None = None
        self.work: np.ndarray | None = None  # per-slot work share (a rebalanced plan), 1 = equal
        self._pending_work: tuple[int | None, np.ndarray | None] | None = None

    # -- what callers read ---------------------------------------------------------------------
    @property
    def count(self) -> int:
        """Frames processed."""
        return self.history.count

    @property
    def opened(self) -> dict[Key, OpenCondition]:
        """Open conditions by (kind, subject)."""
        return self.conditions.opened

    @property
    def comm_typical(self) -> np.ndarray:
        """Per communicator: the usual transfer time of one of its collectives (s)."""
        return self.history.comm_typical

    def baseline(self) -> float:
        return self.history.baseline()

    def job_view(self) -> dict[str, float | int | None]:
        return self.history.job_view()

    def rank_speed(self) -> np.ndarray:
        return self.history.rank_speed()

    def rank_view(self) -> tuple[np.ndarray, np.ndarray]:
        return self.history.rank_view()

    def frame_times(self, *, since_index: int | None = None, last: int = 10) -> list[float]:
        return self.history.frame_times(since_index=since_index, last=last)

    # -- per-job tuning ------------------------------------------------------------------------
    TUNABLE = (
        "late_fraction", "compute_ratio", "link_ratio", "job_slowdown_ratio", "open_after",
        "resolve_after", "hang_floor_s", "dead_after_s", "major_slowdown", "critical_slowdown",
    )  # fmt: skip

    def tune(self, **values: float) -> None:
        """Change thresholds of a running job in place (its learned state is kept): the names
        are the constructor's, those in :attr:`TUNABLE`. Takes effect from the next frame."""
        unknown = set(values) - set(self.TUNABLE)
        if unknown:
            raise ValueError(f"not tunable: {', '.join(sorted(unknown))}")
        c = self.conditions
        if "late_fraction" in values:
            self.late_fraction = self.detector.late_fraction = values["late_fraction"]
            c.reporter.late_fraction = values["late_fraction"]
        if "compute_ratio" in values:
            ratio = values["compute_ratio"]
            self.compute_ratio = self.detector.compute_ratio = c.compute_ratio = ratio
            c.static_ratio = 1.0 + 5.0 * (ratio - 1.0)
        if "link_ratio" in values:
            self.links.slow_ratio = values["link_ratio"]
            self.links.relaxed_ratio = 1.0 - (1.0 - values["link_ratio"]) * self.links.relax
        if "job_slowdown_ratio" in values:
            c.job_slowdown_ratio = values["job_slowdown_ratio"]
        trackers = (c.gpus, c.hosts, c.link_keys.tracker, c.job_keys.tracker)
        for name in ("open_after", "resolve_after"):
            if name in values:
                n = int(values[name])
                if name == "open_after" and not 1 <= n <= self.window:
                    raise ValueError(f"need 1 <= open_after <= window ({self.window})")
                for t in trackers:
                    setattr(t, name, max(1, n))
                    if name == "resolve_after":
                        t.flap_window = 4 * t.resolve_after
        if "hang_floor_s" in values:
            c.hangs.floor_s = values["hang_floor_s"]
        if "dead_after_s" in values:
            c.hangs.dead_after_s = values["dead_after_s"]
        major, critical = c.reporter.severity
        c.reporter.severity = (values.get("major_slowdown", major),
                               values.get("critical_slowdown", critical))  # fmt: skip

    # -- plans and restarts --------------------------------------------------------------------
    def set_work(self, work: np.ndarray | None, *, from_index: int | None = None) -> None:
        """Adopt a new plan's per-slot work shares from frame ``from_index`` on (the step at
        which the job applied it; None = the next frame): compute times are then compared per
        unit of work. The job's baseline step time stays the healthy one from before: nothing
        is learned into it while shares are unequal (a mitigation is not a new normal), and
        equal shares restored are measured against it again (issue 16)."""
        weights = None if work is None else np.asarray(work, dtype=float)
        self._pending_work = (from_index, weights)

    def _adopt_work(self, frame: Frame) -> None:
        pending = self._pending_work
        if pending is None:
            return
        from_index, weights = pending
        if from_index is not None and frame.has_steps and frame.index < from_index:
            return
        self.work = weights
        self._pending_work = None

    @property
    def lopsided(self) -> bool:
        """Whether a plan gives the ranks unequal work now (a mitigation in force)."""
        w = self.work
        return w is not None and w.size > 0 and not np.allclose(w, w.mean())

    def seed_open(
        self,
        kind: IncidentKind,
        subject: Subject,
        *,
        slots: tuple[int, ...],
        hosts: tuple[str, ...],
        onset_index: int | None,
        onset_ns: int,
        host_index: int | None = None,
        chronic: bool = False,
    ) -> None:
        """Resume an incident that was open before a restart (``chronic``: slow since its
        subject's first frames, ``detectors/chronic.py``)."""
        self.conditions.seed_open(
            IncidentKind(kind),
            subject,
            slots=slots,
            hosts=hosts,
            onset_index=onset_index,
            onset_ns=onset_ns,
            host_index=host_index,
        )
        if chronic and (kind, subject) in self.conditions.opened:
            self.conditions.opened[(IncidentKind(kind), subject)].extra["chronic"] = True

    # -- processing ----------------------------------------------------------------------------
    def process(self, frame: Frame, shape: JobShape) -> list[Finding]:
        # Floating-point warnings (0/0 for ranks without data) off, in this thread only
        # (np.errstate is thread-local; all-NaN slices go through quiet_nan, which never warns).
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return self._process(frame, shape)

    def _process(self, frame: Frame, shape: JobShape) -> list[Finding]:
        hist, cond = self.history, self.conditions
        self.shape = cond.shape = shape
        n_comms = shape.comm_kind.size
        grew = frame.n > hist.n
        hist.ensure(frame.n, n_comms)
        if grew:
            cond.gpus.ensure(frame.n)
        self._adopt_work(frame)
        work = self.work if self.work is not None and self.work.size == frame.n else None
        scores = self.detector.score(frame, shape.groups, work)
        nodes = node_scores(
            frame, scores, shape, late_fraction=self.late_fraction, compute_ratio=self.compute_ratio
        )
        busy = {shape.hosts.index(h) for h in cond.compute_hosts(scores) if h in shape.hosts}
        links = self.links.score(
            frame,
            shape,
            busy,
            timed_p2p=not scores.shaky,
            open_causes=cond.open_links(),
            healthy_step_s=hist.baseline(),
        )
        self.last_scores, self.last_links = scores, links
        cond.reporter.observe(shape, scores, links)
        cond.reporter.lopsided = self.lopsided
        hist.record(frame, scores, nodes, links, n_comms)
        if frame.has_steps and np.isfinite(scores.frame_time):
            cond.job_cpd.update(scores.frame_time)
        if hist.count <= self.warmup_frames:
            return []
        findings: list[Finding] = []
        findings += cond.redate(frame)
        findings += cond.gpus_step(frame, scores, nodes, links)
        findings += cond.nodes_step(frame, nodes)
        findings += cond.links_step(frame, links, scores)
        findings += cond.job_step(frame, scores, nodes, links)
        if self.update_every and hist.count % self.update_every == 0:
            findings += cond.updates(frame, findings)
        if frame.has_steps and np.isfinite(scores.frame_time) and not self.lopsided:
            hist.add_to_baseline(scores.frame_time, follow=not cond.job_slowdown_open())
        return findings

    def check_hang(self, snap: HangSnapshot, slot_of_rank: dict[int, int]) -> list[Finding]:
        """Called every pass (frames stop closing while a job hangs)."""
        return self.conditions.hang_step(snap, slot_of_rank)
