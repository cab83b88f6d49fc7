"""A rank judged against its own history, with hysteresis (issue 16).

Peer comparison says a rank is slower than its role peers; many real ranks are, by a few
percent, for hours, and the difference wanders. What makes an incident is a *change*: the
rank's compute ratio (against its peers, per unit of work) rising by ``compute_ratio`` over its
own normal -- or standing far above its peers (``static_ratio``), which is never normal. Its
normal (an EWMA, :meth:`FrameHistory.learn_own_ratio`) is learned from every frame near it, so it
follows slow drift but not a jump; back within half the rise, the rank is at home again
(hysteresis). An open slow GPU stays elevated while it computes slower per unit of work than its
normal, late or not, and beyond the job's noise: a rebalance that hides its lateness does not
resolve it; its recovery does (also where the compute ratio jitters by tens of percent, as in a
small pipeline whose ranks mostly wait).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class OwnVerdict:
    suspect: np.ndarray  # peers' suspect, confirmed by a change against its own normal
    strong: np.ndarray
    elevated: np.ndarray  # hysteresis: not back within half the change (or still slow, open)
    learn: np.ndarray  # frames from which its own normal is learned


def judge(
    ratio: np.ndarray,
    own: np.ndarray,
    *,
    suspect: np.ndarray,
    strong: np.ndarray,
    elevated: np.ndarray,
    is_open: np.ndarray,
    compute_ratio: float,
    static_ratio: float,
    beyond_noise: np.ndarray | None = None,
    standout: np.ndarray | None = None,
) -> OwnVerdict:
    """Per rank: the peers' verdict (``suspect``, ``strong``, ``elevated``) against its own
    normal ``own`` (NaN: none yet, learned from the first frame). ``beyond_noise``: its ratio
    stands out of the job's noise (None: always). ``standout``: its ratio is past the threshold
    and far out of the noise; a rank that also changed against its own normal is suspect on
    the relaxed lateness (``elevated``): its peers wait for it at least half the usual share
    (a 1.1x GPU in 5% noise makes them wait 1-4% of a step, frame by frame)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        change = ratio / own
        changed = np.isnan(change) | (change >= compute_ratio)
        big = ratio >= static_ratio
        at_home = change < 1.0 + (compute_ratio - 1.0) / 2
        far = ratio >= 1.0 + (static_ratio - 1.0) / 2
        still_slow = is_open & (change >= compute_ratio)
        if beyond_noise is not None and beyond_noise.shape == still_slow.shape:
            still_slow &= beyond_noise
    if standout is not None and standout.shape == suspect.shape:
        with np.errstate(invalid="ignore"):
            suspect = suspect | (elevated & standout & (change >= compute_ratio))
    return OwnVerdict(
        suspect=suspect & (changed | big),
        strong=strong & (changed | big),
        elevated=(elevated & (np.isnan(change) | ~at_home | far)) | still_slow,
        learn=np.isfinite(ratio) & ~is_open & (np.isnan(own) | at_home),
    )
