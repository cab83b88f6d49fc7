"""A job's recent detector history: ring buffers of per-frame and per-rank signals, the job's
healthy baseline step time, and each rank's usual compute ratio.

Rings hold the last ``history`` frames, oldest overwritten first; ``count`` is the absolute
number of frames recorded, and a frame's ring position is its counter modulo ``history``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from failslow.detectors.findings import rounded
from failslow.detectors.link import LinkScores
from failslow.detectors.robust import quiet_nan
from failslow.detectors.straggler import FrameScores, NodeScores
from failslow.detectors.types import Frame

PER_RANK = ("compute", "late", "ratio", "cross")


def median(a: np.ndarray) -> float:
    """Median of the finite values (NaN when there is none)."""
    a = np.asarray(a, dtype=np.float64)
    return float(np.nanmedian(a)) if np.isfinite(a).any() else float("nan")


NEAR_NORMAL = 1.05  # a block median this close to the job's normal moves it ...
NOISE_BAND = 2.0  # ... or within this many times the job's step noise, where that is wider
NORMAL_PULL = 0.3  # ... by this share of the difference (about 3 blocks to follow a drift)
NOISE_BLOCKS = 20  # blocks over which the job's step noise is the median
JOB_NOISE_BAR = 2.0  # a job slowdown is at least this many times the job's step noise
RANK_BLOCKS = 20  # blocks of per-rank compute medians kept for each rank's healthy floor
EARLY = 10  # a rank's first frames, kept for good: was a condition there from the start?


@dataclass(frozen=True, slots=True)
class JobEvidence:
    """How the job's step time stands against its normal, for a job slowdown."""

    ratio: float  # the step time now (``job_level``) / the job's normal (NaN: unknown)
    bar: float  # what a slowdown must reach: the configured ratio, or 1 + 2 x the step noise
    # beyond 3 robust spreads of the step times kept (needed to open): while a change is younger
    # than the history, both levels are in it (a noisy job's first level shift in the lab's
    # warm-up: +50% for 30 steps, healthy)
    beyond: bool


class FrameHistory:
    """Recent frames of one job. Mutated only by the pipeline that owns it."""

    def __init__(
        self,
        *,
        history: int,
        window: int,
        baseline_frames: int,
        baseline_block: int,
        warmup: int = 0,
    ) -> None:
        self.h = history
        self.warmup = warmup  # frames at the job's start that are no sample of how it runs
        self.window = window
        self.n = 0
        self.count = 0  # frames recorded
        self.has_steps = True
        self.f_index = np.zeros(history, dtype=np.int64)
        self.f_start = np.zeros(history, dtype=np.int64)
        self.f_end = np.zeros(history, dtype=np.int64)
        self.f_time = np.full(history, np.nan)  # job step time (NaN for time frames)
        self.f_norm = np.full(history, np.nan)  # the frame's length, normaliser of lateness
        self.elevated = np.zeros((0, history), dtype=bool)
        self.suspect = np.zeros((0, history), dtype=bool)
        self.compute = np.zeros((0, history), dtype=np.float32)
        self.late = np.zeros((0, history), dtype=np.float32)
        self.ratio = np.zeros((0, history), dtype=np.float32)
        self.cross = np.zeros((0, history), dtype=np.float32)
        self.link_ratio = np.zeros((0, history), dtype=np.float32)
        self.comm_typical = np.zeros(0)  # per comm: EWMA of the mean transfer time (s)
        # Individual baseline (NVIDIA's "individual score"): each rank's usual compute ratio vs
        # its peers, an EWMA that never learns from elevated frames.
        self.own_ratio = np.zeros(0)
        # Baseline: the fastest sustained step time recently seen. Faults only slow a job down,
        # so the minimum over block medians ignores them (and checkpoint stalls) without needing
        # to know when they happened; a lasting legitimate slow-down is adopted once the faster
        # blocks age out of the window.
        self.block = baseline_block
        self._block: list[float] = []
        self.blocks: deque[float] = deque(maxlen=max(1, baseline_frames // baseline_block))
        # the job's own normal step time: block medians near it (within 5%) pull it along, so it
        # follows a slow drift of the machine but not a jump (see ``job_normal``)
        self.normal = float("nan")
        # ... and the job's step-to-step noise: per block, the robust relative spread of its
        # step times around the block's median (a level shift between blocks is not noise)
        self.noise_blocks: deque[float] = deque(maxlen=NOISE_BLOCKS)
        # each rank's compute per block of frames (block medians), whose minimum is its healthy
        # level: a slow GPU only adds compute, so the fastest recent block ignores a slowdown
        # without knowing when it began (a weak one is found late, after the ring has forgotten
        # the healthy frames before it)
        self._cblock: list[np.ndarray] = []
        self.compute_blocks: deque[np.ndarray] = deque(maxlen=RANK_BLOCKS)
        # each rank's first recorded frame (counter, step, start) and, over its first ``EARLY``
        # frames, its compute against its role peers and whether it was elevated: a condition
        # present from a rank's first frames is chronic (detectors/chronic.py)
        self.first_pos = np.zeros(0, dtype=np.int64)
        self.first_index = np.zeros(0, dtype=np.int64)
        self.first_ns = np.zeros(0, dtype=np.int64)
        self.early_ratio = np.zeros((0, EARLY), dtype=np.float32)
        self.early_elevated = np.zeros((0, EARLY), dtype=bool)

    # -- shape ---------------------------------------------------------------------------------
    def ensure(self, n: int, n_comms: int) -> None:
        """Room for ``n`` rank slots and ``n_comms`` communicators."""
        if n > self.n:
            extra = n - self.n
            self.elevated = np.vstack([self.elevated, np.zeros((extra, self.h), bool)])
            self.suspect = np.vstack([self.suspect, np.zeros((extra, self.h), bool)])
            for name in PER_RANK:
                arr = getattr(self, name)
                setattr(self, name, np.vstack([arr, np.full((extra, self.h), np.nan, np.float32)]))
            self.own_ratio = np.concatenate([self.own_ratio, np.full(extra, np.nan)])
            self.first_pos = np.concatenate([self.first_pos, np.full(extra, -1, np.int64)])
            self.first_index = np.concatenate([self.first_index, np.zeros(extra, np.int64)])
            self.first_ns = np.concatenate([self.first_ns, np.zeros(extra, np.int64)])
            self.early_ratio = np.vstack(
                [self.early_ratio, np.full((extra, EARLY), np.nan, np.float32)]
            )
            self.early_elevated = np.vstack([self.early_elevated, np.zeros((extra, EARLY), bool)])
            self.n = n
        if n_comms > self.link_ratio.shape[0]:
            extra = n_comms - self.link_ratio.shape[0]
            self.link_ratio = np.vstack(
                [self.link_ratio, np.full((extra, self.h), np.nan, np.float32)]
            )
            self.comm_typical = np.concatenate([self.comm_typical, np.full(extra, np.nan)])

    def positions(self, since: int) -> np.ndarray:
        """Ring positions of frames with absolute counter >= since (oldest first)."""
        first = max(since, self.count - self.h, 0)
        return np.arange(first, self.count) % self.h

    # -- recording -----------------------------------------------------------------------------
    def record(
        self, frame: Frame, s: FrameScores, nodes: NodeScores, links: LinkScores, n_comms: int
    ) -> None:
        """Write one frame's signals at the next ring position and count it."""
        n = frame.n
        p = self.count % self.h
        self.f_index[p], self.f_start[p], self.f_end[p] = frame.index, frame.start_ns, frame.end_ns
        self.f_time[p] = s.frame_time if frame.has_steps else np.nan
        self.f_norm[p] = s.frame_time
        # column p of (slots, history) arrays: write each entry once (strided writes are the
        # cost of this method at 100K ranks)
        self.elevated[n:, p] = False
        self.suspect[n:, p] = False
        self.elevated[:n, p] = s.elevated
        self.suspect[:n, p] = s.suspect
        for name, values in (("compute", s.compute), ("late", s.late), ("ratio", s.compute_ratio)):
            arr = getattr(self, name)
            arr[n:, p] = np.nan
            arr[:n, p] = values
        self.cross[n:, p] = np.nan
        self.cross[:n, p] = nodes.rank_ratio
        self._add_compute(s.compute)
        self._add_early(frame, s, nodes)
        m = min(n_comms, links.ratio.size)
        self.link_ratio[m:, p] = np.nan
        # within its own noise counts as healthy (dating and hysteresis agree with detection)
        r = links.ratio[:m]
        self.link_ratio[:m, p] = np.where(np.isfinite(r) & ~links.beyond_noise[:m], 1.0, r)
        calls = frame.comm_calls[:n_comms]
        if calls.size:
            with np.errstate(divide="ignore", invalid="ignore"):
                mean = np.where(calls > 0, frame.comm_transfer[:n_comms] / calls, np.nan)
            t = self.comm_typical[: mean.size]
            self.comm_typical[: mean.size] = np.where(
                np.isnan(t), mean, np.where(np.isnan(mean), t, 0.9 * t + 0.1 * mean)
            )
        self.has_steps = frame.has_steps
        self.count += 1

    def _add_compute(self, compute: np.ndarray) -> None:
        self._cblock.append(np.array(compute, dtype=np.float32))
        if len(self._cblock) < self.block:
            return
        width = max(a.size for a in self._cblock)
        stack = np.full((len(self._cblock), width), np.nan, dtype=np.float32)
        for i, a in enumerate(self._cblock):
            stack[i, : a.size] = a
        self.compute_blocks.append(quiet_nan(np.nanmedian, stack, axis=0))
        self._cblock = []

    def _add_early(self, frame: Frame, s: FrameScores, nodes: NodeScores) -> None:
        n = frame.n
        present = np.isfinite(s.compute) | np.isfinite(s.late)
        first = self.first_pos[:n]
        new = present & (first < 0)
        if new.any():
            first[new] = self.count
            self.first_index[:n][new] = frame.index
            self.first_ns[:n][new] = frame.start_ns
        # a job's start-up frames (warm-up) are no sample of how a rank runs
        age = self.count - np.maximum(first, self.warmup)
        young = np.flatnonzero(present & (first >= 0) & (age >= 0) & (age < EARLY))
        if young.size:
            speed = np.fmax(s.compute_ratio[young], nodes.rank_ratio[young])
            self.early_ratio[young, age[young]] = speed
            self.early_elevated[young, age[young]] = s.elevated[young] | s.suspect[young]

    def compute_floor(self, slot: int) -> float:
        """A rank's healthy compute time per frame: its fastest block median of the last
        ``RANK_BLOCKS`` blocks (NaN before the first block)."""
        vals = [float(b[slot]) for b in self.compute_blocks if slot < b.size]
        vals = [v for v in vals if np.isfinite(v) and v > 0]
        return min(vals) if vals else float("nan")

    def learn_own_ratio(self, ratio: np.ndarray, learn: np.ndarray) -> None:
        """EWMA of each rank's compute ratio, for the ranks in ``learn``."""
        n = ratio.size
        own = self.own_ratio[:n]
        self.own_ratio[:n] = np.where(
            learn, np.where(np.isnan(own), ratio, 0.9 * own + 0.1 * ratio), own
        )

    # -- baseline ------------------------------------------------------------------------------
    def baseline(self) -> float:
        """Healthy job step time (NaN until one block of frames after warm-up was seen)."""
        return min(self.blocks) if self.blocks else float("nan")

    def add_to_baseline(self, step_time: float, *, follow: bool = True) -> None:
        """``follow``: the job's normal may move (not while a job slowdown is open)."""
        self._block.append(step_time)
        if len(self._block) >= self.block:
            block = np.asarray(self._block)
            m = float(np.median(block))
            self.blocks.append(m)
            self._block = []
            if m > 0:
                self.noise_blocks.append(1.4826 * float(np.median(np.abs(block - m))) / m)
            if np.isnan(self.normal):
                self.normal = m
            elif follow and m < (1.0 + self.near_normal()) * self.normal:
                self.normal += NORMAL_PULL * (m - self.normal)

    def step_noise(self) -> float:
        """The job's step-to-step noise: a step time's robust relative deviation from its block
        (median over the last ``NOISE_BLOCKS`` blocks; 0 before the first block)."""
        return float(np.median(self.noise_blocks)) if self.noise_blocks else 0.0

    def near_normal(self) -> float:
        """How far above the normal a block median still moves it: 5%, or twice the step noise
        of a noisy job (whose block medians wander by that much with nothing wrong)."""
        return max(NEAR_NORMAL - 1.0, NOISE_BAND * self.step_noise())

    def evidence_frames(self) -> int:
        """Frames over which a job-level change must hold: 3 for a steady job (step noise <= 1.5%),
        growing with the square of the noise (12 at 3%, 60 at 6.7% and more): a small job on
        shared CPUs, whose steps vary by 7-10%, runs 20-50 steps at +30% with nothing wrong
        (docs/lab.md); at most the history kept."""
        frames = round(3.0 * (self.step_noise() / 0.015) ** 2)
        return int(min(self.h - 4, max(3, frames)))

    def job_level(self) -> float:
        """The job's step time now, for a job slowdown: the lower of the median of the last three
        frames (still slow) and, over the last ``evidence_frames``, the step time that three
        quarters of them reach (slow for most of that span; the median when it is 3 frames);
        NaN until three frames have step times."""
        last3 = self.f_time[self.positions(self.count - 3)]
        if last3.size < 3 or not np.isfinite(last3).all():
            return float("nan")
        d = self.evidence_frames()
        span = self.f_time[self.positions(self.count - d)]
        span = span[np.isfinite(span)]
        held = float(np.quantile(span, 0.25 if d > 3 else 0.5)) if span.size else np.nan
        return min(float(np.median(last3)), held)

    def step_spread(self) -> float:
        """Robust spread (s) of the job step times kept (0 with fewer than 20)."""
        past = self.f_time[np.isfinite(self.f_time)]
        if past.size < 20:
            return 0.0
        return 1.4826 * float(np.median(np.abs(past - np.median(past))))

    def job_evidence(self, min_ratio: float) -> JobEvidence:
        """The job's step time now against its normal; ``min_ratio``: the configured bar."""
        base = self.job_normal()
        level = self.job_level()
        ratio = level / base if np.isfinite(base) and base > 0 else float("nan")
        bar = max(min_ratio, 1.0 + JOB_NOISE_BAR * self.step_noise())
        return JobEvidence(ratio, bar, bool(level - base >= 3.0 * self.step_spread()))

    def job_normal(self) -> float:
        """What a job slowdown is judged against: the healthy baseline, or the job's own normal
        where that has drifted above it (issue 16: a job on a shared machine that gets 30%
        slower over 200 steps, 10-step block by block, has no fault to find; a jump has)."""
        base = self.baseline()
        return max(base, self.normal) if np.isfinite(self.normal) else base

    # -- reading -------------------------------------------------------------------------------
    def gpu_signal(self, slot: int, pos: np.ndarray) -> np.ndarray:
        """A rank's compute ratio over ``pos`` (its lateness when too few ratios exist)."""
        ratio = self.ratio[slot, pos]
        return ratio if np.isfinite(ratio).sum() >= 7 else self.late[slot, pos]

    def job_view(self) -> dict[str, float | int | None]:
        if self.count == 0:
            return {
                "step": None,
                "step_time_s": None,
                "baseline_step_time_s": None,
                "slowdown": None,
            }
        recent = self.positions(self.count - self.window)
        now = median(self.f_time[recent])
        base = self.baseline()
        last = (self.count - 1) % self.h
        return {
            "step": int(self.f_index[last]) if self.has_steps else None,
            "step_time_s": rounded(now, 6),
            "baseline_step_time_s": rounded(base, 6),
            "slowdown": rounded(now / base)
            if np.isfinite(base) and base > 0 and np.isfinite(now)
            else None,
        }

    def rank_speed(self) -> np.ndarray:
        """Per slot, recent compute speed per unit of work against *any* of its role peers
        (1.0 = typical): the lower of the speeds against its own groups and against the same
        role on other hosts, so that a rank whose whole host is slow counts as slow too."""
        if self.count == 0 or self.n == 0:
            return np.full(self.n, np.nan)
        recent = self.positions(self.count - self.window)
        own = quiet_nan(np.nanmedian, self.ratio[:, recent], axis=1)
        cross = quiet_nan(np.nanmedian, self.cross[:, recent], axis=1)
        ratio = np.fmax(own, cross)
        return np.where(np.isfinite(ratio) & (ratio > 0), 1.0 / ratio, np.nan)

    def frame_times(self, *, since_index: int | None = None, last: int = 10) -> list[float]:
        """Step times of the newest ``last`` frames with step number >= ``since_index``."""
        pos = self.positions(self.count - self.h)
        keep = [
            float(self.f_time[p])
            for p in pos
            if np.isfinite(self.f_time[p])
            and (since_index is None or self.f_index[p] >= since_index)
        ]
        return keep[-last:]

    def rank_view(self) -> tuple[np.ndarray, np.ndarray]:
        """Per slot ``(score, lateness_s)`` over the recent window: 1.0 = typical speed."""
        if self.count == 0 or self.n == 0:
            return np.full(self.n, np.nan), np.full(self.n, np.nan)
        recent = self.positions(self.count - self.window)
        ratio = quiet_nan(np.nanmedian, self.ratio[:, recent], axis=1)  # all-NaN rows: NaN
        late = quiet_nan(np.nanmean, self.late[:, recent], axis=1)
        ft = quiet_nan(np.nanmedian, self.f_norm[recent])
        score = np.where(np.isfinite(ratio), 1.0 / ratio, np.nan)
        if not np.isfinite(ft) or ft <= 0:
            return score, late
        lat_score = 1.0 - np.clip(late / ft, 0, 0.99)
        score = np.where(np.isfinite(score), score, lat_score)
        return score, late
