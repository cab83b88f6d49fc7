"""Value objects shared by detectors and their callers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Columns of per-kind arrays. ``p2p`` holds every send/recv, whatever its comm's kind.
KINDS = ("dp", "tp", "pp", "ep", "cp", "world", "other", "p2p")
KIND_INDEX = {k: i for i, k in enumerate(KINDS)}
P2P = KIND_INDEX["p2p"]
WORLD = KIND_INDEX["world"]


@dataclass(frozen=True, slots=True)
class Frame:
    """One step of a job (or one time bucket when no step records exist), per rank slot.

    Every array has one entry per rank slot; NaN means the rank did not report. All durations are
    seconds measured on each rank's own clock, so nothing here depends on clocks agreeing.
    """

    index: int  # step number, or time-bucket number when ``has_steps`` is False
    has_steps: bool
    start_ns: int
    end_ns: int
    step_time: np.ndarray  # (n,) step duration
    comm_time: np.ndarray  # (n,) time inside collectives and p2p
    wait: np.ndarray  # (n,) time this rank waited for the last arriver of its collectives
    late: np.ndarray  # (n, len(KINDS)) time peers waited for this rank, per comm kind
    calls: np.ndarray  # (n, len(KINDS)) collectives this rank completed, per comm kind
    collectives: int  # collectives attributed to the frame

    @property
    def n(self) -> int:
        return int(self.step_time.shape[0])


@dataclass(frozen=True, slots=True)
class PeerGroups:
    """Role peers: groups of rank slots expected to do equal work, stacked by group size.

    ``stacks`` maps a group size to an (groups, size) int array of slots. Built from the
    communicators of a job (tensor-, data-, expert-, context-parallel groups).
    """

    stacks: tuple[np.ndarray, ...]

    @staticmethod
    def from_groups(groups: list[np.ndarray]) -> PeerGroups:
        by_size: dict[int, list[np.ndarray]] = {}
        for g in groups:
            if g.size >= 2:
                by_size.setdefault(int(g.size), []).append(np.asarray(g, dtype=np.int64))
        return PeerGroups(tuple(np.stack(v) for _, v in sorted(by_size.items())))
