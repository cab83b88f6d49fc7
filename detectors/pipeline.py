"""Per-job detection pipeline: frames (and hang snapshots) in, findings out.

Fusion: every detector proposes suspects per frame; one tracker per incident kind turns them into
persistent conditions (persistence before opening, hysteresis before resolving). A slow host
explains its ranks (no slow_gpu for them); a job-wide slowdown is only reported when no culprit
(GPU, node or link) is suspected. Onsets are dated by change points on the subject's own signal.
Pure and clock-free: ``detected_ns`` is the end of the newest frame a decision used, so detection
delay does not depend on replay speed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from failslow.detectors.changepoint import OnlineChangeDetector
from failslow.detectors.findings import Finding, date_onset, rounded
from failslow.detectors.hang import HangDetector, HangFinding, HangSnapshot
from failslow.detectors.hosts import host_outlier_scores
from failslow.detectors.lifecycle import ConditionTracker, KeyedTracker, run_start
from failslow.detectors.link import LinkDetector, LinkScores
from failslow.detectors.robust import group_median, quiet_nan
from failslow.detectors.straggler import (
    FrameScores,
    NodeScores,
    PeerLatenessDetector,
    node_scores,
)
from failslow.detectors.types import Frame, JobShape

__all__ = ["Finding", "JobPipeline"]

REDATE_AFTER = 6  # frames after opening: the change then has enough samples on both sides


@dataclass(slots=True)
class _Open:
    kind: str
    onset_pos: int  # absolute frame counter of the onset
    onset_index: int
    onset_ns: int
    detected_index: int
    detected_ns: int
    slots: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    redate_at: int = -1  # frame counter at which to re-date the onset with more data
    # the numbers of the last report while open: a resolution reports what the fault was, not
    # the recovered frames it is decided on
    last: tuple[float, float, float, str, dict[str, Any]] | None = None


def _fading(last: tuple[float, float, float, str, dict[str, Any]] | None, now: float) -> bool:
    """An update whose subject has lost more than half of its slowdown since the last report:
    the condition is fading out (recovered frames awaiting hysteresis), not a new level."""
    if last is None or not np.isfinite(last[1]) or last[1] <= 1.0:
        return False
    return not np.isfinite(now) or now - 1.0 < 0.5 * (last[1] - 1.0)


def _explained(busy: set[str], hosts: tuple[str, ...], edges: tuple[tuple[str, str], ...]) -> bool:
    """Can compute-slow hosts explain a link suspect? A NIC: when its host is one of them. Host
    pairs: when every candidate pair has an end on one (a slow rank slows the rings through it,
    not a ring elsewhere)."""
    if edges:
        return all(a in busy or b in busy for a, b in edges)
    return bool(busy.intersection(hosts))


def _med(a: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    return float(np.nanmedian(a)) if np.isfinite(a).any() else float("nan")


class JobPipeline:
    """Detector state for one job: rings of recent scores, trackers per kind, baselines."""

    def __init__(
        self,
        *,
        late_fraction: float = 0.03,
        compute_ratio: float = 1.05,
        link_ratio: float = 0.85,
        job_slowdown_ratio: float = 1.1,
        window: int = 5,
        open_after: int = 4,
        resolve_after: int = 8,
        warmup_frames: int = 5,
        baseline_frames: int = 500,
        baseline_block: int = 10,
        history: int = 64,
        update_every: int = 5,
        hang_startup_s: float = 60.0,
        hang_floor_s: float = 2.0,
        dead_after_s: float = 5.0,
    ) -> None:
        self.detector = PeerLatenessDetector(
            late_fraction=late_fraction, compute_ratio=compute_ratio
        )
        self.links = LinkDetector(slow_ratio=link_ratio)
        self.hangs = HangDetector(
            floor_s=hang_floor_s, dead_after_s=dead_after_s, startup_s=hang_startup_s
        )
        self.job_cpd = OnlineChangeDetector()
        track = {"window": window, "open_after": open_after, "resolve_after": resolve_after}
        self.tracker = ConditionTracker(**track)  # slow_gpu, over rank slots
        self.hosts = ConditionTracker(**track)  # slow_node, over host indices
        self.link_keys = KeyedTracker(**track)  # slow_link subjects
        # the job signal already spans two frames (min of the last two), so one strong reading opens
        self.job_keys = KeyedTracker(**track, fast_after=1)  # the job_slowdown subject
        self.late_fraction = late_fraction
        self.compute_ratio = compute_ratio
        self.job_slowdown_ratio = job_slowdown_ratio
        self.window = window
        self.warmup_frames = warmup_frames
        self.update_every = update_every
        self.h = history
        self.n = 0
        self.count = 0  # frames seen
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
        # Baseline: the fastest sustained step time recently seen. Faults only slow a job down,
        # so the minimum over block medians ignores them (and checkpoint stalls) without needing
        # to know when they happened; a lasting legitimate slow-down is adopted once the faster
        # blocks age out of the window.
        self.block = baseline_block
        self._block: list[float] = []
        self.blocks: deque[float] = deque(maxlen=max(1, baseline_frames // baseline_block))
        self.opened: dict[tuple[str, str], _Open] = {}
        self.has_steps = True
        self.last_scores: FrameScores | None = None
        self.last_links: LinkScores | None = None
        self.shape: JobShape | None = None
        self.comm_typical = np.zeros(0)  # per comm: EWMA of the mean transfer time (s)
        # Individual baseline (NVIDIA's "individual score"): each rank's usual compute ratio vs
        # its peers, an EWMA that never learns from elevated frames. A moderate deviation counts
        # only as a change from it; a static one only when it is large (``static_ratio``).
        self.own_ratio = np.zeros(0)
        self._culprit_seen: deque[bool] = deque(maxlen=2)
        self.static_ratio = 1.0 + 5.0 * (compute_ratio - 1.0)
        self.work: np.ndarray | None = None  # per-slot work share (a rebalanced plan), 1 = equal
        self._pending_work: tuple[int | None, np.ndarray | None] | None = None

    def set_work(self, work: np.ndarray | None, *, from_index: int | None = None) -> None:
        """Adopt a new plan's per-slot work shares from frame ``from_index`` on (the step at
        which the job applied it; None = the next frame): compute times are then compared per
        unit of work, and the job's baseline step time is learned afresh (the plan changed
        what is normal)."""
        weights = None if work is None else np.asarray(work, dtype=float)
        self._pending_work = (from_index, weights)

    def _adopt_work(self, frame: Frame) -> None:
        pending = self._pending_work
        if pending is None:
            return
        from_index, weights = pending
        if from_index is not None and frame.has_steps and frame.index < from_index:
            return
        self.work = weights
        self._pending_work = None
        self.blocks.clear()
        self._block = []

    # -- state ---------------------------------------------------------------------------------
    def _ensure(self, n: int, n_comms: int) -> None:
        if n > self.n:
            extra = n - self.n
            self.elevated = np.vstack([self.elevated, np.zeros((extra, self.h), bool)])
            self.suspect = np.vstack([self.suspect, np.zeros((extra, self.h), bool)])
            for name in ("compute", "late", "ratio", "cross"):
                arr = getattr(self, name)
                setattr(self, name, np.vstack([arr, np.full((extra, self.h), np.nan, np.float32)]))
            self.tracker.ensure(n)
            self.own_ratio = np.concatenate([self.own_ratio, np.full(extra, np.nan)])
            self.n = n
        if n_comms > self.link_ratio.shape[0]:
            extra = n_comms - self.link_ratio.shape[0]
            self.link_ratio = np.vstack(
                [self.link_ratio, np.full((extra, self.h), np.nan, np.float32)]
            )
            self.comm_typical = np.concatenate([self.comm_typical, np.full(extra, np.nan)])

    def seed_open(
        self,
        kind: str,
        subject: str,
        *,
        slots: tuple[int, ...],
        hosts: tuple[str, ...],
        onset_index: int | None,
        onset_ns: int,
        host_index: int | None = None,
    ) -> None:
        """Resume an incident that was open before a restart."""
        idx = onset_index if onset_index is not None else -1
        info = _Open(kind, self.count, idx, onset_ns, idx, onset_ns, slots, hosts)
        if kind == "slow_gpu" and slots:
            self._ensure(slots[0] + 1, 0)
            self.tracker.seed_open(slots[0])
        elif kind == "slow_node" and host_index is not None:
            self.hosts.ensure(host_index + 1)
            self.hosts.seed_open(host_index)
        elif kind == "slow_link":
            self.link_keys.seed_open(f"{kind}/{subject}")
        elif kind == "job_slowdown":
            self.job_keys.seed_open(f"{kind}/{subject}")
        self.opened[(kind, subject)] = info

    def _positions(self, since: int) -> np.ndarray:
        """Ring positions of frames with absolute counter >= since (oldest first)."""
        first = max(since, self.count - self.h, 0)
        return np.arange(first, self.count) % self.h

    def baseline(self) -> float:
        """Healthy job step time (NaN until one block of frames after warm-up was seen)."""
        return min(self.blocks) if self.blocks else float("nan")

    # -- processing ----------------------------------------------------------------------------
    def process(self, frame: Frame, shape: JobShape) -> list[Finding]:
        # Floating-point warnings (0/0 for ranks without data) off, in this thread only
        # (np.errstate is thread-local; all-NaN slices go through quiet_nan, which never warns).
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return self._process(frame, shape)

    def _process(self, frame: Frame, shape: JobShape) -> list[Finding]:
        self.shape = shape
        n_comms = shape.comm_kind.size
        self._ensure(frame.n, n_comms)
        self._adopt_work(frame)
        work = self.work if self.work is not None and self.work.size == frame.n else None
        scores = self.detector.score(frame, shape.groups, work)
        nodes = node_scores(
            frame, scores, shape, late_fraction=self.late_fraction, compute_ratio=self.compute_ratio
        )
        busy = {shape.hosts.index(h) for h in self._compute_hosts(scores) if h in shape.hosts}
        links = self.links.score(frame, shape, busy)
        self.last_scores, self.last_links = scores, links
        self.has_steps = frame.has_steps
        self._record(frame, scores, nodes, links, n_comms)
        self.count += 1
        if frame.has_steps and np.isfinite(scores.frame_time):
            self.job_cpd.update(scores.frame_time)
        if self.count <= self.warmup_frames:
            return []
        findings: list[Finding] = []
        findings += self._redate(frame)
        findings += self._ranks(frame, scores, nodes)
        findings += self._nodes(frame, nodes)
        findings += self._links(frame, links, scores)
        findings += self._job(frame, scores, nodes, links)
        if self.update_every and self.count % self.update_every == 0:
            fresh = {(f.kind, f.subject) for f in findings}
            for key, info in list(self.opened.items()):
                if key not in fresh and info.kind != "hang":
                    findings.append(self._finding("updated", info, key[1], frame))
        if frame.has_steps and np.isfinite(scores.frame_time):
            self._block.append(scores.frame_time)
            if len(self._block) >= self.block:
                self.blocks.append(float(np.median(self._block)))
                self._block = []
        return findings

    def _record(
        self, frame: Frame, s: FrameScores, nodes: NodeScores, links: LinkScores, n_comms: int
    ) -> None:
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

    def _gpu_signal(self, slot: int, pos: np.ndarray) -> np.ndarray:
        ratio = self.ratio[slot, pos]
        return ratio if np.isfinite(ratio).sum() >= 7 else self.late[slot, pos]

    def _redate(self, frame: Frame) -> list[Finding]:
        """Re-date slow-GPU onsets once enough frames after the change exist for ruptures."""
        out = []
        for key, info in self.opened.items():
            if info.kind != "slow_gpu" or info.redate_at != self.count:
                continue
            slot = info.slots[0]
            pos = self._positions(0)
            start = date_onset(
                self._gpu_signal(slot, pos), self.elevated[slot, pos], self.suspect[slot, pos]
            )
            onset_pos = self.count - len(pos) + start
            q = onset_pos % self.h
            # an onset after the detection is not an onset (a plan changed the signal since)
            later = int(self.f_index[q]) > info.detected_index
            if onset_pos != info.onset_pos and not later:
                q = onset_pos % self.h
                info.onset_pos, info.onset_index, info.onset_ns = (
                    onset_pos,
                    int(self.f_index[q]),
                    int(self.f_start[q]),
                )
                out.append(self._finding("updated", info, key[1], frame))
        return out

    # -- kinds ---------------------------------------------------------------------------------
    def _ranks(self, frame: Frame, s: FrameScores, nodes: NodeScores) -> list[Finding]:
        shape = self.shape
        assert shape is not None
        host = (
            shape.host_of_slot[: frame.n]
            if shape.host_of_slot.size >= frame.n
            else np.full(frame.n, -1)
        )
        on_slow_host = np.zeros(frame.n, dtype=bool)
        self.hosts.ensure(nodes.suspect.size)
        bad_hosts = np.flatnonzero(nodes.suspect | self.hosts.open[: nodes.suspect.size])
        if bad_hosts.size:
            on_slow_host = np.isin(host, bad_hosts)
        n = frame.n
        own = self.own_ratio[:n]
        with np.errstate(invalid="ignore", divide="ignore"):
            change = s.compute_ratio / own
            changed = np.isnan(change) | (change >= self.compute_ratio)
            big = s.compute_ratio >= self.static_ratio
        suspect = s.suspect & ~on_slow_host & (changed | big)  # the node explains its ranks
        strong = s.strong & (changed | big)
        trans = self.tracker.update(suspect, s.elevated, np.isfinite(s.late), strong)
        learn = np.isfinite(s.compute_ratio) & ~s.elevated & ~self.tracker.open[:n]
        self.own_ratio[:n] = np.where(
            learn, np.where(np.isnan(own), s.compute_ratio, 0.9 * own + 0.1 * s.compute_ratio), own
        )
        out = []
        for slot in trans.opened.tolist():
            pos = self._positions(0)
            start = date_onset(
                self._gpu_signal(slot, pos), self.elevated[slot, pos], self.suspect[slot, pos]
            )
            info = self._open("slow_gpu", start, len(pos), frame, slots=(int(slot),))
            info.redate_at = self.count + REDATE_AFTER
            hostname = shape.hosts[host[slot]] if host[slot] >= 0 else None
            info.hosts = (hostname,) if hostname else ()
            self.opened[("slow_gpu", f"slot:{slot}")] = info
            out.append(self._finding("opened", info, f"slot:{slot}", frame))
        for slot in trans.resolved.tolist():
            info = self.opened.pop(("slow_gpu", f"slot:{slot}"), None) or self._open(
                "slow_gpu",
                len(self._positions(0)) - 1,
                len(self._positions(0)),
                frame,
                slots=(int(slot),),
            )
            out.append(self._finding("resolved", info, f"slot:{slot}", frame))
        return out

    def _nodes(self, frame: Frame, nodes: NodeScores) -> list[Finding]:
        shape = self.shape
        assert shape is not None
        n_hosts = nodes.suspect.size
        self.hosts.ensure(n_hosts)
        strong = nodes.suspect & (nodes.ratio >= 1 + 3 * (self.compute_ratio - 1))
        trans = self.hosts.update(
            nodes.suspect, nodes.elevated | nodes.suspect, np.isfinite(nodes.ratio), strong
        )
        out = []
        host = shape.host_of_slot[: frame.n]
        for h in trans.opened.tolist():
            pos = self._positions(0)
            members = np.flatnonzero(host == h)
            signal = (
                quiet_nan(np.nanmedian, self.cross[members][:, pos], axis=0)
                if members.size
                else np.zeros(pos.size)
            )
            flags = signal >= 1 + (self.compute_ratio - 1) / 2  # no members: all False
            start = date_onset(signal, flags)
            info = self._open(
                "slow_node", start, len(pos), frame, slots=tuple(int(m) for m in members)
            )
            info.hosts = (shape.hosts[h],)
            self.opened[("slow_node", f"host:{shape.hosts[h]}")] = info
            out.append(self._finding("opened", info, f"host:{shape.hosts[h]}", frame))
        for h in trans.resolved.tolist():
            key = ("slow_node", f"host:{shape.hosts[h]}")
            info = self.opened.pop(key, None)
            if info is not None:
                out.append(self._finding("resolved", info, key[1], frame))
        return out

    def _compute_hosts(self, s: FrameScores) -> set[str]:
        """Hosts with a rank that computes slowly now (a suspect this frame, or an open
        ``slow_gpu``/``slow_node``): a starved CPU or GPU also slows the communication it drives
        (gloo reduces on the CPU, NCCL kernels share the SMs), which is no evidence of a link."""
        shape = self.shape
        assert shape is not None
        out: set[str] = set()
        host = shape.host_of_slot
        for slot in np.flatnonzero(s.suspect[: host.size]).tolist():
            if host[slot] >= 0:
                out.add(shape.hosts[host[slot]])
        for (kind, _), info in self.opened.items():
            if kind in ("slow_gpu", "slow_node"):
                out.update(h for h in info.hosts if h)
        return out

    def _links(self, frame: Frame, links: LinkScores, s: FrameScores) -> list[Finding]:
        shape = self.shape
        assert shape is not None
        busy = self._compute_hosts(s)
        # an open slow NIC explains every slow link of its host: no second incident for them
        nics = {
            h for (kind, subj), info in self.opened.items()
            if kind == "slow_link" and subj.startswith("host:") for h in info.hosts
        }  # fmt: skip
        suspects = {
            f"slow_link/{k}"
            for k, (hosts, _, edges) in links.suspects.items()
            if not _explained(busy, hosts, edges)
            and not (k.startswith("link:") and nics.intersection(hosts))
        }
        # keep an open link subject "elevated" while any of its comms stays below the relaxed ratio
        elevated = set()
        for (kind, subject), info in self.opened.items():
            if kind == "slow_link":
                comms = info.extra.get("comms", [])
                # the group's median: with dozens of comms one always dips by jitter alone
                # a comm back inside its own noise counts as healthy (small jobs: no peers)
                ratios = [
                    links.ratio[c] if links.beyond_noise[c] else 1.0
                    for c in comms
                    if c < links.ratio.size and np.isfinite(links.ratio[c])
                ]
                if ratios and float(np.median(ratios)) < self.links.relaxed_ratio:
                    elevated.add(f"slow_link/{subject}")
        strong = {
            f"slow_link/{k}"
            for k, (_, slowdown, _) in links.suspects.items()
            if np.isfinite(slowdown)
            and slowdown >= 1.0 / (1.0 - 3.0 * (1.0 - self.links.slow_ratio))
        }
        opened, resolved = self.link_keys.update(suspects, elevated, strong)
        out = []
        for key in opened:
            if not key.startswith("slow_link/"):
                continue
            subject = key.split("/", 1)[1]
            hosts, _slow, edges = links.suspects.get(subject, ((), float("nan"), ()))
            host_idx = {shape.hosts.index(h) for h in hosts if h in shape.hosts}
            comms = [
                c
                for c in range(links.slow.size)
                if links.slow[c] and host_idx & set(shape.comm_hosts[c])
            ]
            pos = self._positions(0)
            signal = (
                quiet_nan(np.nanmedian, self.link_ratio[comms][:, pos], axis=0)
                if comms
                else np.zeros(pos.size)
            )
            flags = signal < self.links.relaxed_ratio
            start = date_onset(signal, flags, increase=False)
            info = self._open("slow_link", start, len(pos), frame)
            info.hosts = tuple(hosts)
            info.extra = {"comms": comms, "edges": [list(e) for e in edges]}
            self.opened[("slow_link", subject)] = info
            out.append(self._finding("opened", info, subject, frame))
        for key in resolved:
            if not key.startswith("slow_link/"):
                continue
            subject = key.split("/", 1)[1]
            info = self.opened.pop(("slow_link", subject), None)
            if info is not None:
                out.append(self._finding("resolved", info, subject, frame))
        return out

    def _job(
        self, frame: Frame, s: FrameScores, nodes: NodeScores, links: LinkScores
    ) -> list[Finding]:
        """A job-wide slowdown: step time >= ``job_slowdown_ratio`` x baseline in both of the last
        two frames (one checkpoint stall cannot do that) while no GPU, node or link is suspected
        or blamed. Dated by the job step time's confirmed change point when there is one."""
        if not frame.has_steps:
            return []
        base = self.baseline()
        last2 = self.f_time[self._positions(self.count - 2)]
        low = float(np.min(last2)) if last2.size == 2 and np.isfinite(last2).all() else float("nan")
        ratio = low / base if np.isfinite(base) and base > 0 else float("nan")
        # ... and beyond the job's own step-time noise (3 robust spreads over the history): the
        # steps of a small job on shared CPUs vary by more than 10% with nothing wrong
        hist = self.f_time[np.isfinite(self.f_time)]
        if hist.size >= 20 and np.isfinite(ratio):
            spread = 1.4826 * float(np.median(np.abs(hist - np.median(hist))))
            if low - base < 3.0 * spread:
                ratio = min(ratio, 1.0)
        # A culprit is an open incident or one suspected in both of the last two frames: when a
        # job-wide slowdown starts, ranks enter the slow step at slightly different times and
        # look uneven for a frame.
        self._culprit_seen.append(bool(s.suspect.any() or nodes.suspect.any() or links.suspects))
        culprit = (len(self._culprit_seen) == 2 and all(self._culprit_seen)) or any(
            info.kind in ("slow_gpu", "slow_node", "slow_link", "hang")
            for info in self.opened.values()
        )
        key = "job_slowdown/job"
        jr = self.job_slowdown_ratio
        suspect = {key} if ratio >= jr and not culprit else set()
        strong = {key} if ratio >= 1 + 2 * (jr - 1) and not culprit else set()
        elevated = {key} if ratio >= 1 + (jr - 1) / 2 else set()
        opened, resolved = self.job_keys.update(suspect, elevated, strong)
        out = []
        if key in opened:
            pos = self._positions(0)
            first = self.count - len(pos)
            cps = self.job_cpd.points
            flags = self.f_time[pos] >= base * (1 + (jr - 1) / 2)
            start = run_start(flags)
            if cps and cps[-1].after >= jr * cps[-1].before and cps[-1].index >= first + start - 3:
                start = cps[-1].index - first  # sample index of the job detector = frame counter
            info = self._open("job_slowdown", max(0, min(start, len(pos) - 1)), len(pos), frame)
            self.opened[("job_slowdown", "job")] = info
            out.append(self._finding("opened", info, "job", frame))
        if key in resolved:
            info = self.opened.pop(("job_slowdown", "job"), None)
            if info is not None:
                out.append(self._finding("resolved", info, "job", frame))
        return out

    # -- hangs ---------------------------------------------------------------------------------
    def check_hang(self, snap: HangSnapshot, slot_of_rank: dict[int, int]) -> list[Finding]:
        """Called every pass (frames stop closing while a job hangs)."""
        found = self.hangs.analyse(snap)
        key = ("hang", "job")
        info = self.opened.get(key)
        if found is None:
            if info is not None and snap.last_progress_ns > info.onset_ns:
                self.opened.pop(key)
                return [self._hang_finding("resolved", info, None, snap)]
            return []
        slots = tuple(slot_of_rank[r] for r in found.roots if r in slot_of_rank)
        if info is None:
            info = _Open(
                "hang", self.count, -1, found.onset_ns, -1, found.detected_ns, slots, found.hosts
            )
            self.opened[key] = info
            return [self._hang_finding("opened", info, found, snap)]
        if slots != info.slots or found.hosts != info.hosts:
            info.slots, info.hosts = slots, found.hosts
            return [self._hang_finding("updated", info, found, snap)]
        return []

    def _hang_finding(
        self, status: str, info: _Open, found: HangFinding | None, snap: HangSnapshot
    ) -> Finding:
        reason = found.reason if found else "collectives progress again"
        evidence: dict[str, Any] = dict(found.evidence) if found else {}
        evidence.update(
            {
                "detector": "hang",
                "method": "blocked collectives past an adaptive timeout, dependency analysis",
            }
        )
        return Finding(
            kind="hang",
            status=status,
            subject="job",
            slots=info.slots,
            hosts=info.hosts,
            onset_index=None,
            onset_ns=info.onset_ns,
            detected_index=None,
            detected_ns=info.detected_ns if status == "opened" else snap.now_ns,
            slowdown=None,
            subject_slowdown=None,
            confidence=0.99 if info.slots else 0.6,
            reason=reason,
            evidence=evidence,
            has_steps=self.has_steps,
        )

    def _host_outliers(self, hosts: tuple[str, ...]) -> dict[str, Any]:
        """Robust (MCD) outlier distance of the incident's hosts among all hosts, last frame."""
        shape, s, links = self.shape, self.last_scores, self.last_links
        if shape is None or s is None or links is None or not hosts:
            return {}
        n = min(s.compute.size, shape.host_of_slot.size)
        host = shape.host_of_slot[:n]
        p = (self.count - 1) % self.h
        cross = self.cross[:n, p].astype(np.float64)
        late = s.late_fraction[:n]
        feats = np.column_stack(
            [
                group_median(cross, host, shape.n_hosts),
                group_median(late, host, shape.n_hosts),
                np.nan_to_num(links.host_slow_fraction[: shape.n_hosts], nan=0.0),
            ]
        )
        dist, pval = host_outlier_scores(feats)
        out = {}
        for h in hosts:
            if h in shape.hosts:
                i = shape.hosts.index(h)
                out[h] = {"distance": rounded(dist[i], 2), "p_value": rounded(pval[i], 6)}
        rank = np.argsort(-np.nan_to_num(dist, nan=-1.0))[:3]
        return {
            "hosts": out,
            "most_unusual": [shape.hosts[i] for i in rank if np.isfinite(dist[i])],
            "method": "robust Mahalanobis distance (MinCovDet) over per-host features",
        }

    # -- findings ------------------------------------------------------------------------------
    def _open(
        self, kind: str, start: int, ring_len: int, frame: Frame, *, slots: tuple[int, ...] = ()
    ) -> _Open:
        onset_pos = self.count - ring_len + start
        q = onset_pos % self.h
        return _Open(
            kind,
            onset_pos,
            int(self.f_index[q]),
            int(self.f_start[q]),
            frame.index,
            frame.end_ns,
            slots,
        )

    def _finding(self, status: str, info: _Open, subject: str, frame: Frame) -> Finding:
        since = self._positions(info.onset_pos)
        recent = since[-self.window :] if since.size else self._positions(self.count - 1)
        job_now = _med(self.f_time[since[-self.window :]] if since.size else self.f_time[recent])
        base = self.baseline()
        slowdown = job_now / base if np.isfinite(base) and base > 0 else float("nan")
        frame_time = _med(self.f_norm[recent])
        evidence: dict[str, Any] = {
            "job_step_time_s": rounded(job_now, 6),
            "baseline_step_time_s": rounded(base, 6),
        }
        subject_slowdown = float("nan")
        confidence = 0.9
        if info.kind == "slow_gpu":
            subject_slowdown, confidence, reason, ev = self._gpu_numbers(
                info, since, recent, frame, frame_time
            )
            evidence.update(ev)
            late_s = ev.get("lateness_s") or 0.0
            if np.isfinite(job_now) and job_now > late_s:
                evidence["step_time_without_culprit_s"] = rounded(job_now - late_s, 6)
                evidence["attributed_slowdown"] = rounded(job_now / (job_now - late_s))
        elif info.kind == "slow_node":
            members = list(info.slots)
            ratio = _med(self.cross[members][:, recent]) if members else float("nan")
            late = float("nan")
            if members:
                late = _med(quiet_nan(np.nanmax, self.late[members][:, recent], axis=0))
            subject_slowdown = ratio
            reason = (
                f"{len(members)} ranks of {info.hosts[0]} compute {ratio:.2f}x their data-parallel"
                " peers on other"
                f" hosts, together"
            )
            evidence.update(
                {
                    "detector": "slow_node",
                    "compute_ratio": rounded(ratio),
                    "lateness_s": rounded(late, 6),
                    "method": "compute vs cross-host role peers, majority of the host's ranks",
                }
            )
            if np.isfinite(job_now) and np.isfinite(late) and job_now > late:
                evidence["attributed_slowdown"] = rounded(job_now / (job_now - late))
        elif info.kind == "slow_link":
            comms = info.extra.get("comms", [])
            ratio = _med(self.link_ratio[comms][:, recent]) if comms else float("nan")
            subject_slowdown = (
                1.0 / ratio if ratio and np.isfinite(ratio) and ratio > 0 else float("nan")
            )
            edges = info.extra.get("edges", [])
            where = (
                f"the NIC of {info.hosts[0]}"
                if len(info.hosts) == 1
                else (
                    f"the link between {info.hosts[0]} and {info.hosts[1]}"
                    if len(edges) == 1
                    else f"one of {len(edges)} ring links among {', '.join(info.hosts)}"
                    " (passive data cannot tell which)"
                )
            )
            reason = (
                f"{len(comms)} communicators crossing {where} move data at {ratio:.0%} of their"
                " usual bus bandwidth"
            )
            evidence.update(
                {
                    "detector": "slow_link",
                    "busbw_ratio": rounded(ratio),
                    "communicators": len(comms),
                    "candidate_edges": edges,
                    "ambiguous": len(edges) > 1,
                    "method": "bus bandwidth vs own best and same-kind peers; the NIC or cable"
                    " whose communicators best match the slow ones",
                }
            )
        else:  # job_slowdown
            subject_slowdown = slowdown
            reason = (
                f"job step time {job_now:.3f}s is {slowdown:.2f}x its baseline {base:.3f}s and"
                " no GPU, node or link is to blame"
            )
            evidence.update(
                {
                    "detector": "job_slowdown",
                    "method": "BOCPD + ruptures change point on job step time",
                }
            )
        if status == "opened" and info.kind in ("slow_node", "slow_link"):
            evidence["host_outliers"] = self._host_outliers(info.hosts)
        if info.last is not None and (
            status == "resolved" or _fading(info.last, subject_slowdown)
        ):  # report what the fault was, not the recovered frames awaiting hysteresis
            slowdown, subject_slowdown, confidence, reason, evidence = info.last
            evidence = dict(evidence)
        elif status != "resolved":
            info.last = (slowdown, subject_slowdown, confidence, reason, dict(evidence))
        if status == "resolved":
            reason = f"condition absent for {self.tracker.resolve_after}+ frames; " + reason
        evidence["reason"] = reason
        detected_index = (
            (frame.index if status == "resolved" else info.detected_index)
            if frame.has_steps
            else None
        )
        return Finding(
            kind=info.kind,
            status=status,
            subject=subject,
            slots=info.slots,
            hosts=info.hosts,
            onset_index=info.onset_index if frame.has_steps else None,
            onset_ns=info.onset_ns,
            detected_index=detected_index,
            detected_ns=frame.end_ns if status == "resolved" else info.detected_ns,
            slowdown=rounded(slowdown),
            subject_slowdown=rounded(subject_slowdown),
            confidence=round(confidence, 3),
            reason=reason,
            evidence=evidence,
            has_steps=frame.has_steps,
        )

    def _gpu_numbers(
        self, info: _Open, since: np.ndarray, recent: np.ndarray, frame: Frame, frame_time: float
    ) -> tuple[float, float, str, dict[str, Any]]:
        slot = info.slots[0]
        before = self._positions(info.onset_pos - self.h)
        before = before[: max(0, len(before) - len(since))]
        late_s = _med(self.late[slot, recent])
        ratio_now = _med(self.ratio[slot, recent])
        comp_now = self.compute[slot, since] if since.size else self.compute[slot, recent]
        comp_before = self.compute[slot, before]
        own_now, own_before = _med(comp_now), _med(comp_before)
        own_ok = np.isfinite(own_before) and own_before > 0 and np.isfinite(own_now)
        if frame.has_steps and own_ok and np.isfinite(comp_before).sum() >= 3:
            subject, basis = own_now / own_before, "own compute time now vs before onset"
        elif np.isfinite(ratio_now):
            subject, basis = ratio_now, "compute time vs role peers"
        elif np.isfinite(late_s) and np.isfinite(frame_time) and frame_time > late_s:
            subject, basis = (
                frame_time / (frame_time - late_s),
                "estimated from lateness (no step records)",
            )
        else:
            subject, basis = float("nan"), "unknown"
        late_fraction = (
            late_s / frame_time if frame_time and np.isfinite(frame_time) else float("nan")
        )
        suspects = int(self.tracker.suspect_count()[slot]) if slot < self.tracker.bits.size else 0
        strong_run = (
            int(self.tracker.strong_run[slot]) if slot < self.tracker.strong_run.size else 0
        )
        strength = (
            min(1.0, late_fraction / (2 * self.detector.late_fraction))
            if np.isfinite(late_fraction)
            else 0.5
        )
        evidence_frames = min(self.window, suspects + strong_run)  # a strong frame counts twice
        confidence = max(0.0, min(0.99, (max(evidence_frames, 1) / self.window) * strength))
        reason = (
            f"late in every communicator it uses in {suspects}/{self.window} recent frames: "
            f"peers wait {late_s * 1e3:.1f} ms per step ({late_fraction:.1%} of step time)"
        )
        if np.isfinite(ratio_now):
            reason += f"; compute {ratio_now:.2f}x its role peers"
        evidence = {
            "detector": "peer_lateness",
            "method": "clock-free lateness (min over comm kinds) + compute vs role peers",
            "lateness_s": rounded(late_s, 6),
            "late_fraction": rounded(late_fraction),
            "compute_ratio": rounded(ratio_now),
            "compute_s": rounded(own_now, 6),
            "compute_before_s": rounded(own_before, 6),
            "subject_slowdown_basis": basis,
            "suspect_frames": suspects,
            "window": self.window,
        }
        return subject, confidence, reason, evidence

    # -- views ---------------------------------------------------------------------------------
    def job_view(self) -> dict[str, float | int | None]:
        if self.count == 0:
            return {
                "step": None,
                "step_time_s": None,
                "baseline_step_time_s": None,
                "slowdown": None,
            }
        recent = self._positions(self.count - self.window)
        now = _med(self.f_time[recent])
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
        recent = self._positions(self.count - self.window)
        own = quiet_nan(np.nanmedian, self.ratio[:, recent], axis=1)
        cross = quiet_nan(np.nanmedian, self.cross[:, recent], axis=1)
        ratio = np.fmax(own, cross)
        return np.where(np.isfinite(ratio) & (ratio > 0), 1.0 / ratio, np.nan)

    def frame_times(self, *, since_index: int | None = None, last: int = 10) -> list[float]:
        """Step times of the newest ``last`` frames with step number >= ``since_index``."""
        pos = self._positions(self.count - self.h)
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
        recent = self._positions(self.count - self.window)
        ratio = quiet_nan(np.nanmedian, self.ratio[:, recent], axis=1)  # all-NaN rows: NaN
        late = quiet_nan(np.nanmean, self.late[:, recent], axis=1)
        ft = quiet_nan(np.nanmedian, self.f_norm[recent])
        score = np.where(np.isfinite(ratio), 1.0 / ratio, np.nan)
        if not np.isfinite(ft) or ft <= 0:
            return score, late
        lat_score = 1.0 - np.clip(late / ft, 0, 0.99)
        score = np.where(np.isfinite(score), score, lat_score)
        return score, late
