"""Registries of detectors, so that one conformance suite runs over every one of them.

* Series detectors follow river's streaming interface: ``learn_one(x) -> None`` mutates,
  ``score_one() -> float | None`` is pure (``None`` while warming up), higher = more changed.
* Peer detectors score the members of a job for one frame:
  ``suspects(frame, shape) -> np.ndarray`` of booleans per rank slot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from failslow.detectors.changepoint import BOCPD, OnlineChangeDetector
from failslow.detectors.defaults import DEFAULTS
from failslow.detectors.straggler import PeerLatenessDetector, node_scores
from failslow.detectors.types import Frame, JobShape


class SeriesDetector(Protocol):
    def learn_one(self, x: float) -> None: ...

    def score_one(self) -> float | None: ...


class PeerDetector(Protocol):
    def suspects(self, frame: Frame, shape: JobShape) -> np.ndarray: ...


class BOCPDSeries:
    """One series through :class:`BOCPD`; the score is P(a change within the last 5 samples)."""

    def __init__(self, **params: Any) -> None:
        self.bocpd = BOCPD(1, **params)

    def learn_one(self, x: float) -> None:
        self.bocpd.update(np.array([x], dtype=np.float64))

    def score_one(self) -> float | None:
        if self.bocpd.count[0] < 3:
            return None
        return float(self.bocpd.recent_change_probability(5)[0])


class ChangePointSeries:
    """:class:`OnlineChangeDetector`: the score is 1.0 once a change point is confirmed in the
    last ``window`` samples, else BOCPD's recent-change probability."""

    def __init__(self, window: int = 20, **params: Any) -> None:
        self.det = OnlineChangeDetector(**params)
        self.window = window

    def learn_one(self, x: float) -> None:
        self.det.update(x)

    def score_one(self) -> float | None:
        if self.det.t < 3:
            return None
        if any(self.det.t - p.index <= self.window for p in self.det.points):
            return 1.0
        return float(self.det.bocpd.recent_change_probability(5)[0])


class PeerLateness:
    def __init__(self, **params: Any) -> None:
        self.det = PeerLatenessDetector(**params)

    def suspects(self, frame: Frame, shape: JobShape) -> np.ndarray:
        return self.det.score(frame, shape.groups).suspect


class SlowNode:
    """Ranks of hosts whose majority is slow against cross-host peers."""

    def __init__(
        self,
        late_fraction: float = DEFAULTS.late_fraction,
        compute_ratio: float = DEFAULTS.compute_ratio,
    ) -> None:
        self.peer = PeerLatenessDetector(late_fraction=late_fraction, compute_ratio=compute_ratio)
        self.late_fraction = late_fraction
        self.compute_ratio = compute_ratio

    def suspects(self, frame: Frame, shape: JobShape) -> np.ndarray:
        s = self.peer.score(frame, shape.groups)
        nodes = node_scores(
            frame, s, shape, late_fraction=self.late_fraction, compute_ratio=self.compute_ratio
        )
        host = shape.host_of_slot[: frame.n]
        return np.isin(host, np.flatnonzero(nodes.suspect)) & (host >= 0)


SERIES: dict[str, Callable[[], SeriesDetector]] = {
    "bocpd": BOCPDSeries,
    "online_changepoint": ChangePointSeries,
}
PEER: dict[str, Callable[[], PeerDetector]] = {
    "peer_lateness": PeerLateness,
    "slow_node": SlowNode,
}
