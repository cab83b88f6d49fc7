"""The accumulators of a frame under construction: per-slot and per-communicator sums (partial
frames add up), and the queues of contributions that wait for their frame."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from failslow.detectors.types import KINDS

NK = len(KINDS)
NS = 1e-9
NEVER = np.iinfo(np.int64).min
CHUNK = 1 << 15  # contributions handled per pass (their temporaries fit in a core's L2 cache)


def grow(arr: np.ndarray, n: int, fill: float | int) -> np.ndarray:
    if arr.shape[0] >= n:
        return arr
    pad = np.full((n - arr.shape[0], *arr.shape[1:]), fill, dtype=arr.dtype)
    return np.concatenate([arr, pad])


@dataclass(slots=True)
class FrameAcc:
    index: int
    start_ns: int
    end_ns: int
    step_time: np.ndarray = field(default_factory=lambda: np.empty(0))
    work: np.ndarray = field(default_factory=lambda: np.empty(0))  # per slot, NaN: not said
    busy: np.ndarray = field(default_factory=lambda: np.empty((0, NK)))  # time inside ops, by kind
    late: np.ndarray = field(default_factory=lambda: np.empty((0, NK)))
    calls: np.ndarray = field(default_factory=lambda: np.empty((0, NK)))
    starts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # per slot, -1 = none
    ends: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    c_transfer: np.ndarray = field(default_factory=lambda: np.empty(0))  # per comm
    c_bytes: np.ndarray = field(default_factory=lambda: np.empty(0))
    c_calls: np.ndarray = field(default_factory=lambda: np.empty(0))
    reported: int = 0
    collectives: int = 0

    def grow(self, n: int, n_comms: int = 0) -> None:
        self.step_time = grow(self.step_time, n, np.nan)
        self.work = grow(self.work, n, np.nan)
        self.busy = grow(self.busy, n, 0.0)
        self.late = grow(self.late, n, 0.0)
        self.calls = grow(self.calls, n, 0.0)
        self.starts = grow(self.starts, n, -1)
        self.ends = grow(self.ends, n, -1)
        self.c_transfer = grow(self.c_transfer, n_comms, 0.0)
        self.c_bytes = grow(self.c_bytes, n_comms, 0.0)
        self.c_calls = grow(self.c_calls, n_comms, 0.0)


def add_at(
    out: np.ndarray, index: np.ndarray, weights: np.ndarray | None, lo: int, hi: int
) -> None:
    """``out[index] += weights`` (or ``+= 1``), repeated indices summed in index order, for
    indices known to lie in ``[lo, hi)``: ``np.bincount`` over that span only, so that a chunk
    touching a few thousand slots does not pay for the whole job. Indices past ``out`` are
    ignored."""
    if index.size == 0:
        return
    if hi > out.size:
        keep = index < out.size
        index, hi = index[keep], out.size
        weights = None if weights is None else weights[keep]
        if hi <= lo:
            return
    out[lo:hi] += np.bincount(index - lo, weights=weights, minlength=hi - lo)


class Queue:
    """Parallel arrays of queued contributions, appended in chunks, taken all at once."""

    def __init__(self, *names: str) -> None:
        self.names = names
        self.chunks: dict[str, list[np.ndarray]] = {n: [] for n in names}

    def __bool__(self) -> bool:
        return bool(self.chunks[self.names[0]])

    def append(self, **arrays: np.ndarray) -> None:
        for name in self.names:
            self.chunks[name].append(arrays[name])

    def take(self) -> dict[str, np.ndarray] | None:
        if not self:
            return None
        out = {n: np.concatenate(c) for n, c in self.chunks.items()}
        for c in self.chunks.values():
            c.clear()
        return out


MEMBER_FIELDS = ("slot", "start", "dur", "late", "kind")
COMM_FIELDS = ("slot", "start", "comm", "transfer", "ebytes")
