"""Chronic or new: was a slow rank (or host) already slow in its first frames?

A rank that has run slower than its peers since the job began has no onset: whatever step a
change-point search picks in its signal is a change of its peers (they got faster, the ranking
shifted), not the start of its fault. Such a condition is reported as chronic: dated at the
rank's first frame, said to be there "since the job began", costed like any other
(``detectors/impact.py``). A rank that was healthy at first and is slow now has an onset; so has
a chronic rank that got much slower (a new fault on an old weakness).

Evidence: each rank's first ``history.EARLY`` frames after the job's warm-up, kept for good
(``FrameHistory.early_ratio``/``early_elevated``).
"""

from __future__ import annotations

import numpy as np

from failslow.detectors.findings import OpenCondition
from failslow.detectors.history import FrameHistory
from failslow.detectors.robust import quiet_nan

SLOW_SHARE = 0.7  # of its early frames a chronic rank was slow in (its first one included)
MIN_EARLY = 3  # early frames needed to judge


def chronic(
    early_ratio: np.ndarray,
    early_elevated: np.ndarray,
    recorded: int,
    now_ratio: float,
    compute_ratio: float,
) -> bool:
    """``early_ratio``/``early_elevated``: (members, EARLY) of the subject's ranks (one for a
    GPU, a host's for a node); ``recorded``: how many early frames exist; ``now_ratio``: the
    subject's compute against its peers now; ``compute_ratio``: the detection threshold.

    Chronic when, in the median member, the first early frame and at least ``SLOW_SHARE`` of
    them were slow (elevated, or compute at least halfway to the threshold above its peers), and
    it is not much slower now than then (at most twice its early excess plus the threshold's)."""
    k = min(recorded, early_ratio.shape[1])
    if k < MIN_EARLY or early_ratio.shape[0] == 0:
        return False
    ratio, elevated = early_ratio[:, :k], early_elevated[:, :k]
    with np.errstate(invalid="ignore"):
        slow = elevated | (ratio >= 1.0 + (compute_ratio - 1.0) / 2.0)
    first = float(np.median(slow[:, 0]))
    share = float(np.median(slow.mean(axis=1)))
    if first < 0.5 or share < SLOW_SHARE:
        return False
    then = quiet_nan(np.nanmedian, ratio)
    if not np.isfinite(then) or not np.isfinite(now_ratio):
        return True  # no compute to compare (lateness only): slow then and now
    return bool(now_ratio - 1.0 <= 2.0 * max(then - 1.0, 0.0) + (compute_ratio - 1.0))


def date_chronic(info: OpenCondition, hist: FrameHistory, members: tuple[int, ...],
                 compute_ratio: float) -> bool:  # fmt: skip
    """Re-date a condition that just opened at its subject's first frame if it is chronic
    (``info.extra["chronic"]``); returns whether it is."""
    slots = [m for m in members if 0 <= m < hist.n and hist.first_pos[m] >= 0]
    if not slots:
        return False
    recent = hist.positions(hist.count - hist.window)
    now = quiet_nan(
        np.nanmedian, np.fmax(hist.ratio[slots][:, recent], hist.cross[slots][:, recent])
    )
    start = int(min(hist.first_pos[slots]))
    recorded = hist.count - max(start, hist.warmup)
    if not chronic(hist.early_ratio[slots], hist.early_elevated[slots], recorded, now,
                   compute_ratio):  # fmt: skip
        return False
    first = slots[int(np.argmin(hist.first_pos[slots]))]
    info.onset_pos = start
    info.onset_index = int(hist.first_index[first])
    info.onset_ns = int(hist.first_ns[first])
    info.extra["chronic"] = True
    return True
