"""Slow links and NICs from per-communicator bus bandwidth, localised by intersection.

In a collective every member waits for the slowest link of its ring, so a slow NIC or cable
shows up as low bus bandwidth (message size x bus factor / transfer time, where the transfer time
is the last arriver's duration) of every communicator whose ring crosses it — and as nothing in
compute time. This is the idea behind Alibaba C4's communication "syndromes": a host whose every
cross-host communicator is slow has a slow NIC; a ring edge present in every slow communicator and
in no healthy one is a slow link between two hosts. When several edges are equally suspect,
passive data cannot separate them and the finding says so (active probes can, later).

Each communicator is compared with two references, and must be slow against both:
its own fastest sustained bandwidth (the best 10-frame median in recent history, so a fault does
not become the norm) and the fast end (80th percentile) of communicators of the same kind and size.
"""

from __future__ import annotations

import warnings
from collections import deque
from dataclasses import dataclass

import numpy as np

from detectors.busbw import bus_bandwidth
from detectors.types import Frame, JobShape


@dataclass(frozen=True, slots=True)
class LinkScores:
    busbw: np.ndarray  # (n_comms,) bytes/s in this frame, NaN without data
    ratio: np.ndarray  # (n_comms,) busbw / reference (the worse of own and peer references)
    slow: np.ndarray  # (n_comms,) bool
    elevated: np.ndarray  # (n_comms,) bool, relaxed threshold
    host_slow_fraction: np.ndarray  # (n_hosts,) slow cross-host comms / cross-host comms with data
    suspects: dict[str, tuple[tuple[str, ...], float, tuple[tuple[str, str], ...]]]
    # subject -> (hosts, transfer slowdown, candidate edges)


class LinkDetector:
    """Scores one frame's communicators and proposes NIC / host-pair suspects."""

    def __init__(
        self,
        *,
        slow_ratio: float = 0.85,
        relax: float = 0.5,
        nic_fraction: float = 0.8,
        block: int = 10,
        history_blocks: int = 50,
    ) -> None:
        if not 0 < slow_ratio < 1:
            raise ValueError("slow_ratio must be in (0, 1)")
        self.slow_ratio = slow_ratio
        self.relaxed_ratio = 1.0 - (1.0 - slow_ratio) * relax
        self.nic_fraction = nic_fraction
        self.block = block
        self.history_blocks = history_blocks
        self._current: list[np.ndarray] = []
        self._blocks: deque[np.ndarray] = deque(maxlen=history_blocks)

    def baseline(self, n_comms: int) -> np.ndarray:
        """Per comm: the fastest sustained bus bandwidth seen (NaN when never seen)."""
        if not self._blocks:
            return np.full(n_comms, np.nan)
        stacked = np.full((len(self._blocks), n_comms), np.nan)
        for i, b in enumerate(self._blocks):
            stacked[i, : min(b.size, n_comms)] = b[:n_comms]
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # comms never seen: all-NaN columns
            return np.where(np.isfinite(stacked).any(axis=0), np.nanmax(stacked, axis=0), np.nan)

    def learn(self, busbw: np.ndarray) -> None:
        self._current.append(busbw)
        if len(self._current) >= self.block:
            n = max(a.size for a in self._current)
            m = np.full((len(self._current), n), np.nan)
            for i, a in enumerate(self._current):
                m[i, : a.size] = a

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                self._blocks.append(np.nanmedian(m, axis=0))
            self._current = []

    def score(self, frame: Frame, shape: JobShape) -> LinkScores:
        n_comms = min(frame.comm_bytes.size, shape.comm_kind.size)
        cross = np.array([len(h) >= 2 for h in shape.comm_hosts[:n_comms]], dtype=bool)
        busbw = bus_bandwidth(
            frame.comm_bytes[:n_comms], np.ones(n_comms), frame.comm_transfer[:n_comms]
        )
        busbw = np.where(cross & (frame.comm_calls[:n_comms] > 0), busbw, np.nan)
        own = self.baseline(n_comms)
        peer = np.full(n_comms, np.nan)
        keys = shape.comm_kind[:n_comms] * 1_000_003 + shape.comm_size[:n_comms]
        for key in np.unique(keys[np.isfinite(busbw)]):
            sel = (keys == key) & np.isfinite(busbw)
            if sel.sum() >= 3:
                peer[keys == key] = np.percentile(busbw[sel], 80)
        with np.errstate(divide="ignore", invalid="ignore"):
            r_own = busbw / own
            r_peer = busbw / peer
        ratio = np.fmin(
            np.where(np.isfinite(r_own), r_own, np.nan),
            np.where(np.isfinite(r_peer), r_peer, np.nan),
        )
        known = np.isfinite(ratio)
        # slow against every reference it has
        slow = (
            known
            & np.where(np.isfinite(r_own), r_own < self.slow_ratio, True)
            & np.where(np.isfinite(r_peer), r_peer < self.slow_ratio, True)
        )
        elevated = known & (ratio < self.relaxed_ratio)
        self.learn(busbw)
        host_frac, suspects = self._localise(shape, n_comms, busbw, slow, own)
        return LinkScores(busbw, ratio, slow, elevated, host_frac, suspects)

    def _localise(
        self, shape: JobShape, n_comms: int, busbw: np.ndarray, slow: np.ndarray, own: np.ndarray
    ) -> tuple[np.ndarray, dict[str, tuple[tuple[str, ...], float, tuple[tuple[str, str], ...]]]]:
        n_hosts = shape.n_hosts
        with_data = [c for c in range(n_comms) if np.isfinite(busbw[c])]
        host_total = np.zeros(n_hosts)
        host_slow = np.zeros(n_hosts)
        edge_total: dict[tuple[int, int], int] = {}
        edge_slow: dict[tuple[int, int], int] = {}
        for c in with_data:
            for h in shape.comm_hosts[c]:
                host_total[h] += 1
                host_slow[h] += slow[c]
            for e in shape.comm_edges[c]:
                edge_total[e] = edge_total.get(e, 0) + 1
                edge_slow[e] = edge_slow.get(e, 0) + int(slow[c])
        with np.errstate(divide="ignore", invalid="ignore"):
            host_frac = np.where(host_total > 0, host_slow / host_total, np.nan)
        suspects: dict[str, tuple[tuple[str, ...], float, tuple[tuple[str, str], ...]]] = {}
        slow_comms = [c for c in with_data if slow[c]]
        if not slow_comms:
            return host_frac, suspects

        def slowdown(comms: list[int]) -> float:
            vals = [own[c] / busbw[c] for c in comms if np.isfinite(own[c]) and busbw[c] > 0]
            return float(np.median(vals)) if vals else float("nan")

        nics = [
            h for h in range(n_hosts) if host_slow[h] >= 1 and host_frac[h] >= self.nic_fraction
        ]
        explained = {c for c in slow_comms if any(h in shape.comm_hosts[c] for h in nics)}
        for h in nics:
            comms = [c for c in slow_comms if h in shape.comm_hosts[c]]
            suspects[f"host:{shape.hosts[h]}"] = ((shape.hosts[h],), slowdown(comms), ())
        rest = [c for c in slow_comms if c not in explained]
        if rest:
            common = set.intersection(*(set(shape.comm_edges[c]) for c in rest))
            edges = sorted(
                e for e in common if edge_slow.get(e, 0) / edge_total.get(e, 1) >= self.nic_fraction
            )
            if edges:
                names = tuple((shape.hosts[a], shape.hosts[b]) for a, b in edges)
                hosts = tuple(sorted({h for pair in names for h in pair}))
                subject = "link:" + ",".join(f"{a}|{b}" for a, b in names)
                suspects[subject] = (hosts, slowdown(rest), names)
        return host_frac, suspects
