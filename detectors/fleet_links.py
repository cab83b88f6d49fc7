"""A NIC's speed from passive data: what a job's own collectives say of each host's network.

In a collective every member waits for the slowest link of its ring, so one communicator's bus
bandwidth cannot say which of its hosts is slow. A host's **fastest** communicator can: a slow
NIC makes every communicator through it slow, while a healthy host has one that avoids any single
slow NIC elsewhere — as a link check takes a host's fastest pair (:func:`.fleet.link_readings`).
That holds only where the host's communicators share no other host: when another host is in
every one of them (a data-parallel ring over all hosts, a host with one pipeline partner), its
fastest communicator may be slow for the other host's sake, and the frame gives no reading of
it.

Per frame, per host that passive data can separate so: its slowness is the job's median fastest
ratio over the fastest ratio of its own communicators (``ratio`` as the link detector scores it:
bandwidth against the communicator's own best and its peers', :class:`.link.LinkScores`), at
least ``MIN_HOSTS`` hosts judged in the frame. A NIC 1.2x slower than the others in every job it
joins is below every per-job link threshold; the fleet ledger pools these readings across jobs
(:class:`FleetTally`, ``service/fleet/ledger.py``).

What a slower host's network cost the frame: its longest transfer time in one of its
communicators (the one the step waits for longest), less what it would have taken at the
median host's speed: ``t x (1 - 1/slowness)``.

Pure functions of numbers: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from failslow.detectors.fleet import JobReading, SpeedTally
from failslow.detectors.link import LinkScores
from failslow.detectors.straggler import FrameScores
from failslow.detectors.types import Frame, JobShape

MIN_HOSTS = 3  # hosts judged in a frame before any is compared with the others
_CACHE = 8  # separability per shape and set of communicators with data, most recent kept


def separable(shape: JobShape, with_data: np.ndarray) -> np.ndarray:
    """Per host index: whether its communicators with data (``with_data``, per comm) are two or
    more and no other host is in every one of them."""
    mine: list[list[int]] = [[] for _ in range(shape.n_hosts)]
    for c in np.flatnonzero(with_data[: len(shape.comm_hosts)]).tolist():
        hosts = shape.comm_hosts[c]
        if len(hosts) >= 2:
            for h in hosts:
                mine[h].append(c)
    out = np.zeros(shape.n_hosts, dtype=bool)
    for h, comms in enumerate(mine):
        if len(comms) < 2:
            continue
        comms.sort(key=lambda c: len(shape.comm_hosts[c]))
        common = set(shape.comm_hosts[comms[0]])
        for c in comms[1:]:
            common.intersection_update(shape.comm_hosts[c])
            if len(common) == 1:
                break
        out[h] = common == {h}
    return out


def host_links(
    shape: JobShape, ratio: np.ndarray, transfer: np.ndarray | None = None,
    cache: dict[bytes, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Per host index: its link slowness, the job's median fastest ``ratio`` over the host's own
    fastest (> 1: slower than the others; NaN where the frame cannot separate the host, module
    doc, or fewer than ``MIN_HOSTS`` hosts are judged); and the longest summed ``transfer`` time
    (per comm, s) of one of its communicators with data (NaN: none, or no ``transfer``).
    ``cache``: separability by the set of communicators with data, for one shape."""
    n = min(ratio.size, len(shape.comm_hosts))
    slow = np.full(shape.n_hosts, np.nan)
    longest = np.full(shape.n_hosts, np.nan)
    with_data = np.isfinite(ratio[:n]) & (ratio[:n] > 0)
    if not with_data.any():
        return slow, longest
    key = np.packbits(with_data).tobytes()
    sep = None if cache is None else cache.get(key)
    if sep is None:
        sep = separable(shape, with_data)
        if cache is not None:
            if len(cache) >= _CACHE:
                cache.pop(next(iter(cache)))
            cache[key] = sep
    keep = shape.ch_comm < n
    ch_comm, ch_host = shape.ch_comm[keep], shape.ch_host[keep]
    sel = with_data[ch_comm]
    comm, host = ch_comm[sel], ch_host[sel]
    best = np.full(shape.n_hosts, np.nan)
    np.fmax.at(best, host, ratio[comm])
    judged = sep & np.isfinite(best)
    if judged.sum() < MIN_HOSTS:
        return slow, longest
    slow[judged] = float(np.median(best[judged])) / best[judged]
    if transfer is not None:
        timed = comm < transfer.size
        np.fmax.at(longest, host[timed], transfer[comm[timed]])
    return slow, longest


class FleetTally:
    """What a job's detection passes saw for the fleet ledger since it last took them: per rank
    slot the compute ratios (:class:`.fleet.SpeedTally`), per host the passive link slowness
    and what it cost (:func:`host_links`), kept by host name (a job's host indices change when its
    topology does). Bounded by the job's size."""

    __slots__ = ("speed", "links", "lost", "_index", "_shape", "_map", "_cache")

    def __init__(self) -> None:
        self.speed = SpeedTally()
        self.links = SpeedTally()
        self.lost = np.zeros(0)  # per host: what its slower network cost the job (s)
        self._index: dict[str, int] = {}
        self._shape: JobShape | None = None
        self._map = np.zeros(0, dtype=np.int64)  # shape's host index -> this tally's
        self._cache: dict[bytes, np.ndarray] = {}

    def __getstate__(self) -> dict[str, object]:
        """Pickled (a replica's snapshot) without the shape and its cache: rebuilt on the next
        frame."""
        return {k: getattr(self, k) for k in ("speed", "links", "lost", "_index")}

    def __setstate__(self, state: dict[str, object]) -> None:
        for k, v in state.items():
            setattr(self, k, v)
        self._shape, self._map, self._cache = None, np.zeros(0, dtype=np.int64), {}

    def observe(
        self, frame: Frame, scores: FrameScores, shape: JobShape, links: LinkScores | None
    ) -> None:
        """One frame as detection scored it."""
        self.add(scores.compute_ratio, scores.frame_time, shape, links, frame.comm_transfer)

    def add(
        self, compute_ratio: np.ndarray, frame_s: float, shape: JobShape | None = None,
        links: LinkScores | None = None, transfer: np.ndarray | None = None,
    ) -> None:  # fmt: skip
        """One frame: its compute ratios per slot, and where given its communicators' link
        scores with the job's shape (and their summed transfer times: what a slower host's
        network cost)."""
        self.speed.add(compute_ratio, frame_s)
        if shape is None or links is None or not shape.n_hosts:
            return
        if shape is not self._shape:
            for h in shape.hosts:
                self._index.setdefault(h, len(self._index))
            self.lost = np.concatenate([self.lost, np.zeros(len(self._index) - self.lost.size)])
            self._map = np.array([self._index[h] for h in shape.hosts], dtype=np.int64)
            self._shape, self._cache = shape, {}
        slow, longest = host_links(shape, links.ratio, transfer, self._cache)
        if not np.isfinite(slow).any():
            return
        full = np.full(len(self._index), np.nan)
        full[self._map] = slow
        self.links.add(full, frame_s)
        lost = longest * (1.0 - 1.0 / slow)
        ok = np.isfinite(lost) & (lost > 0)
        self.lost[self._map[ok]] += lost[ok]

    def reading(self, slot: int) -> JobReading | None:
        """A rank slot's compute reading (None: no frame of it)."""
        return self.speed.reading(slot)

    def link_reading(self, host: str) -> JobReading | None:
        """A host's passive link reading since the tally was taken: its log slowness per frame
        and what its slower network cost (None: no frame judged it; the ledger adds the takes
        of a job up, and the fleet model counts a job's reading from ``min_frames`` frames)."""
        i = self._index.get(host)
        r = None if i is None else self.links.reading(i)
        if r is None:
            return None
        return replace(r, lost_s=float(self.lost[i]))
