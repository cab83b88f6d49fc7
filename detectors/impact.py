"""What a condition costs the job: its share of the job's critical path.

A synchronous job's step ends when its slowest rank is done: every other rank waits for it in the
next collective (data parallel) or the next send (pipeline). The step time a culprit is
responsible for is therefore the step time now against the step time the same frames would have
had without the culprit's excess: its compute beyond what its role peers need for the same work
(``compute - compute / ratio``), less the largest such excess of any other rank (that rank would
then set the pace: of two slow GPUs, each is credited only with what it adds beyond the other).
Excess, not raw compute, is compared across ranks: a pipeline stage's "compute" (step time minus
time in communication) also holds its bubbles, which differ by stage by design. Measured from
the same frames, so it holds for a condition present since the job began (no healthy "before"
exists) and for one of two concurrent faults.

In a data-parallel job that is exact up to noise; in a pipeline it leans high (a healthy rank
idles in the pipeline's bubbles, a slow first stage absorbs them): the OSDI'25 trace AR's 2.4x
stage-0 rank reads 2.5x where the paper's what-if replay says 1.97x. The time peers were seen
waiting for the culprit (lateness) stands in only where compute is not observable (jobs without
step records): it is measured against the typical peer, not the next slowest, so with another
slow rank it also holds what that one costs anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from failslow.detectors.robust import quiet_nan

# a step is never credited with more than this share of itself: the rest is the work any rank does
MAX_SHARE = 0.95
MIN_BEFORE = 5  # frames before an onset that bound what the condition can cost


@dataclass(frozen=True, slots=True)
class Impact:
    """Medians over the frames used."""

    step_s: float  # the job's step time
    without_s: float  # the step time without the culprit's excess
    excess_s: float  # the culprit's compute beyond what its peers need, per step

    @property
    def ratio(self) -> float:
        """The job's step time against what it would be without the culprit (1.0: no cost)."""
        if np.isfinite(self.step_s) and np.isfinite(self.without_s) and self.without_s > 0:
            return self.step_s / self.without_s
        return float("nan")


def critical_path(
    step: np.ndarray,
    compute: np.ndarray,
    ratio: np.ndarray,
    late: np.ndarray,
    culprit: np.ndarray,
    *,
    planned: bool = False,
    before: np.ndarray | None = None,
) -> Impact:
    """The culprit's share of the job's step time, per frame, then the median over frames.

    ``step``: (k,) job step time per frame (NaN: unknown). ``compute``, ``ratio``, ``late``: (n, k)
    per rank slot and frame: compute seconds, compute against role peers, lateness seconds.
    ``culprit``: (n,) bool, the slots of the condition (a GPU's one, a node's ranks).
    ``planned``: a plan gives the ranks unequal work now; compute and ratios are then per unit
    of work, which says how slow the culprit is but not what it costs (its share was cut and the
    others carry more), so the time its peers wait for it measures the cost.
    ``before``: the job's step times in the frames before the condition's onset, where it has
    one: the job's step time cannot have grown by more for it than it grew at all (a last-stage
    rank 1.5x slow inside a pipeline's bubbles costs nothing, whatever its excess).
    """
    nan = float("nan")
    if step.size == 0 or not culprit.any():
        return Impact(nan, nan, nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        excess = compute - compute / np.where(ratio > 0, ratio, np.nan)  # (n, k)
        excess = np.clip(excess, 0.0, None)
        own = quiet_nan(np.nanmax, excess[culprit], axis=0)
        rest = excess[~culprit]
        other = quiet_nan(np.nanmax, rest, axis=0) if rest.shape[0] else np.zeros(step.size)
        extra = np.clip(own - np.nan_to_num(other, nan=0.0), 0.0, None)
        waited = np.clip(quiet_nan(np.nanmax, late[culprit], axis=0), 0.0, None)
        # lateness only where compute is unknown: it is measured against the typical peer, so
        # with another slow rank it also holds what that one costs anyway
        known = np.isfinite(extra) & (not planned)
        saved = np.fmin(np.where(known, extra, waited), MAX_SHARE * step)
    ok = np.isfinite(step) & np.isfinite(saved)
    if not ok.any():
        return Impact(quiet_nan(np.nanmedian, step), nan, nan)
    now = float(np.median(step[ok]))
    without = float(np.median(step[ok] - saved[ok]))
    if before is not None and np.isfinite(before).sum() >= MIN_BEFORE:
        without = max(without, min(now, float(np.nanmedian(before))))
    return Impact(now, without, float(quiet_nan(np.nanmedian, extra[ok])))


def job_time_lost(seconds: float, slowdown: float | None, *, hang: bool) -> float:
    """Job time a condition lasting ``seconds`` cost: all of it for a hang, the share of each
    step its subject added (``1 - 1/slowdown``) else."""
    elapsed = max(0.0, seconds)
    if hang:
        return elapsed
    return elapsed * (1.0 - 1.0 / slowdown) if slowdown is not None and slowdown > 1 else 0.0


def impact(slowdown: float, attributed: float | None) -> float:
    """What a condition costs the job, for its severity: its critical-path share where measured,
    else the job's slowdown against its baseline (links; no step records)."""
    if attributed is not None and np.isfinite(attributed):
        return attributed
    return slowdown if slowdown is not None and np.isfinite(slowdown) else float("nan")
