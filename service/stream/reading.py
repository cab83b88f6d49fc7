"""What the rest of the service may read of detection: one small interface.

Job views, metrics, the mitigation engine and its outcome measurements read detection results
through :class:`DetectionReader` only (detection implements it and takes its own locks), never
through detection's internals. It is defined here, next to the shapes handed *to* detection, so
that readers below detection (``jobs``) can use it without importing detection.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import numpy as np


class JobStateName(StrEnum):
    """A job's state as readers see it (spec section 2)."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"  # an open slow incident
    HUNG = "hung"  # an open hang
    STALE = "stale"  # no envelope for longer than the staleness timeout


class RankState(StrEnum):
    OK = "ok"
    SLOW = "slow"
    HUNG = "hung"
    STALE = "stale"  # no recent telemetry: missing data is not failure


@dataclass(frozen=True, slots=True)
class JobNumbers:
    """A job as detection sees it now."""

    frames: int  # frames (steps) analysed
    step: int | None  # newest step analysed (None for time frames)
    step_time_s: float | None  # recent median step time
    baseline_step_time_s: float | None  # healthy step time
    slowdown: float | None  # step time / baseline
    open_subjects: tuple[tuple[str, str], ...]  # (kind, subject) of each open condition


class DetectionReader(Protocol):
    def numbers(self, job: str) -> JobNumbers | None:
        """None while detection has not seen the job."""
        ...

    def frame_times(self, job: str, *, since_step: int | None, last: int) -> list[float]:
        """Step times of the newest ``last`` frames from step ``since_step`` on."""
        ...

    def rank_scores(self, job: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Per rank slot ``(score, lateness_s)``: 1.0 = typical speed, NaN = unknown."""
        ...

    def rank_speed(self, job: str) -> np.ndarray | None:
        """Per rank slot, compute speed per unit of work against any of its role peers."""
        ...

    def work_shares(self, job: str) -> list[int] | None:
        """The micro-batch shares the detectors compare compute against (None: equal)."""
        ...

    def jobs_with_shares(self) -> list[str]:
        """Jobs whose detectors follow unequal shares (a rebalanced plan)."""
        ...
