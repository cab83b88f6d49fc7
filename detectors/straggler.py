"""Peer-lateness straggler detector: which ranks do their peers keep waiting for?

Per frame (one training step), each rank's *lateness* is the time its peers spent waiting for it
inside collectives (see :mod:`failslow.detectors.lateness`). A compute straggler is late in
**every** communicator it belongs to, while a rank that is merely delayed by someone else (the
straggler's tensor-parallel peers, or its pipeline neighbours) is on time in at least one of them:
so a rank's lateness is the *minimum* over the comm kinds it took part in -- the kinds the rule
models (data, tensor parallel, world); groups of other kinds (expert, context parallel, ``other``
such as an embedding group spanning stages) count only for a rank in none of those, and never
veto a straggler. When step records exist,
the rank's compute time (step time minus time inside communication, on its own clock) must also
exceed its role peers' (leave-one-out median within each tensor/data/expert-parallel group), as in
NVIDIA nvidia-resiliency-ext's straggler scores, where communication time is excluded because
in a collective the slow rank waits least.

A rank must also stand out from the job's own noise. With 8 or more ranks the noise is the robust
spread of this frame's ratios across ranks. Below 8 ranks one frame says too little, so the
spread is pooled over the last ``pool_frames`` frames of every rank (median/MAD, robust to one
slow rank): a small job on busy or shared machines, whose ranks take turns being a little late,
needs a bigger and more persistent difference to convince than a quiet one. Until
``min_pool_frames`` frames are pooled a small job raises nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from failslow.detectors.blind import (
    WAITED,
    Observability,
    RollingLateness,
    unobservable,
    waits_least,
)
from failslow.detectors.defaults import DEFAULTS
from failslow.detectors.robust import MAD_SCALE, group_median, loo_median
from failslow.detectors.types import KIND_INDEX, P2P, Frame, JobShape, PeerGroups
from failslow.detectors.vocab import CommKind
from failslow.detectors.work import JobWork, reported_work, unequal_work

# The kinds the min rule models: members are peers doing the same work at the same time, so a
# straggler is late in every one of them. Pipeline comms (p2p pairs) carry structural lateness:
# stages run different schedules, so being "late" there says nothing about speed.
MODELED = np.array([KIND_INDEX[k] for k in (CommKind.DP, CommKind.TP, CommKind.WORLD)])
# Kinds it does not model: expert- and context-parallel groups (unequal work: MoE routing,
# sequence shards) and ``other`` (e.g. Megatron's embedding group joining the first and last
# stage, whose members run different schedules). Their lateness is evidence for a rank in no
# modeled group, and never vetoes one that is late in its own data/tensor-parallel groups.
ADVISORY = np.array([KIND_INDEX[k] for k in (CommKind.EP, CommKind.CP, CommKind.OTHER)])
NONE = np.zeros(0, dtype=bool)  # no rank to learn observability from
TP, DP = KIND_INDEX[CommKind.TP], KIND_INDEX[CommKind.DP]


@dataclass(frozen=True, slots=True)
class FrameScores:
    """Per-rank scores of one frame. NaN = unknown (rank absent, or no step records)."""

    index: int
    frame_time: float  # seconds: the job's step time in this frame (or the frame length)
    late: np.ndarray  # seconds peers waited for the rank in this frame (min over comm kinds)
    late_fraction: np.ndarray  # late / frame_time
    compute: np.ndarray  # seconds outside communication
    compute_ratio: np.ndarray  # compute / role peers' compute (min over the rank's groups)
    suspect: np.ndarray  # bool: crosses the thresholds in this frame
    elevated: np.ndarray  # bool: crosses the relaxed thresholds (hysteresis, onset dating)
    strong: np.ndarray  # bool: far past the thresholds (fast opening)
    # bool: the compute ratio stands out of the job's noise (relaxed; empty: not known)
    beyond_noise: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # bool: the compute ratio is past ``compute_ratio`` and far out of the noise (z >= 3)
    standout: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # a small job's noise: the robust spread of its ranks' compute ratios pooled over its recent
    # frames (NaN for jobs of 8+ ranks, or while too few frames are pooled)
    small_noise: float = float("nan")
    # compute unknown for most ranks: ``small_noise`` is then the pooled spread of lateness
    blind: bool = False

    @property
    def shaky(self) -> bool:
        """A small job on shared CPUs (``small_noise`` >= ``DEFAULTS.noisy_small_spread``, or
        ``noisy_blind_spread`` of lateness where compute is unobservable): a slow GPU needs more
        evidence there and p2p timings are no link evidence."""
        bar = DEFAULTS.noisy_blind_spread if self.blind else DEFAULTS.noisy_small_spread
        return self.small_noise >= bar


def min_rule_lateness(late: np.ndarray, calls: np.ndarray) -> np.ndarray:
    """Lateness per rank: the minimum over the modeled comm kinds it used; for a rank in none,
    over the advisory kinds it used; p2p as the last fallback."""
    out = late[:, P2P].astype(float)
    for kinds in (ADVISORY, MODELED):  # the later wins where it applies
        used = calls[:, kinds] > 0
        some = used.any(axis=1)
        out[some] = np.where(used, late[:, kinds], np.inf).min(axis=1)[some]
    return out


def _min_over_groups(
    values: np.ndarray, groups: PeerGroups, against: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> np.ndarray:
    """``against(value, leave-one-out median of its group)``, minimum over the groups of each
    slot (NaN where no group gives a finite value)."""
    n = values.shape[0]
    out = np.full(n, np.inf)
    for stack in groups.stacks:
        inside = stack < n
        g = np.where(inside, stack, 0)
        vals = np.where(inside, values[g], np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            score = against(vals, loo_median(vals))
        ok = inside & np.isfinite(score)
        np.fmin.at(out, g[ok], score[ok])
    out[~np.isfinite(out)] = np.nan
    return out


def peer_excess(values: np.ndarray, groups: PeerGroups) -> np.ndarray:
    """``value - leave-one-out median of its group``, minimum over the groups of each slot
    (NaN where it has no peer with a value)."""
    return _min_over_groups(values, groups, np.subtract)


def pipeline_delayed(frame: Frame, groups: PeerGroups) -> np.ndarray:
    """Per rank: is its lateness inherited from a pipeline neighbour? A rank that waited in its
    p2p operations longer than its role peers (same stage) by at least half the time its peers
    waited for it per collective was held up by the stage before or after it -- a slow
    neighbour or a slow link between them -- not by its own compute. (The neighbour, the real
    culprit, waited no longer than its own peers.) Per collective: overlapping collectives
    (DDP's gradient buckets) each count the same delay once more."""
    if frame.busy.shape[0] != frame.n:
        return np.zeros(frame.n, dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_call = np.where(frame.calls > 0, frame.late / np.maximum(frame.calls, 1), 0.0)
    late = min_rule_lateness(per_call, frame.calls)
    excess = peer_excess(frame.busy[:, P2P], groups)
    with np.errstate(invalid="ignore"):
        return np.nan_to_num((excess > 0) & (excess >= 0.5 * late), nan=0).astype(bool)


def peer_ratio(values: np.ndarray, groups: PeerGroups) -> np.ndarray:
    """``value / leave-one-out median of its group``, minimum over the groups of each slot."""
    return _min_over_groups(values, groups, lambda v, med: np.where(med > 0, v / med, np.nan))


class PeerLatenessDetector:
    """Stateless per-frame scorer; persistence and hysteresis live in the lifecycle tracker."""

    def __init__(
        self,
        *,
        late_fraction: float = DEFAULTS.late_fraction,
        compute_ratio: float = DEFAULTS.compute_ratio,
        relax: float = 0.5,
        strong: float = 3.0,
    ) -> None:
        if late_fraction <= 0 or compute_ratio <= 1 or not 0 < relax <= 1 or strong < 1:
            raise ValueError(
                "need late_fraction > 0, compute_ratio > 1, 0 < relax <= 1, strong >= 1"
            )
        self.late_fraction = late_fraction
        self.compute_ratio = compute_ratio
        self.relax = relax
        self.strong = strong
        self.z_suspect = 3.0
        self.z_strong = 6.0
        self.min_spread = 0.005
        self.small = 8  # below this many ranks, noise comes from the pooled history
        self.min_pool_frames = 20
        self._ratio_pool: deque[np.ndarray] = deque(maxlen=200)
        self._late_pool: deque[np.ndarray] = deque(maxlen=200)
        self.job_work = JobWork()  # the job's step time at its usual work
        self.observability = Observability()  # detectors/blind.py
        self.rolling = RollingLateness()

    def _pooled_spread(self, pool: deque[np.ndarray], values: np.ndarray) -> tuple[float, float]:
        """(median, robust spread) of the pooled history (NaN while too short); then pools
        ``values``' finite entries that are not outliers (a lasting straggler must not become
        the noise)."""
        med = spread = float("nan")
        if len(pool) >= self.min_pool_frames:
            hist = np.concatenate(pool)
            if hist.size:
                med = float(np.median(hist))
                spread = max(MAD_SCALE * float(np.median(np.abs(hist - med))), self.min_spread)
        keep = np.isfinite(values)
        if np.isfinite(spread):
            keep &= (values - med) / spread < self.z_suspect
        pool.append(values[keep])
        return med, spread

    def _z_small(self, pool: deque[np.ndarray], values: np.ndarray) -> tuple[np.ndarray, float]:
        """(z per rank, the pooled spread)."""
        med, spread = self._pooled_spread(pool, values)
        if not np.isfinite(spread):
            return np.zeros(values.shape), spread  # noise unknown yet: nothing stands out
        with np.errstate(invalid="ignore"):
            return np.where(np.isfinite(values), (values - med) / spread, np.inf), spread

    def _z(self, ratio: np.ndarray) -> np.ndarray:
        """(ratio - median) / robust spread across ranks; +inf (no noise gate) below 8 ranks."""
        finite = ratio[np.isfinite(ratio)]
        if finite.size < 8:
            return np.full(ratio.shape, np.inf)
        med = float(np.median(finite))
        spread = max(MAD_SCALE * float(np.median(np.abs(finite - med))), self.min_spread)
        with np.errstate(invalid="ignore"):
            return np.where(np.isfinite(ratio), (ratio - med) / spread, np.inf)

    def score(
        self, frame: Frame, groups: PeerGroups, work: np.ndarray | None = None
    ) -> FrameScores:
        """Score one frame. ``work``: each slot's share of the step's work relative to its
        peers (1.0 = equal; a rebalanced plan gives data-parallel ranks unequal micro-batch
        shares), by which compute times are normalised before they are compared. Where every
        rank of the frame reported its work (``Frame.work``: tokens, samples), that measured
        work is used instead (it includes any plan's shares)."""
        present = (frame.calls.sum(axis=1) > 0) | np.isfinite(frame.step_time)
        calls = frame.calls
        if unequal_work(frame):
            # data-parallel replicas had different batches: waiting there is the data's doing;
            # a rank's tensor-parallel peers share its batch, so its lateness there still counts
            calls = calls.copy()
            with_tp = calls[:, TP] > 0
            calls[with_tp, DP] = 0
        late = np.where(present, min_rule_lateness(frame.late, calls), np.nan)
        if frame.has_steps:
            frame_time = (
                float(np.nanmedian(frame.step_time))
                if np.isfinite(frame.step_time).any()
                else np.nan
            )
            compute = np.maximum(frame.step_time - frame.comm_time, 0.0)
            # where communication all but fills a step, compute is unknown (detectors/blind.py)
            compute[unobservable(frame.step_time, frame.comm_time)] = np.nan
            reported = reported_work(frame)
            if reported is not None:
                compute = compute / reported
            elif work is not None and work.shape == compute.shape:
                compute = compute / work
            ratio = peer_ratio(compute, groups)
        else:
            # A time bucket: each rank's time in it is either communication or not, so the
            # bucket length minus time inside collectives stands in for compute time.
            frame_time = (frame.end_ns - frame.start_ns) * 1e-9
            compute = np.where(present, np.maximum(frame_time - frame.comm_time, 0.0), np.nan)
            ratio = peer_ratio(compute, groups)
        if not np.isfinite(frame_time) or frame_time <= 0:
            frame_time = np.nan
        late_fraction = late / frame_time
        # pipelines: a rank held up by its neighbour is neither the straggler nor the norm (its
        # inherited lateness would raise the typical lateness and the noise of a small job);
        # in time frames too (issue 32: without step records the rank across the pipeline
        # from a throttled one was named the slow GPU)
        inherited = pipeline_delayed(frame, groups)
        own_late = np.where(inherited, np.nan, late_fraction)
        typical = np.nanmedian(own_late) if np.isfinite(own_late).any() else 0.0
        # Noise-relative: how far above typical is the rank, in robust spreads of this frame's
        # ratios? Jobs whose per-step work varies (random sequence lengths) need more to convince.
        # Few ranks, or compute unknown for most (detectors/blind.py): noise comes from the
        # pooled history
        n_present = int(present.sum())
        # a frame in which the job waits for a rank late by half a step or more says nothing of
        # how its compute and communication overlap: the waiting fills its peers' steps (a 10x
        # straggler made its job look blind after ~35 frames, and its incident resolved)
        waited = np.nan_to_num(own_late - typical, nan=0.0).max(initial=0.0) >= WAITED
        blind = self.observability.update(np.isfinite(ratio[present]) if not waited else NONE)
        small = n_present < self.small or blind
        small_noise = float("nan")
        if small:
            z, small_noise = self._z_small(self._ratio_pool, ratio)
            excess = own_late - typical
            z_late, late_noise = self._z_small(self._late_pool, excess)
            if blind:
                small_noise = late_noise
                z_late = np.fmax(z_late, self.rolling.z(excess, late_noise))
        else:
            z = self._z(ratio)
            z_late = np.full(ratio.shape, np.inf)
        ratio_ok = np.isnan(ratio) | ((ratio >= self.compute_ratio) & (z >= self.z_suspect))
        if blind:  # no compute to corroborate: the straggler waits least (detectors/blind.py)
            ratio_ok = waits_least(peer_ratio(frame.comm_time, groups))
        relaxed_ratio = 1.0 + (self.compute_ratio - 1.0) * self.relax
        with np.errstate(invalid="ignore"):
            suspect = (
                (late_fraction >= self.late_fraction)
                & (late_fraction - typical >= self.late_fraction)
                & (z_late >= self.z_suspect)
                & ratio_ok
            )
            elevated = (
                (late_fraction >= self.late_fraction * self.relax)
                & (ratio_ok | ~blind)
                & (np.isnan(ratio) | (ratio >= relaxed_ratio))
                # small jobs: still above their noise (hysteresis must not feed on jitter)
                & (~small | (z >= self.z_suspect * self.relax))
                & (z_late >= self.z_suspect * self.relax)
            )
            strong_ratio = 1.0 + (self.compute_ratio - 1.0) * self.strong
            # compute unknown because its peers' steps are all waiting for it (a 10x straggler:
            # 87% of their steps): strong where it also waits least (C4's slow-GPU syndrome; a
            # slow link's ends wait longest)
            waiting_for_it = suspect & np.isnan(ratio) & ~blind
            if waiting_for_it.any():  # (a peer ratio of comm time only then: a hot path)
                waiting_for_it &= waits_least(peer_ratio(frame.comm_time, groups))
            # Not for time frames: buckets cut steps anywhere, so a partial step can look strong.
            strong = (
                suspect
                & (late_fraction >= self.late_fraction * self.strong)
                & (((ratio >= strong_ratio) & (z >= self.z_strong)) | waiting_for_it)
                & (z_late >= self.z_strong)
                & frame.has_steps
            )
        if inherited.any():
            suspect &= ~inherited
            elevated &= ~inherited
            strong &= ~inherited
        return FrameScores(
            index=frame.index,
            frame_time=self.job_work.at_usual_work(frame, frame_time),
            late=late,
            late_fraction=late_fraction,
            compute=compute,
            compute_ratio=ratio,
            suspect=np.nan_to_num(suspect, nan=0).astype(bool),
            elevated=np.nan_to_num(elevated, nan=0).astype(bool),
            strong=np.nan_to_num(strong, nan=0).astype(bool),
            beyond_noise=np.nan_to_num(z >= self.z_suspect * self.relax, nan=0).astype(bool),
            # not in small jobs: their noise is pooled over history, and their ranks (a small
            # pipeline's on shared cores) jump by tens of percent for a few dozen steps
            standout=np.nan_to_num(
                (ratio >= self.compute_ratio) & (z >= self.z_suspect) & (not small), nan=0
            ).astype(bool),
            small_noise=small_noise,
            blind=blind,
        )


@dataclass(frozen=True, slots=True)
class NodeScores:
    """Per host: is (most of) it slow compared with the same roles on other hosts?"""

    suspect: np.ndarray  # (n_hosts,) bool
    elevated: np.ndarray  # (n_hosts,) bool
    ratio: np.ndarray  # (n_hosts,) median compute ratio of its ranks vs cross-host peers
    rank_suspect: np.ndarray  # (n,) bool: the rank looks slow against cross-host peers
    rank_ratio: np.ndarray  # (n,) compute / cross-host peers' (peer_ratio)


def node_scores(
    frame: Frame,
    scores: FrameScores,
    shape: JobShape,
    *,
    late_fraction: float,
    compute_ratio: float,
    relax: float = 0.5,
    majority: float = 0.5,
) -> NodeScores:
    """A slow node: more than ``majority`` of a host's ranks (and at least two) compute slower
    than their data-parallel peers on other hosts and make them wait. Inside the host they are
    all equally slow, so the rank-level min rule does not blame any one of them."""
    n_hosts = shape.n_hosts
    n = frame.n
    host = shape.host_of_slot[:n] if shape.host_of_slot.size >= n else np.full(n, -1)
    ratio = peer_ratio(scores.compute, shape.cross_groups)
    late = frame.late[:, KIND_INDEX[CommKind.DP]]
    with np.errstate(divide="ignore", invalid="ignore"):
        late_frac = late / scores.frame_time
    relaxed_ratio = 1.0 + (compute_ratio - 1.0) * relax
    with np.errstate(invalid="ignore"):
        sus = (ratio >= compute_ratio) & (late_frac >= late_fraction)
        ele = (ratio >= relaxed_ratio) & (late_frac >= late_fraction * relax)
    has = np.isfinite(ratio) & (host >= 0)
    total = np.bincount(host[has], minlength=n_hosts).astype(float)
    bad = np.bincount(host[has & sus], minlength=n_hosts).astype(float)
    warm = np.bincount(host[has & ele], minlength=n_hosts).astype(float)
    med = group_median(ratio, np.where(has, host, -1), n_hosts)
    with np.errstate(divide="ignore", invalid="ignore"):
        suspect = (total > 0) & (bad >= 2) & (bad / total > majority)
        elevated = (total > 0) & (warm >= 2) & (warm / total > majority)
    return NodeScores(suspect, elevated, med, np.nan_to_num(sus, nan=0).astype(bool) & has, ratio)
