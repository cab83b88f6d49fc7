"""Fusion: the rules that turn per-frame suspects into persistent conditions, one per kind.

Every detector proposes suspects per frame; one tracker per kind turns them into conditions
(persistence before opening, hysteresis before resolving). A slow host explains its ranks (no
slow_gpu for them); compute-slow hosts explain the slow links through them; a job-wide slowdown is
only reported when no culprit (GPU, node or link) is suspected. Onsets are dated by change points
on the subject's own signal.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from failslow.detectors import link_rules, own
from failslow.detectors.blind import on_slow_nic
from failslow.detectors.changepoint import OnlineChangeDetector
from failslow.detectors.chronic import date_chronic
from failslow.detectors.defaults import DEFAULTS
from failslow.detectors.findings import Finding, OpenCondition, date_onset, hang_finding
from failslow.detectors.hang import HangDetector, HangSnapshot
from failslow.detectors.history import FrameHistory
from failslow.detectors.lifecycle import ConditionTracker, KeyedTracker, run_start
from failslow.detectors.link import LinkDetector, LinkScores
from failslow.detectors.localise import LinkSuspect
from failslow.detectors.report import Reporter
from failslow.detectors.robust import quiet_nan
from failslow.detectors.straggler import FrameScores, NodeScores
from failslow.detectors.types import Frame, JobShape
from failslow.detectors.vocab import (
    FindingStatus,
    IncidentKind,
    Subject,
)

REDATE_AFTER = 6  # frames after opening: the change then has enough samples on both sides
OPENED, UPDATED, RESOLVED = FindingStatus.OPENED, FindingStatus.UPDATED, FindingStatus.RESOLVED
Key = tuple[IncidentKind, Subject]


class Conditions:
    """The open conditions of one job and the trackers that open and resolve them."""

    def __init__(
        self,
        *,
        history: FrameHistory,
        links: LinkDetector,
        hangs: HangDetector,
        late_fraction: float,
        compute_ratio: float,
        job_slowdown_ratio: float,
        window: int,
        open_after: int,
        resolve_after: int,
        severity: tuple[float, float] = (DEFAULTS.major_slowdown, DEFAULTS.critical_slowdown),
    ) -> None:
        self.history = history
        self.links = links
        self.hangs = hangs
        self.compute_ratio = compute_ratio
        self.static_ratio = 1.0 + 5.0 * (compute_ratio - 1.0)
        self.job_slowdown_ratio = job_slowdown_ratio
        track = {"window": window, "open_after": open_after, "resolve_after": resolve_after}
        self.gpus = ConditionTracker(**track)  # slow_gpu, over rank slots
        self.hosts = ConditionTracker(**track)  # slow_node, over host indices
        self.link_keys: KeyedTracker[Subject] = KeyedTracker(**track)  # slow_link subjects
        self.job_keys: KeyedTracker[Subject] = KeyedTracker(**track)  # the job slowdown
        self.job_cpd = OnlineChangeDetector()  # change points of the job's step time
        self.reporter = Reporter(history=history, gpus=self.gpus, window=window,
                                 late_fraction=late_fraction, severity=severity)  # fmt: skip
        self.opened: dict[Key, OpenCondition] = {}
        self._culprit_seen: deque[bool] = deque(maxlen=2)
        self.shape: JobShape | None = None

    # -- state ---------------------------------------------------------------------------------
    def seed_open(
        self,
        kind: IncidentKind,
        subject: Subject,
        *,
        slots: tuple[int, ...],
        hosts: tuple[str, ...],
        onset_index: int | None,
        onset_ns: int,
        host_index: int | None = None,
    ) -> None:
        """Resume a condition that was open before a restart."""
        idx = onset_index if onset_index is not None else -1
        count = self.history.count
        info = OpenCondition(kind, count, idx, onset_ns, idx, onset_ns, slots, hosts)
        if kind == IncidentKind.SLOW_GPU and slots:
            self.history.ensure(slots[0] + 1, 0)
            self.gpus.ensure(self.history.n)
            self.gpus.seed_open(slots[0])
        elif kind == IncidentKind.SLOW_NODE and host_index is not None:
            self.hosts.ensure(host_index + 1)
            self.hosts.seed_open(host_index)
        elif kind == IncidentKind.SLOW_LINK:
            self.link_keys.seed_open(subject)
        elif kind == IncidentKind.JOB_SLOWDOWN:
            self.job_keys.seed_open(subject)
        self.opened[(kind, subject)] = info

    def _open(
        self,
        kind: IncidentKind,
        start: int,
        ring_len: int,
        frame: Frame,
        *,
        slots: tuple[int, ...] = (),
    ) -> OpenCondition:
        hist = self.history
        onset_pos = hist.count - ring_len + start
        q = onset_pos % hist.h
        return OpenCondition(
            kind,
            onset_pos,
            int(hist.f_index[q]),
            int(hist.f_start[q]),
            frame.index,
            frame.end_ns,
            slots,
        )

    def updates(self, frame: Frame, fresh: list[Finding]) -> list[Finding]:
        """A report on every open condition (but hangs) not reported in this frame."""
        seen = {(f.kind, f.subject) for f in fresh}
        return [
            self.reporter.finding(UPDATED, info, key[1], frame)
            for key, info in list(self.opened.items())
            if key not in seen and info.kind != IncidentKind.HANG
        ]

    # -- slow GPUs -----------------------------------------------------------------------------
    def redate(self, frame: Frame) -> list[Finding]:
        """Re-date slow-GPU onsets once enough frames after the change exist for ruptures."""
        hist = self.history
        out = []
        for key, info in self.opened.items():
            if info.kind != IncidentKind.SLOW_GPU or info.redate_at != hist.count:
                continue
            slot = info.slots[0]
            pos = hist.positions(0)
            start = date_onset(
                hist.gpu_signal(slot, pos), hist.elevated[slot, pos], hist.suspect[slot, pos]
            )
            onset_pos = hist.count - len(pos) + start
            q = onset_pos % hist.h
            # an onset after the detection is not an onset (a plan changed the signal since)
            later = int(hist.f_index[q]) > info.detected_index
            if onset_pos != info.onset_pos and not later:
                info.onset_pos, info.onset_index, info.onset_ns = (
                    onset_pos,
                    int(hist.f_index[q]),
                    int(hist.f_start[q]),
                )
                out.append(self.reporter.finding(UPDATED, info, key[1], frame))
        return out

    def gpus_step(
        self, frame: Frame, s: FrameScores, nodes: NodeScores, links: LinkScores | None = None
    ) -> list[Finding]:
        shape, hist = self.shape, self.history
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
        is_open = self.gpus.open[:n]
        noisy = s.beyond_noise.shape == (n,)
        v = own.judge(s.compute_ratio, hist.own_ratio[:n], suspect=s.suspect, strong=s.strong,
                      elevated=s.elevated, is_open=is_open, compute_ratio=self.compute_ratio,
                      static_ratio=self.static_ratio,
                      beyond_noise=s.beyond_noise if noisy else None,
                      standout=s.standout if noisy else None)  # fmt: skip
        suspect = v.suspect & ~on_slow_host  # the node explains its ranks
        if s.blind and links is not None:
            # lateness alone cannot tell a slow GPU from a slow NIC that every call of the
            # rank crosses: the link explains it (detectors/blind.py)
            suspect &= ~on_slow_nic(host, links.host_slow_fraction)
        # a small job on shared CPUs needs more evidence (DEFAULTS.noisy_small_evidence)
        evidence = (
            (DEFAULTS.noisy_blind_evidence if s.blind else DEFAULTS.noisy_small_evidence)
            if s.shaky
            else None
        )
        # 1.4x as slow as its peers: 3 frames in a row open (not in a small job on shared
        # CPUs, whose ranks run 2-3x for a few frames with nothing wrong, nor a blind one)
        # (or its compute unknown because its peers' steps are all waiting for it: a 10x one)
        severe = None if s.shaky or s.blind else (
            (s.compute_ratio >= DEFAULTS.severe_ratio) | (np.isnan(s.compute_ratio) & s.strong)
        )
        trans = self.gpus.update(suspect, v.elevated, np.isfinite(s.late), v.strong,
                                 evidence=evidence, severe=severe)  # fmt: skip
        hist.learn_own_ratio(s.compute_ratio, v.learn)
        out = []
        kind = IncidentKind.SLOW_GPU
        for slot in trans.opened.tolist():
            pos = hist.positions(0)
            start = date_onset(
                hist.gpu_signal(slot, pos), hist.elevated[slot, pos], hist.suspect[slot, pos]
            )
            info = self._open(kind, start, len(pos), frame, slots=(int(slot),))
            if not date_chronic(info, hist, info.slots, self.compute_ratio):
                info.redate_at = hist.count + REDATE_AFTER
            hostname = shape.hosts[host[slot]] if host[slot] >= 0 else None
            info.hosts = (hostname,) if hostname else ()
            self.opened[(kind, Subject.slot(slot))] = info
            out.append(self.reporter.finding(OPENED, info, Subject.slot(slot), frame))
        for slot in trans.resolved.tolist():
            ring = len(hist.positions(0))
            info = self.opened.pop((kind, Subject.slot(slot)), None) or self._open(
                kind, ring - 1, ring, frame, slots=(int(slot),)
            )
            out.append(self.reporter.finding(RESOLVED, info, Subject.slot(slot), frame))
        return out

    # -- slow nodes ----------------------------------------------------------------------------
    def nodes_step(self, frame: Frame, nodes: NodeScores) -> list[Finding]:
        shape, hist = self.shape, self.history
        assert shape is not None
        n_hosts = nodes.suspect.size
        self.hosts.ensure(n_hosts)
        strong = nodes.suspect & (nodes.ratio >= 1 + 3 * (self.compute_ratio - 1))
        # an open slow node stays elevated while its ranks compute slower per unit of work than
        # their peers elsewhere, late or not (a rebalance hides the lateness, not the node)
        still_slow = self.hosts.open[:n_hosts] & (nodes.ratio >= self.compute_ratio)
        elevated = nodes.elevated | nodes.suspect | still_slow
        trans = self.hosts.update(nodes.suspect, elevated, np.isfinite(nodes.ratio), strong,
                                  severe=nodes.ratio >= DEFAULTS.severe_ratio)  # fmt: skip
        out = []
        kind = IncidentKind.SLOW_NODE
        host = shape.host_of_slot[: frame.n]
        for h in trans.opened.tolist():
            pos = hist.positions(0)
            members = np.flatnonzero(host == h)
            signal = (
                quiet_nan(np.nanmedian, hist.cross[members][:, pos], axis=0)
                if members.size
                else np.zeros(pos.size)
            )
            flags = signal >= 1 + (self.compute_ratio - 1) / 2  # no members: all False
            start = date_onset(signal, flags)
            info = self._open(kind, start, len(pos), frame, slots=tuple(int(m) for m in members))
            date_chronic(info, hist, info.slots, self.compute_ratio)
            info.hosts = (shape.hosts[h],)
            subject = Subject.host(shape.hosts[h])
            self.opened[(kind, subject)] = info
            out.append(self.reporter.finding(OPENED, info, subject, frame))
        for h in trans.resolved.tolist():
            subject = Subject.host(shape.hosts[h])
            info = self.opened.pop((kind, subject), None)
            if info is not None:
                out.append(self.reporter.finding(RESOLVED, info, subject, frame))
        return out

    def compute_hosts(self, s: FrameScores) -> set[str]:
        """Hosts with a rank that computes slowly now (``link_rules.compute_hosts``)."""
        assert self.shape is not None
        return link_rules.compute_hosts(self.shape, self.opened, s)

    # -- slow links ----------------------------------------------------------------------------
    def open_links(self) -> dict[Subject, LinkSuspect]:
        """The NICs and cables of open ``slow_link`` incidents, as link suspects."""
        return link_rules.open_links(self.opened)

    def links_step(self, frame: Frame, links: LinkScores, s: FrameScores) -> list[Finding]:
        shape, hist = self.shape, self.history
        assert shape is not None
        kind = IncidentKind.SLOW_LINK
        busy = self.compute_hosts(s)
        suspects = link_rules.new_suspects(self.opened, links, busy)
        elevated = link_rules.still_slow(self.opened, links, self.links.relaxed_ratio)
        strong = {
            k
            for k, (_, slowdown, _) in links.suspects.items()
            if np.isfinite(slowdown)
            and slowdown >= 1.0 / (1.0 - 3.0 * (1.0 - self.links.slow_ratio))
        }
        # a link whose transfers take twice as long: 3 frames in a row open (not in a small job
        # on shared CPUs, whose collectives stall with its ranks' scheduling)
        bad = DEFAULTS.severe_link
        severe = None if s.shaky else {k for k in strong if links.suspects[k][1] >= bad}
        opened, resolved = self.link_keys.update(suspects, elevated, strong, severe)
        out = []
        for subject in opened:
            hosts, _slow, edges = links.suspects.get(subject, ((), float("nan"), ()))
            comms = link_rules.own_comms(shape, links, subject, hosts, self.opened)
            pos = hist.positions(0)
            signal = (
                quiet_nan(np.nanmedian, hist.link_ratio[comms][:, pos], axis=0)
                if comms
                else np.zeros(pos.size)
            )
            flags = signal < self.links.relaxed_ratio
            start = date_onset(signal, flags, increase=False)
            info = self._open(kind, start, len(pos), frame)
            info.hosts = tuple(hosts)
            info.extra = {"comms": comms, "edges": [list(e) for e in edges]}
            self.opened[(kind, subject)] = info
            out.append(self.reporter.finding(OPENED, info, subject, frame))
        for subject in resolved:
            info = self.opened.pop((kind, subject), None)
            if info is not None:
                out.append(self.reporter.finding(RESOLVED, info, subject, frame))
        return out

    # -- job slowdown --------------------------------------------------------------------------
    def job_slowdown_open(self) -> bool:
        return (IncidentKind.JOB_SLOWDOWN, Subject.job()) in self.opened

    def job_step(
        self, frame: Frame, s: FrameScores, nodes: NodeScores, links: LinkScores
    ) -> list[Finding]:
        """A job-wide slowdown: the job's step time against its normal (``job_normal``), by at
        least ``job_slowdown_ratio`` and twice the job's step noise (a job whose steps vary by
        10% wanders by 20% between blocks with nothing wrong), as the median over the last
        ``evidence_frames()`` frames and the last three alike (sustained, and still so), in
        ``open_after`` of the last ``window`` frames, while no GPU, node or link is suspected
        or blamed. Hiccups of different ranks in consecutive steps, or one checkpoint stall,
        cannot do that. Dated by the job step time's confirmed change point when there is one."""
        if not frame.has_steps:
            return []
        hist = self.history
        ev = hist.job_evidence(self.job_slowdown_ratio)
        jr, ratio, beyond = ev.bar, ev.ratio, ev.beyond
        # A culprit is an open incident or one suspected in both of the last two frames: when a
        # job-wide slowdown starts, ranks enter the slow step at slightly different times and
        # look uneven for a frame.
        self._culprit_seen.append(bool(s.suspect.any() or nodes.suspect.any() or links.suspects))
        culprit = (len(self._culprit_seen) == 2 and all(self._culprit_seen)) or any(
            info.kind != IncidentKind.JOB_SLOWDOWN for info in self.opened.values()
        )
        kind, key = IncidentKind.JOB_SLOWDOWN, Subject.job()
        suspect = {key} if ratio >= jr and beyond and not culprit else set()
        strong = {key} if ratio >= 1 + 2 * (jr - 1) and beyond and not culprit else set()
        elevated = {key} if ratio >= 1 + (jr - 1) / 2 else set()
        opened, resolved = self.job_keys.update(suspect, elevated, strong)
        out = []
        if key in opened:
            pos = hist.positions(0)
            first = hist.count - len(pos)
            cps = self.job_cpd.points
            flags = hist.f_time[pos] >= hist.job_normal() * (1 + (jr - 1) / 2)
            start = run_start(flags)
            if cps and cps[-1].after >= jr * cps[-1].before and cps[-1].index >= first + start - 3:
                start = cps[-1].index - first  # sample index of the job detector = frame counter
            info = self._open(kind, max(0, min(start, len(pos) - 1)), len(pos), frame)
            self.opened[(kind, key)] = info
            out.append(self.reporter.finding(OPENED, info, key, frame))
        if key in resolved:
            info = self.opened.pop((kind, key), None)
            if info is not None:
                out.append(self.reporter.finding(RESOLVED, info, key, frame))
        return out

    # -- hangs ---------------------------------------------------------------------------------
    def hang_step(self, snap: HangSnapshot, slot_of_rank: dict[int, int]) -> list[Finding]:
        """Called every pass (frames stop closing while a job hangs)."""
        found = self.hangs.analyse(snap)
        key = (IncidentKind.HANG, Subject.job())
        info = self.opened.get(key)
        if found is None:
            # resolved only by progress after the hang was found: nothing blocked any more can
            # also mean its collectives were abandoned (a restart), with nothing come since
            if info is not None and snap.last_progress_ns > info.detected_ns:
                self.opened.pop(key)
                return [hang_finding(RESOLVED, info, None, snap.now_ns, self.history.has_steps)]
            return []
        slots = tuple(slot_of_rank[r] for r in found.roots if r in slot_of_rank)
        if info is None:
            info = OpenCondition(
                IncidentKind.HANG,
                self.history.count,
                -1,
                found.onset_ns,
                -1,
                found.detected_ns,
                slots,
                found.hosts,
            )
            self.opened[key] = info
            return [hang_finding(OPENED, info, found, snap.now_ns, self.history.has_steps)]
        if slots != info.slots or found.hosts != info.hosts:
            info.slots, info.hosts = slots, found.hosts
            return [hang_finding(UPDATED, info, found, snap.now_ns, self.history.has_steps)]
        return []
