"""Jobs whose compute is unobservable: lateness is then the only signal of a slow GPU.

A rank's compute is its step time minus its time inside communication. Where communication all
but fills the step (FSDP's prefetched all-gathers, DTensor's and DDP's asynchronous collectives
overlapping the compute), that difference is unknown, not near zero. A job whose compute is
known for under half its ranks (:class:`Observability`, smoothed over about 50 frames, none in
which the job waits half a step or more for a late rank: its peers' communication then fills
their steps with waiting, not overlap) is *blind*; :mod:`~failslow.detectors.straggler` then
judges its ranks on lateness against their pooled noise, also averaged over the last ``ROLL``
frames (:class:`RollingLateness`: a rank late by a little in every frame stands out as one late
by a lot in one), and takes as the straggler only a rank that waits *least* inside communication
(:func:`waits_least`: C4's syndrome; both ends of a slow link wait longer than their peers).
:func:`on_slow_nic` lets a host whose cross-host communicators are slow explain its ranks'
lateness (the conditions' fusion).

Measured in the fault lab's FSDP2 x TP x PP job (8 ranks on 2 cores, docs/lab.md): judged frame
by frame on lateness alone, its ranks took turns being 6-20% late and raised 8 false slow GPUs in
200 healthy steps, and a throttled NIC was read as a slow GPU.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from failslow.detectors.robust import quiet_nan

UNOBSERVABLE = 0.9  # communication over this share of a step leaves its compute unknown
ROLL = 5  # frames over which a blind job's ranks' lateness is also averaged
OBSERVABLE_PULL = 0.02  # smoothing of the share of ranks whose compute is known
BLIND_BELOW = 0.5  # a job whose compute is known for under this share of its ranks is blind
# a rank late by this share of a step keeps its peers waiting in communication for it: such a
# frame is no sample of the job's observability (a straggler's peers' compute is not overlapped)
WAITED = 0.5


def unobservable(step_time: np.ndarray, comm_time: np.ndarray) -> np.ndarray:
    """Per rank: does communication fill so much of its step that its compute is unknown?"""
    with np.errstate(invalid="ignore"):
        return comm_time >= UNOBSERVABLE * step_time


class Observability:
    """The share of a job's ranks whose compute is known: the mean of its first 50 frames,
    then smoothed over about as many."""

    def __init__(self) -> None:
        self.share = 1.0
        self.frames = 0

    def update(self, known: np.ndarray) -> bool:
        """``known``: per present rank, whether its compute is known; returns "blind"."""
        if known.size:
            self.frames += 1
            pull = max(OBSERVABLE_PULL, 1.0 / self.frames)
            self.share += pull * (float(known.mean()) - self.share)
        return self.share < BLIND_BELOW


class RollingLateness:
    """z of each rank's mean excess lateness over the last ``ROLL`` frames."""

    def __init__(self) -> None:
        self._recent: deque[np.ndarray] = deque(maxlen=ROLL)

    def z(self, excess: np.ndarray, spread: float) -> np.ndarray:
        """Of the last ``ROLL`` frames at least ``ROLL - 2`` must have judged the rank (not held
        up by a pipeline neighbour, present); -inf otherwise, or while the noise is unknown."""
        self._recent.append(np.asarray(excess, dtype=np.float64))
        n = excess.shape[0]
        if len(self._recent) < ROLL or not np.isfinite(spread):
            return np.full(n, -np.inf)
        stack = np.full((ROLL, n), np.nan)
        for i, r in enumerate(self._recent):
            stack[i, : min(n, r.size)] = r[:n]
        have = np.isfinite(stack).sum(axis=0)
        mean = quiet_nan(np.nanmean, stack, axis=0)
        z = mean / (spread / np.sqrt(np.maximum(have, 1)))
        return np.where(np.isfinite(mean) & (have >= ROLL - 2), z, -np.inf)


def waits_least(comm_ratio: np.ndarray) -> np.ndarray:
    """Per rank: does it spend no more time inside communication than its role peers?
    (``comm_ratio``: its time / its peers', NaN where it has none: no evidence against it)."""
    with np.errstate(invalid="ignore"):
        return (comm_ratio <= 1.0) | np.isnan(comm_ratio)


def on_slow_nic(host: np.ndarray, slow_fraction: np.ndarray) -> np.ndarray:
    """Per rank: do most cross-host communicators of its host look slow in this frame?"""
    out = np.zeros(host.size, dtype=bool)
    ok = (host >= 0) & (host < slow_fraction.size)
    out[ok] = np.nan_to_num(slow_fraction[host[ok]], nan=0.0) >= 0.5
    return out
