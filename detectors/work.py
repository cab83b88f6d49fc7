"""Work per step (issue 16): where ranks report how much work their step had (tokens, samples:
variable sequence lengths, MoE imbalance), compute is compared per unit of work and the job's
step time at its usual work."""

from __future__ import annotations

from collections import deque

import numpy as np

from failslow.detectors.robust import MAD_SCALE
from failslow.detectors.types import Frame


def reported_work(frame: Frame) -> np.ndarray | None:
    """Each rank's reported work relative to the frame's median (issue 16: variable sequence
    lengths, MoE imbalance), or None unless every rank with a step in the frame reported it."""
    w = frame.work
    if w.shape != (frame.n,):
        return None
    present = np.isfinite(frame.step_time)
    if not present.any() or not np.isfinite(w[present]).all():
        return None
    mid = float(np.median(w[present]))
    if not mid > 0:
        return None
    return np.where(present, w / mid, np.nan)


def unequal_work(frame: Frame) -> bool:
    """Every rank reported its work and it differs by more than 2% across the job."""
    w = reported_work(frame)
    if w is None:
        return False
    w = w[np.isfinite(w)]
    return bool(w.size) and float(w.max()) > 1.02 * float(w.min())


class JobWork:
    """The job's step time at its usual work, learned from its recent frames."""

    def __init__(self) -> None:
        # (the most work any rank reported, the step time) of recent frames: the job's usual
        # work and how its step time grows with work
        self._job_work: deque[tuple[float, float]] = deque(maxlen=200)
        self._usual_work = float("nan")  # fixed once 20 frames are known: the yardstick

    def at_usual_work(self, frame: Frame, frame_time: float) -> float:
        """The job's step time at its usual work (ResiHP's idea: predict the step time from the
        data). A synchronous job waits for its largest batch, and only its compute grows with
        it: a line ``time = a + b x most work`` is fitted to the last 200 frames (refitted
        without frames 3 robust spreads above it, so a slowdown under way does not bend it), and
        the step time is scaled by the line at the usual work (the median of the first 20
        frames', then fixed: a yardstick that wandered with the data would carry the scaled times
        with it) against the line at this frame's. Until 20 frames are known, by the work alone.
        A step of long sequences is thus not a job slowdown, nor one of short sequences a fast
        baseline."""
        if not frame.has_steps or frame.work.shape != (frame.n,) or not np.isfinite(frame_time):
            return frame_time
        present = np.isfinite(frame.step_time)
        if not present.any() or not np.isfinite(frame.work[present]).all():
            return frame_time
        most = float(frame.work[present].max())
        if not most > 0:
            return frame_time
        self._job_work.append((most, frame_time))
        pairs = np.array(self._job_work)
        w, t = pairs[:, 0], pairs[:, 1]
        if len(pairs) < 20:
            return frame_time * float(np.median(w)) / most
        if np.isnan(self._usual_work):
            self._usual_work = float(np.median(w))
        usual = self._usual_work
        if float(w.std()) <= 0.01 * float(np.median(w)):
            return frame_time * usual / most
        b, a = np.polyfit(w, t, 1)
        resid = t - (a + b * w)
        spread = max(MAD_SCALE * float(np.median(np.abs(resid - np.median(resid)))), 1e-12)
        keep = resid <= np.median(resid) + 3 * spread
        if keep.sum() >= 10:
            b, a = np.polyfit(w[keep], t[keep], 1)
        b = max(float(b), 0.0)
        a = float(np.median(t[keep] - b * w[keep]))
        at_most, at_usual = a + b * most, a + b * usual
        if not (at_most > 0 and at_usual > 0):
            return frame_time * usual / most
        return frame_time * at_usual / at_most
