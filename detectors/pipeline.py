"""Per-job detection pipeline: frames in, findings (opened / updated / resolved) out.

Pure and clock-free: everything it knows arrives in frames; ``detected_ns`` is the end of the
newest frame a decision used, so detection delay does not depend on replay speed.
"""

from __future__ import annotations

import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detectors.lifecycle import ConditionTracker, run_start
from detectors.straggler import FrameScores, PeerLatenessDetector
from detectors.types import Frame, PeerGroups


@dataclass(frozen=True, slots=True)
class Finding:
    """A change of a persistent condition, with the numbers and the reason behind it."""

    kind: str
    status: str  # "opened" | "updated" | "resolved"
    slots: tuple[int, ...]
    onset_index: int | None
    onset_ns: int
    detected_index: int | None
    detected_ns: int
    slowdown: float | None
    subject_slowdown: float | None
    confidence: float
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    has_steps: bool = True


@dataclass(slots=True)
class _Open:
    onset_pos: int  # absolute frame counter of the onset
    onset_index: int
    onset_ns: int
    detected_index: int
    detected_ns: int


def _f(x: float | np.floating | None, nd: int = 4) -> float | None:
    if x is None or not np.isfinite(x):
        return None
    return round(float(x), nd)


class JobPipeline:
    """Detector state for one job: a ring of recent frame scores, a tracker, a baseline."""

    def __init__(
        self,
        *,
        late_fraction: float = 0.03,
        compute_ratio: float = 1.05,
        window: int = 5,
        open_after: int = 4,
        resolve_after: int = 8,
        warmup_frames: int = 5,
        baseline_frames: int = 500,
        baseline_block: int = 10,
        history: int = 64,
        update_every: int = 5,
    ) -> None:
        self.detector = PeerLatenessDetector(
            late_fraction=late_fraction, compute_ratio=compute_ratio
        )
        self.tracker = ConditionTracker(
            window=window, open_after=open_after, resolve_after=resolve_after
        )
        self.window = window
        self.warmup_frames = warmup_frames
        self.update_every = update_every
        self.h = history
        self.n = 0
        self.count = 0  # frames seen
        self.f_index = np.zeros(history, dtype=np.int64)
        self.f_start = np.zeros(history, dtype=np.int64)
        self.f_end = np.zeros(history, dtype=np.int64)
        self.f_time = np.full(history, np.nan)  # job step time (NaN for time frames)
        self.f_norm = np.full(history, np.nan)  # the frame's length, normaliser of lateness
        self.elevated = np.zeros((0, history), dtype=bool)
        self.suspect = np.zeros((0, history), dtype=bool)
        self.compute = np.zeros((0, history), dtype=np.float32)
        self.late = np.zeros((0, history), dtype=np.float32)
        self.ratio = np.zeros((0, history), dtype=np.float32)
        # Baseline: the fastest sustained step time recently seen. Faults only slow a job down, so
        # the minimum over block medians ignores them (and checkpoint stalls) without needing to
        # know when they happened; a lasting legitimate slow-down is adopted once the faster
        # blocks age out of the window.
        self.block = baseline_block
        self._block: list[float] = []
        self.blocks: deque[float] = deque(maxlen=max(1, baseline_frames // baseline_block))
        self.opened: dict[int, _Open] = {}
        self.has_steps = True
        self.last_scores: FrameScores | None = None

    # -- state ---------------------------------------------------------------------------------
    def _ensure(self, n: int) -> None:
        if n <= self.n:
            return
        extra = n - self.n
        self.elevated = np.vstack([self.elevated, np.zeros((extra, self.h), bool)])
        self.suspect = np.vstack([self.suspect, np.zeros((extra, self.h), bool)])
        for name in ("compute", "late", "ratio"):
            arr = getattr(self, name)
            setattr(self, name, np.vstack([arr, np.full((extra, self.h), np.nan, np.float32)]))
        self.tracker.ensure(n)
        self.n = n

    def seed_open(self, slot: int, *, onset_index: int | None, onset_ns: int) -> None:
        """Resume an incident that was open before a restart."""
        self._ensure(slot + 1)
        self.tracker.seed_open(slot)
        idx = onset_index if onset_index is not None else -1
        self.opened[slot] = _Open(self.count, idx, onset_ns, idx, onset_ns)

    def _positions(self, since: int) -> np.ndarray:
        """Ring positions of frames with absolute counter >= since (oldest first)."""
        first = max(since, self.count - self.h, 0)
        return np.arange(first, self.count) % self.h

    # -- processing ----------------------------------------------------------------------------
    def process(self, frame: Frame, groups: PeerGroups) -> list[Finding]:
        self._ensure(frame.n)
        scores = self.detector.score(frame, groups)
        self.last_scores = scores
        self.has_steps = frame.has_steps
        n = frame.n
        p = self.count % self.h
        self.f_index[p] = frame.index
        self.f_start[p] = frame.start_ns
        self.f_end[p] = frame.end_ns
        self.f_time[p] = scores.frame_time if frame.has_steps else np.nan
        self.f_norm[p] = scores.frame_time
        self.elevated[:n, p] = scores.elevated
        self.suspect[:n, p] = scores.suspect
        self.compute[:n, p] = scores.compute
        self.late[:n, p] = scores.late
        self.ratio[:n, p] = scores.compute_ratio
        self.elevated[n:, p] = False
        self.suspect[n:, p] = False
        self.compute[n:, p] = np.nan
        self.late[n:, p] = np.nan
        self.ratio[n:, p] = np.nan
        self.count += 1
        if self.count <= self.warmup_frames:
            return []
        present = np.isfinite(scores.late)
        trans = self.tracker.update(scores.suspect, scores.elevated, present)
        findings: list[Finding] = []
        for slot in trans.opened.tolist():
            findings.append(self._open(int(slot), frame))
        for slot in trans.resolved.tolist():
            findings.append(self._resolve(int(slot), frame))
        if self.update_every and self.count % self.update_every == 0:
            for slot, info in self.opened.items():
                if slot not in trans.opened:
                    findings.append(self._finding("updated", slot, info, frame))
        if frame.has_steps and np.isfinite(scores.frame_time):
            self._block.append(scores.frame_time)
            if len(self._block) >= self.block:
                self.blocks.append(float(np.median(self._block)))
                self._block = []
        return findings

    def baseline(self) -> float:
        """Healthy job step time (NaN until one block of frames after warm-up was seen)."""
        return min(self.blocks) if self.blocks else float("nan")

    def _open(self, slot: int, frame: Frame) -> Finding:
        pos = self._positions(0)
        start = run_start(self.elevated[slot, pos])
        onset_pos = self.count - len(pos) + start
        q = onset_pos % self.h
        info = _Open(
            onset_pos, int(self.f_index[q]), int(self.f_start[q]), frame.index, frame.end_ns
        )
        self.opened[slot] = info
        return self._finding("opened", slot, info, frame)

    def _resolve(self, slot: int, frame: Frame) -> Finding:
        info = self.opened.pop(slot, None) or _Open(
            self.count, frame.index, frame.start_ns, frame.index, frame.end_ns
        )
        return self._finding("resolved", slot, info, frame)

    def _finding(self, status: str, slot: int, info: _Open, frame: Frame) -> Finding:
        since = self._positions(info.onset_pos)
        recent = since[-self.window :] if since.size else self._positions(self.count - 1)
        before = self._positions(info.onset_pos - self.h)
        before = before[: max(0, len(before) - len(since))]
        late = self.late[slot, recent]
        ratio = self.ratio[slot, recent]
        comp_now = self.compute[slot, since] if since.size else self.compute[slot, recent]
        comp_before = self.compute[slot, before]
        med = lambda a: float(np.nanmedian(a)) if np.isfinite(a).any() else float("nan")  # noqa: E731
        late_s = med(late)
        frame_time = med(self.f_norm[recent])
        ratio_now = med(ratio)
        own_now, own_before = med(comp_now), med(comp_before)
        own_ok = np.isfinite(own_before) and own_before > 0 and np.isfinite(own_now)
        # In time frames "compute" is a share of a fixed bucket, so only peer ratios are meaningful.
        if frame.has_steps and own_ok and np.isfinite(comp_before).sum() >= 3:
            subject, basis = own_now / own_before, "own compute time now vs before onset"
        elif np.isfinite(ratio_now):
            subject, basis = ratio_now, "compute time vs role peers"
        elif np.isfinite(late_s) and np.isfinite(frame_time) and frame_time > late_s:
            subject, basis = (
                frame_time / (frame_time - late_s),
                "estimated from lateness (no step records)",
            )
        else:
            subject, basis = float("nan"), "unknown"
        job_now = med(
            self.f_time[since[-max(self.window, 1) :]] if since.size else self.f_time[recent]
        )
        base = self.baseline()
        slowdown = job_now / base if np.isfinite(base) and base > 0 else float("nan")
        late_fraction = (
            late_s / frame_time if frame_time and np.isfinite(frame_time) else float("nan")
        )
        suspects = int(self.tracker.suspect_count()[slot]) if slot < self.tracker.bits.size else 0
        strength = (
            min(1.0, late_fraction / (2 * self.detector.late_fraction))
            if np.isfinite(late_fraction)
            else 0.5
        )
        confidence = round(max(0.0, min(0.99, (suspects / self.window) * strength)), 3)
        if status == "resolved":
            reason = (
                f"no longer late for {self.tracker.resolve_after} consecutive frames "
                f"(peers now wait {late_s * 1e3:.1f} ms per step)"
            )
        else:
            reason = (
                f"late in every communicator it uses in {suspects}/{self.window} recent frames: "
                f"peers wait {late_s * 1e3:.1f} ms per step ({late_fraction:.1%} of step time)"
            )
            if np.isfinite(ratio_now):
                reason += f"; compute {ratio_now:.2f}x its role peers"
        evidence = {
            "detector": "peer_lateness",
            "method": "clock-free lateness (min over comm kinds) + compute vs role peers",
            "lateness_s": _f(late_s, 6),
            "late_fraction": _f(late_fraction),
            "compute_ratio": _f(ratio_now),
            "compute_s": _f(own_now, 6),
            "compute_before_s": _f(own_before, 6),
            "subject_slowdown_basis": basis,
            "suspect_frames": suspects,
            "window": self.window,
            "job_step_time_s": _f(job_now, 6),
            "baseline_step_time_s": _f(base, 6),
        }
        return Finding(
            kind="slow_gpu",
            status=status,
            slots=(slot,),
            onset_index=info.onset_index if frame.has_steps else None,
            onset_ns=info.onset_ns,
            detected_index=(frame.index if status == "resolved" else info.detected_index)
            if frame.has_steps
            else None,
            detected_ns=frame.end_ns if status == "resolved" else info.detected_ns,
            slowdown=_f(slowdown),
            subject_slowdown=_f(subject),
            confidence=confidence,
            reason=reason,
            evidence=evidence,
            has_steps=frame.has_steps,
        )

    # -- views ---------------------------------------------------------------------------------
    def job_view(self) -> dict[str, float | int | None]:
        if self.count == 0:
            return {
                "step": None,
                "step_time_s": None,
                "baseline_step_time_s": None,
                "slowdown": None,
            }
        recent = self._positions(self.count - self.window)
        times = self.f_time[recent]
        now = float(np.nanmedian(times)) if np.isfinite(times).any() else float("nan")
        base = self.baseline()
        last = (self.count - 1) % self.h
        return {
            "step": int(self.f_index[last]) if self.has_steps else None,
            "step_time_s": _f(now, 6),
            "baseline_step_time_s": _f(base, 6),
            "slowdown": _f(now / base)
            if np.isfinite(base) and base > 0 and np.isfinite(now)
            else None,
        }

    def rank_view(self) -> tuple[np.ndarray, np.ndarray]:
        """Per slot ``(score, lateness_s)`` over the recent window: 1.0 = typical speed."""
        if self.count == 0 or self.n == 0:
            return np.full(self.n, np.nan), np.full(self.n, np.nan)
        recent = self._positions(self.count - self.window)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows are expected
            ratio = np.nanmedian(self.ratio[:, recent], axis=1)
            late = np.nanmean(self.late[:, recent], axis=1)
            ft = np.nanmedian(self.f_norm[recent])
        score = np.where(np.isfinite(ratio), 1.0 / ratio, np.nan)
        if not np.isfinite(ft) or ft <= 0:
            return score, late
        lat_score = 1.0 - np.clip(late / ft, 0, 0.99)
        score = np.where(np.isfinite(score), score, lat_score)
        return score, late
