"""Slow links and NICs from per-communicator bus bandwidth, localised by intersection.

In a collective every member waits for the slowest link of its ring, so a slow NIC or cable
shows up as low bus bandwidth (message size x bus factor / transfer time, where the transfer time
is the last arriver's duration) of every communicator whose ring crosses it — and as nothing in
compute time. This is the idea behind Alibaba C4's communication "syndromes": a host whose every
cross-host communicator is slow has a slow NIC; a ring edge present in every slow communicator and
in no healthy one is a slow link between two hosts. Under a single-fault assumption the component
chosen is the one whose communicators best match the slow ones (F1). When several edges are
equally suspect, passive data cannot separate them and the finding says so (active probes can,
later).

Each communicator is compared with two references, and must be slow against both:
its own fastest sustained bandwidth (the best 10-frame median in recent history, so a fault does
not become the norm) and the fast end (80th percentile) of communicators of the same kind and size.
Every communicator must also fall outside its own noise: ``z`` robust spreads (median/MAD of log
bandwidth over its last ``noise_frames`` frames, outliers not learnt) below its median; small
collectives on busy hosts jitter by far more than 15%, and one fast block would otherwise make
every later frame look slow. Until its noise is known (``min_noise_frames`` frames of data) a
communicator is not judged. The median and spread are refreshed every ``refresh_frames`` frames.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from failslow.detectors.busbw import bus_bandwidth
from failslow.detectors.defaults import DEFAULTS
from failslow.detectors.localise import (
    Evidence,
    LinkSuspect,
    crossing,
    host_fraction,
    localise,
)
from failslow.detectors.robust import nanmedian_rows
from failslow.detectors.types import SEND_RECV_KINDS, Frame, JobShape
from failslow.detectors.vocab import Subject


@dataclass(frozen=True, slots=True)
class LinkScores:
    busbw: np.ndarray  # (n_comms,) bytes/s in this frame, NaN without data
    ratio: np.ndarray  # (n_comms,) busbw / reference (the worse of own and peer references)
    slow: np.ndarray  # (n_comms,) bool
    elevated: np.ndarray  # (n_comms,) bool, relaxed threshold
    host_slow_fraction: np.ndarray  # (n_hosts,) slow cross-host comms / cross-host comms with data
    beyond_noise: np.ndarray  # (n_comms,) bool: has peers, or is outside its own noise
    suspects: dict[Subject, LinkSuspect]
    # a host (its NIC) or host pairs -> (hosts, transfer slowdown, candidate edges)


class LinkDetector:
    """Scores one frame's communicators and proposes NIC / host-pair suspects."""

    def __init__(
        self,
        *,
        slow_ratio: float = DEFAULTS.link_ratio,
        min_cost: float = DEFAULTS.link_cost,
        relax: float = 0.5,
        nic_fraction: float = 0.8,
        block: int = 10,
        history_blocks: int = 50,
    ) -> None:
        if not 0 < slow_ratio < 1:
            raise ValueError("slow_ratio must be in (0, 1)")
        self.slow_ratio = slow_ratio
        self.min_cost = min_cost
        self.relax = relax
        self.relaxed_ratio = 1.0 - (1.0 - slow_ratio) * relax
        self.nic_fraction = nic_fraction
        self.min_fit = 0.8  # F1 below which no single component explains the slow communicators
        self.block = block
        self.history_blocks = history_blocks
        self._current: list[np.ndarray] = []
        self._blocks: deque[np.ndarray] = deque(maxlen=history_blocks)
        self.z = 3.0
        self.noise_frames = 200
        self.min_noise_frames = 20
        self.min_log_spread = 0.02
        self.refresh_frames = 20
        # per comm, a ring of its log busbw (float32: spreads are >= 0.02, far above its 1e-7
        # resolution); a comm's window is one contiguous row
        self._log: np.ndarray = np.full((0, self.noise_frames), np.nan, dtype=np.float32)
        self._log_n = 0
        self._count = np.zeros(0, dtype=np.int64)  # finite entries of each comm's window
        self._med = np.zeros(0)  # median log busbw of each comm's window (NaN: not yet)
        self._count_at = np.zeros(0, dtype=np.int64)  # its window's size when computed
        self._spread = np.zeros(0)  # its robust spread
        self._baseline: np.ndarray | None = None  # baseline() of the blocks so far

    def _noise_z(self, busbw: np.ndarray, parent: np.ndarray) -> np.ndarray:
        """Per comm: robust spreads below its own median log bandwidth (NaN while unknown);
        then remembers this frame. A re-created comm starts from its predecessor's history.

        The median and spread of each comm's window are kept, not recomputed every frame: a
        comm's are computed when it first has ``min_noise_frames`` frames, then refreshed every
        ``refresh_frames`` frames (a 1/``refresh_frames`` share of the comms per frame) and
        whenever its window grew by a tenth since (while it fills), so they never lag its
        window by more than a tenth of it — and a frame costs O(comms), not O(comms x
        window), which at 100K ranks was most of the detection time."""
        n = busbw.size
        if self._log.shape[0] < n:
            self._grow_log(n, parent)
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.log(np.where(busbw > 0, busbw, np.nan))
        count = self._count[:n]
        new = np.flatnonzero(
            (count >= self.min_noise_frames)
            & (np.isnan(self._med[:n]) | (10 * count >= 11 * self._count_at[:n]))
        )
        due = np.arange((-self._log_n) % self.refresh_frames, n, self.refresh_frames)
        due = due[count[due] >= self.min_noise_frames]
        if new.size:
            due = np.union1d(due, new)
        if due.size:
            self._refresh(due)
        with np.errstate(invalid="ignore"):
            z = (self._med[:n] - x) / self._spread[:n]
        z[count < self.min_noise_frames] = np.nan
        # outliers are not learnt: a lasting fault must not become the noise (or the median)
        row = np.where(np.nan_to_num(z, nan=-np.inf) >= self.z, np.nan, x)
        p = self._log_n % self.noise_frames
        self._count -= np.isfinite(self._log[:, p])  # the frame that leaves the window
        self._log[:n, p] = row
        self._log[n:, p] = np.nan
        self._count[:n] += np.isfinite(self._log[:n, p])
        self._log_n += 1
        return z

    def _grow_log(self, n: int, parent: np.ndarray) -> None:
        old = self._log.shape[0]
        grown = np.full((n, self.noise_frames), np.nan, dtype=self._log.dtype)
        grown[:old] = self._log
        for c in range(old, n):
            p = int(parent[c]) if c < parent.size else -1
            if 0 <= p < old:
                grown[c] = self._log[p]
        self._log = grown
        self._count = np.isfinite(grown).sum(axis=1)
        self._med = np.concatenate([self._med, np.full(n - old, np.nan)])
        self._count_at = np.concatenate([self._count_at, np.zeros(n - old, dtype=np.int64)])
        self._spread = np.concatenate([self._spread, np.full(n - old, np.nan)])

    def _refresh(self, cols: np.ndarray) -> None:
        """Median and robust spread (scaled MAD, at least ``min_log_spread``) of the log
        bandwidth windows of ``cols``: one sort per column, missing values last."""
        hist = self._log[cols]
        c = self._count[cols]
        med = nanmedian_rows(hist, c)
        mad = nanmedian_rows(np.abs(hist - med.astype(hist.dtype)[:, None]), c)
        self._med[cols] = med
        self._count_at[cols] = c
        self._spread[cols] = np.maximum(1.4826 * mad, self.min_log_spread)

    def baseline(self, n_comms: int) -> np.ndarray:
        """Per comm: the fastest sustained bus bandwidth seen (NaN when never seen)."""
        if not self._blocks:
            return np.full(n_comms, np.nan)
        if self._baseline is not None and self._baseline.size == n_comms:
            return self._baseline  # it only changes when a block is added (every ``block``)
        # the largest value of each column over the blocks, NaN where none is finite (one pass
        # per block: no (blocks x comms) array)
        top = np.full(n_comms, np.nan)
        seen = np.zeros(n_comms, dtype=bool)
        for b in self._blocks:
            k = min(b.size, n_comms)
            np.fmax(top[:k], b[:k], out=top[:k])
            seen[:k] |= np.isfinite(b[:k])
        self._baseline = np.where(seen, top, np.nan)
        return self._baseline

    def learn(self, busbw: np.ndarray) -> None:
        self._current.append(busbw)
        if len(self._current) >= self.block:
            n = max(a.size for a in self._current)
            m = np.full((len(self._current), n), np.nan)
            for i, a in enumerate(self._current):
                m[i, : a.size] = a
            self._blocks.append(nanmedian_rows(m.T))
            self._current = []
            self._baseline = None

    def score(
        self,
        frame: Frame,
        shape: JobShape,
        busy_hosts: set[int] | None = None,
        *,
        timed_p2p: bool = True,
        open_causes: dict[Subject, LinkSuspect] | None = None,
        healthy_step_s: float = float("nan"),
    ) -> LinkScores:
        """``busy_hosts``: host indices with a rank that computes slowly now; the communicators
        through them are left out of this frame (a starved rank slows the collectives it
        drives: gloo reduces on the CPU, NCCL kernels share the SMs) and not learnt from.
        ``timed_p2p`` False: p2p communicators are left out too (a small job on shared CPUs,
        whose eager sends block while an unscheduled receiver drains nothing: 10x slower for
        40 steps in a healthy lab pipeline). ``open_causes``: the NICs and cables of open incidents,
        which explain their communicators before anything new is placed. ``healthy_step_s``:
        the job's healthy step time, against which a link's cost is measured (NaN: the frame's)."""
        n_comms = min(frame.comm_bytes.size, shape.comm_kind.size)
        keep = shape.ch_comm < n_comms
        ch_comm, ch_host = shape.ch_comm[keep], shape.ch_host[keep]
        cross = np.bincount(ch_comm, minlength=n_comms) >= 2  # distinct hosts per comm
        if not timed_p2p:
            cross &= ~np.isin(shape.comm_kind[:n_comms], SEND_RECV_KINDS)
        busbw = bus_bandwidth(
            frame.comm_bytes[:n_comms], np.ones(n_comms), frame.comm_transfer[:n_comms]
        )
        everyone = np.where(cross & (frame.comm_calls[:n_comms] > 0), busbw, np.nan)
        if busy_hosts:
            through = ch_comm[np.isin(ch_host, np.fromiter(busy_hosts, np.int64))]
            cross[through] = False
        busbw = np.where(cross, everyone, np.nan)
        own = self.baseline(n_comms)
        parent = shape.comm_parent[:n_comms]
        if parent.size == n_comms and (parent >= 0).any():
            # a re-created comm (new ring order, same members) is held to its predecessor's
            # record too, so a re-plan that did not help is still seen as slow
            has = parent >= 0
            for _ in range(4):  # chains of re-creations
                own = np.where(has, np.fmax(own, own[np.where(has, parent, 0)]), own)
        # the peer reference counts the comms left out through compute-slow hosts too: when a
        # slow GPU's host carries half the job's rings, the other half are all the peers left,
        # and a slow NIC under all of them would be its own reference
        # ... but not those an open NIC or cable incident explains: two slow NICs under all
        # the job's rings of a kind would make each other's reference
        # the job's rings of a kind would make each other's reference; and where those left
        # out leave only rings through one host, they cannot judge that host's NIC
        peers = np.isfinite(everyone)
        for hosts, _, edges in (open_causes or {}).values():
            peers &= ~crossing(shape, n_comms, hosts, edges)
        thinned = np.isfinite(everyone) & ~peers
        peer = np.full(n_comms, np.nan)
        keys = shape.comm_kind[:n_comms] * 1_000_003 + shape.comm_size[:n_comms]
        for key in np.unique(keys[peers]):
            sel = (keys == key) & peers
            if (thinned & (keys == key)).any():
                shared = np.bincount(ch_host[sel[ch_comm]], minlength=shape.n_hosts)
                if shared.max(initial=0) >= sel.sum():
                    continue
            if sel.sum() >= 3:
                peer[keys == key] = np.percentile(everyone[sel], 80)
        with np.errstate(divide="ignore", invalid="ignore"):
            r_own = busbw / own
            r_peer = busbw / peer
        ratio = np.fmin(
            np.where(np.isfinite(r_own), r_own, np.nan),
            np.where(np.isfinite(r_peer), r_peer, np.nan),
        )
        known = np.isfinite(ratio)
        z = self._noise_z(busbw, parent)
        # beyond its own noise as well; a comm whose noise is not known yet is not judged
        beyond_noise = np.nan_to_num(z, nan=-np.inf) >= self.z
        # slow against every reference it has
        slow = (
            known
            & np.where(np.isfinite(r_own), r_own < self.slow_ratio, True)
            & np.where(np.isfinite(r_peer), r_peer < self.slow_ratio, True)
            & beyond_noise
        )
        elevated = known & (ratio < self.relaxed_ratio) & beyond_noise
        self.learn(busbw)
        left = np.isfinite(everyone) & ~np.isfinite(busbw)
        with np.errstate(divide="ignore", invalid="ignore"):
            left_ratio = np.fmin(everyone / own, everyone / peer)
        ev = Evidence(
            data=np.isfinite(busbw),
            bad=slow & np.isfinite(busbw),
            left=left,
            left_fine=left & (np.nan_to_num(left_ratio, nan=0.0) >= self.slow_ratio),
        )
        host_frac = host_fraction(shape, ev)
        suspects = self._localise(
            shape, ev, busbw, own, self.cost(frame, ratio, n_comms, healthy_step_s), open_causes
        )
        return LinkScores(busbw, ratio, slow, elevated, host_frac, beyond_noise, suspects)

    @staticmethod
    def cost(
        frame: Frame, ratio: np.ndarray, n_comms: int, healthy_step_s: float = float("nan")
    ) -> np.ndarray:
        """Per comm: the share of a step it lost against its reference (NaN: unknown). Its
        transfers took ``t`` in this frame; at the reference bandwidth they would have taken
        ``t x ratio``. The step is the job's healthy one where known and shorter: while another
        fault (a slow node) stretches every step, a slow cable costs what it costs a healthy
        step, not a share of the stretched one (issue 32: never reported)."""
        if frame.has_steps and np.isfinite(frame.step_time).any():
            step = float(np.nanmedian(frame.step_time))
        else:
            step = (frame.end_ns - frame.start_ns) * 1e-9
        if 0 < healthy_step_s < step:
            step = healthy_step_s
        if not step > 0:
            return np.full(n_comms, np.nan)
        with np.errstate(invalid="ignore"):
            return frame.comm_transfer[:n_comms] * (1.0 - ratio[:n_comms]) / step

    def _localise(
        self,
        shape: JobShape,
        ev: Evidence,
        busbw: np.ndarray,
        own: np.ndarray,
        cost: np.ndarray,
        known: dict[Subject, LinkSuspect] | None = None,
    ) -> dict[Subject, LinkSuspect]:
        """The components (NICs, cables) that explain the slow communicators
        (``detectors/localise.py``). A component is a suspect only when one of its slow
        communicators lost at least ``min_cost`` of the step (``cost``): a slower link that
        costs the job nothing that matters is not a fail-slow."""

        def matters(mask: np.ndarray) -> bool:
            lost = cost[mask]
            lost = lost[np.isfinite(lost)]
            return not lost.size or float(lost.max()) >= self.min_cost

        def slowdown(mask: np.ndarray) -> float:
            with np.errstate(divide="ignore", invalid="ignore"):
                vals = own[mask] / busbw[mask]
            vals = vals[np.isfinite(vals)]
            return float(np.median(vals)) if vals.size else float("nan")

        return localise(
            shape, ev, min_fit=self.min_fit, matters=matters, slowdown=slowdown, known=known
        )


def explained(busy: set[str], hosts: tuple[str, ...], edges: tuple[tuple[str, str], ...]) -> bool:
    """Can compute-slow hosts explain a link suspect? A NIC: when its host is one of them. Host
    pairs: when every candidate pair has an end on one (a slow rank slows the rings through it,
    not a ring elsewhere)."""
    if edges:
        return all(a in busy or b in busy for a, b in edges)
    return bool(busy.intersection(hosts))
