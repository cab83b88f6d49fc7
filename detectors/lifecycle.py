"""Persistence before opening and hysteresis before resolving, for many subjects at once.

Node-problem-detector's split: a *suspect frame* is a temporary event; an *open condition* is
persistent. A subject opens when at least ``open_after`` of its last ``window`` frames were
suspect (and the newest one is), and resolves after ``resolve_after`` consecutive frames without
even the relaxed ("elevated") signal. A subject that reopens within ``flap_window`` frames of
resolving is flapping: each such reopen doubles the clean frames it needs to resolve (up to 8x),
as route-flap damping does, so an intermittent fault stays one incident.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from failslow.detectors.defaults import DEFAULTS

K = TypeVar("K", bound=Hashable)
KEEP_FRAMES = 63  # frames of suspicion remembered per subject (evidence windows up to this)
KEEP = np.uint64((1 << KEEP_FRAMES) - 1)


@dataclass(frozen=True, slots=True)
class Transitions:
    opened: np.ndarray  # subject indices that opened in this frame
    resolved: np.ndarray  # subject indices that resolved in this frame


class ConditionTracker:
    """Vectorised over subjects (rank slots); state is O(1) per subject."""

    MAX_FLAP_SHIFT = 3

    def __init__(
        self,
        *,
        window: int,
        open_after: int,
        resolve_after: int,
        flap_window: int | None = None,
        fast_after: int = DEFAULTS.min_evidence,
        severe_after: int = DEFAULTS.severe_evidence,
    ) -> None:
        if not 1 <= open_after <= window <= 63:
            raise ValueError("need 1 <= open_after <= window <= 63")
        self.window = window
        self.open_after = open_after
        self.resolve_after = resolve_after
        self.flap_window = 4 * resolve_after if flap_window is None else flap_window
        if fast_after < 1:
            raise ValueError("need fast_after >= 1")
        # consecutive *strong* frames that open without waiting for open_after of window
        self.fast_after = fast_after
        self.severe_after = max(1, min(severe_after, fast_after))  # ... of *severe* frames
        self.mask = np.uint64((1 << window) - 1)
        self.frame = 0
        self.bits = np.zeros(0, dtype=np.uint64)
        self.open = np.zeros(0, dtype=bool)
        self.clean = np.zeros(0, dtype=np.int64)
        self.flaps = np.zeros(0, dtype=np.int64)
        self.resolved_at = np.zeros(0, dtype=np.int64)
        self.strong_run = np.zeros(0, dtype=np.int64)
        self.severe_run = np.zeros(0, dtype=np.int64)

    def ensure(self, n: int) -> None:
        extra = n - self.bits.size
        if extra > 0:
            self.bits = np.concatenate([self.bits, np.zeros(extra, np.uint64)])
            self.open = np.concatenate([self.open, np.zeros(extra, bool)])
            self.clean = np.concatenate([self.clean, np.zeros(extra, np.int64)])
            self.flaps = np.concatenate([self.flaps, np.zeros(extra, np.int64)])
            never = np.full(extra, np.iinfo(np.int64).min // 2, np.int64)
            self.resolved_at = np.concatenate([self.resolved_at, never])
            self.strong_run = np.concatenate([self.strong_run, np.zeros(extra, np.int64)])
            self.severe_run = np.concatenate([self.severe_run, np.zeros(extra, np.int64)])

    def seed_open(self, index: int) -> None:
        """Mark a subject open (an incident that was open before a restart)."""
        self.ensure(index + 1)
        self.open[index] = True
        self.clean[index] = 0

    def suspect_count(self, window: int | None = None) -> np.ndarray:
        """Suspect frames per subject among its last ``window`` (default: the tracker's)."""
        mask = self.mask if window is None else np.uint64((1 << window) - 1)
        return np.bitwise_count(self.bits & mask).astype(np.int64)

    def update(
        self,
        suspect: np.ndarray,
        elevated: np.ndarray,
        present: np.ndarray,
        strong: np.ndarray | None = None,
        *,
        evidence: tuple[int, int] | None = None,
        severe: np.ndarray | None = None,
    ) -> Transitions:
        """Advance one frame. Absent subjects (no data) neither count as suspect nor as clean.

        ``strong`` marks suspects whose evidence is far past the thresholds: ``fast_after``
        consecutive strong frames open a subject without waiting for ``open_after`` of
        ``window``. By default that is ``min_evidence`` (4) frames: a strong deviation of 3 steps
        or fewer opens nothing (a hiccup is not an incident). ``evidence``: ``(window,
        open_after)`` for this frame instead of the tracker's (up to ``KEEP`` frames).
        ``severe``: strong suspects far past even that (a rank 1.4x as slow as its peers):
        ``severe_after`` (3) consecutive ones open — evidence in proportion to its strength; a
        stall of one rank spans at most two frames (it can cross a step boundary).
        """
        n = suspect.size
        self.ensure(n)
        self.frame += 1
        bits = self.bits[:n]
        shifted = ((bits << np.uint64(1)) | suspect.astype(np.uint64)) & KEEP
        self.bits[:n] = np.where(present, shifted, bits)
        window, need = evidence or (self.window, self.open_after)
        count = self.suspect_count(min(window, KEEP_FRAMES))[:n]
        was_open = self.open[:n].copy()
        if strong is None:
            strong = np.zeros(n, dtype=bool)
        run = np.where(
            present & strong & suspect,
            self.strong_run[:n] + 1,
            np.where(present, 0, self.strong_run[:n]),
        )
        self.strong_run[:n] = run
        fast = run >= self.fast_after
        if severe is not None:
            srun = np.where(
                present & severe & strong & suspect,
                self.severe_run[:n] + 1,
                np.where(present, 0, self.severe_run[:n]),
            )
            self.severe_run[:n] = srun
            fast |= srun >= self.severe_after
        opening = ~was_open & present & suspect & ((count >= need) | fast)
        flapping = opening & (self.frame - self.resolved_at[:n] <= self.flap_window)
        self.flaps[:n] = np.where(
            opening, np.where(flapping, self.flaps[:n] + 1, 0), self.flaps[:n]
        )
        clean = np.where(
            present & was_open, np.where(elevated | suspect, 0, self.clean[:n] + 1), self.clean[:n]
        )
        needed = self.resolve_after << np.minimum(self.flaps[:n], self.MAX_FLAP_SHIFT)
        resolving = was_open & (clean >= needed)
        self.resolved_at[:n] = np.where(resolving, self.frame, self.resolved_at[:n])
        self.clean[:n] = np.where(opening | resolving, 0, clean)
        self.open[:n] = (was_open & ~resolving) | opening
        if resolving.any():
            self.bits[:n][resolving] = 0
        return Transitions(np.flatnonzero(opening), np.flatnonzero(resolving))


def run_start(flags: np.ndarray, *, max_gap: int = 1) -> int:
    """Index (into ``flags``, oldest first) where the run of True ending at the newest begins.

    Gaps of up to ``max_gap`` False frames inside the run are tolerated; returns
    ``len(flags) - 1`` when the newest frame itself is False.
    """
    start = len(flags) - 1
    gap = 0
    for i in range(len(flags) - 1, -1, -1):
        if flags[i]:
            start = i
            gap = 0
        else:
            gap += 1
            if gap > max_gap:
                break
    return start


class KeyedTracker(Generic[K]):
    """A :class:`ConditionTracker` over subjects named by hashable keys (hosts, links, the job)."""

    def __init__(self, **kwargs: int) -> None:
        self.tracker = ConditionTracker(**kwargs)
        self.index: dict[K, int] = {}
        self.names: list[K] = []

    def _slot(self, key: K) -> int:
        i = self.index.get(key)
        if i is None:
            i = self.index[key] = len(self.names)
            self.names.append(key)
            self.tracker.ensure(len(self.names))
        return i

    def seed_open(self, key: K) -> None:
        self.tracker.seed_open(self._slot(key))

    def is_open(self, key: K) -> bool:
        i = self.index.get(key)
        return i is not None and bool(self.tracker.open[i])

    def update(
        self,
        suspect: set[K],
        elevated: set[K],
        strong: set[K] | None = None,
        severe: set[K] | None = None,
    ) -> tuple[list[K], list[K]]:
        """Advance one frame for every known subject; returns (opened, resolved) keys.
        ``severe``: see :meth:`ConditionTracker.update` (None: nothing is)."""
        strong = strong or set()
        for key in suspect | elevated:
            self._slot(key)
        n = len(self.names)
        sus = np.array([k in suspect for k in self.names], dtype=bool)
        ele = np.array([k in elevated for k in self.names], dtype=bool)
        stg = np.array([k in strong for k in self.names], dtype=bool)
        sev = None if severe is None else np.array([k in severe for k in self.names], dtype=bool)
        tr = self.tracker.update(sus, ele | sus, np.ones(n, dtype=bool), stg, severe=sev)
        return [self.names[i] for i in tr.opened], [self.names[i] for i in tr.resolved]
