"""What a finding says: the numbers (job and subject slowdown, confidence), the evidence and the
reason in words, computed from the history of an open condition."""

from __future__ import annotations

from typing import Any

import numpy as np

from failslow.detectors.defaults import DEFAULTS
from failslow.detectors.findings import (
    Finding,
    OpenCondition,
    fading,
    rounded,
    severity_of,
)
from failslow.detectors.history import FrameHistory, median
from failslow.detectors.hosts import host_outliers
from failslow.detectors.impact import critical_path, impact
from failslow.detectors.lifecycle import ConditionTracker
from failslow.detectors.link import LinkScores
from failslow.detectors.robust import quiet_nan
from failslow.detectors.straggler import FrameScores
from failslow.detectors.types import Frame, JobShape
from failslow.detectors.vocab import FindingStatus, IncidentKind, Subject

BEFORE = 20  # frames before an onset whose step times bound what the condition costs
CONTAMINATED = 1.1  # a healthy level this far above the rank's fastest recent block is not one


class Reporter:
    """Turns open conditions into findings. Reads the history; changes nothing but the
    conditions' remembered numbers."""

    def __init__(
        self,
        *,
        history: FrameHistory,
        gpus: ConditionTracker,
        window: int,
        late_fraction: float,
        severity: tuple[float, float] = (DEFAULTS.major_slowdown, DEFAULTS.critical_slowdown),
    ) -> None:
        self.severity = severity  # job slowdowns from which a finding is major, critical
        self.history = history
        self.gpus = gpus  # the slow-GPU tracker: its suspect counts say how sure a report is
        self.window = window
        self.late_fraction = late_fraction
        self.shape: JobShape | None = None
        self.scores: FrameScores | None = None
        self.links: LinkScores | None = None
        self.lopsided = False  # a plan gives ranks unequal work now (set by the pipeline)

    def observe(self, shape: JobShape, scores: FrameScores, links: LinkScores) -> None:
        """The frame being processed (host outliers are computed on it)."""
        self.shape, self.scores, self.links = shape, scores, links

    # -- slow GPU, node, link and job slowdown -------------------------------------------------
    def finding(
        self, status: FindingStatus, info: OpenCondition, subject: Subject, frame: Frame
    ) -> Finding:
        hist = self.history
        since = hist.positions(info.onset_pos)
        recent = since[-self.window :] if since.size else hist.positions(hist.count - 1)
        job_now = median(hist.f_time[since[-self.window :]] if since.size else hist.f_time[recent])
        base = hist.baseline()
        slowdown = job_now / base if np.isfinite(base) and base > 0 else float("nan")
        frame_time = median(hist.f_norm[recent])
        evidence: dict[str, Any] = {
            "job_step_time_s": rounded(job_now, 6),
            "baseline_step_time_s": rounded(base, 6),
        }
        confidence = 0.9
        if info.kind == IncidentKind.SLOW_GPU:
            subject_slowdown, confidence, reason, ev = self._gpu(
                info, since, recent, frame, frame_time
            )
            evidence.update(ev)
            evidence.update(self._cost(info, since, recent))
        elif info.kind == IncidentKind.SLOW_NODE:
            subject_slowdown, reason = self._node(info, since, recent, evidence)
        elif info.kind == IncidentKind.SLOW_LINK:
            subject_slowdown, reason = self._link(info, recent, evidence)
        else:  # job_slowdown
            subject_slowdown = slowdown
            reason = (
                f"job step time {job_now:.3f}s is {slowdown:.2f}x its baseline {base:.3f}s and"
                " no GPU, node or link is to blame"
            )
            evidence.update(
                {
                    "detector": "job_slowdown",
                    "method": "step time vs the job's normal, beyond its step noise, held over "
                    "the evidence frames; dated by BOCPD + ruptures change points",
                    "job_normal_step_time_s": rounded(hist.job_normal(), 6),
                    "step_noise": rounded(hist.step_noise()),
                    "evidence_frames": hist.evidence_frames(),
                }
            )
        if info.extra.get("chronic"):
            evidence["chronic"] = True  # slow since its first frames (detectors/chronic.py)
        if status is FindingStatus.OPENED and info.kind in (
            IncidentKind.SLOW_NODE,
            IncidentKind.SLOW_LINK,
        ):
            evidence["host_outliers"] = self.host_outliers(info.hosts)
        if info.last is not None and (
            status is FindingStatus.RESOLVED
            or fading(info.last, subject_slowdown)
            or self._recovered(info, recent)
        ):  # report what the fault was, not the recovered frames awaiting hysteresis
            slowdown, subject_slowdown, confidence, reason, evidence = info.last
            evidence = dict(evidence)
        elif status is not FindingStatus.RESOLVED:
            info.last = (slowdown, subject_slowdown, confidence, reason, dict(evidence))
        if status is FindingStatus.RESOLVED:
            reason = f"condition absent for {self.gpus.resolve_after}+ frames; " + reason
        evidence["reason"] = reason
        detected_index = (
            (frame.index if status is FindingStatus.RESOLVED else info.detected_index)
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
            detected_ns=frame.end_ns if status is FindingStatus.RESOLVED else info.detected_ns,
            slowdown=rounded(slowdown),
            subject_slowdown=rounded(subject_slowdown),
            confidence=round(confidence, 3),
            reason=reason,
            evidence=evidence,
            has_steps=frame.has_steps,
            severity=severity_of(
                info.kind,
                impact(slowdown, evidence.get("attributed_slowdown")),
                subject_slowdown,
                major=self.severity[0],
                critical=self.severity[1],
            ),  # fmt: skip
        )

    def _node(
        self, info: OpenCondition, since: np.ndarray, recent: np.ndarray, evidence: dict[str, Any]
    ) -> tuple[float, str]:
        hist = self.history
        members = list(info.slots)
        ratio = median(hist.cross[members][:, recent]) if members else float("nan")
        late = float("nan")
        if members:
            late = median(quiet_nan(np.nanmax, hist.late[members][:, recent], axis=0))
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
        evidence.update(self._cost(info, since, recent))
        return ratio, reason

    def _slow(self, slots: tuple[int, ...], pos: np.ndarray) -> np.ndarray:
        """Per frame of ``pos``: whether any of ``slots`` was suspect or elevated."""
        h = self.history
        mine = [s for s in slots if s < h.n]
        return (h.suspect[mine][:, pos] | h.elevated[mine][:, pos]).any(axis=0)

    def _recovered(self, info: OpenCondition, recent: np.ndarray) -> bool:
        """A slow GPU or node none of whose ranks was slow in the recent frames."""
        if info.kind not in (IncidentKind.SLOW_GPU, IncidentKind.SLOW_NODE) or not info.slots:
            return False
        return not self._slow(info.slots, recent).any()

    def _cost(self, info: OpenCondition, since: np.ndarray, recent: np.ndarray) -> dict[str, Any]:
        """The culprit's share of the job's critical path over the recent frames, bounded by
        the job's step time before its onset (``detectors/impact.py``)."""
        hist, slots = self.history, info.slots
        chronic = bool(info.extra.get("chronic"))
        kept = hist.positions(info.onset_pos - BEFORE)
        before = kept[: max(0, len(kept) - len(since))]
        culprit = np.zeros(hist.n, dtype=bool)
        culprit[[s for s in slots if s < hist.n]] = True
        # the latest frames in which it was slow: a fault fading out (recovered frames awaiting
        # hysteresis) and a resolution report what it cost
        slow = self._slow(slots, since)
        recent = since[slow][-self.window :] if slow.any() else recent
        # compute against role peers: in its own groups or on other hosts, whichever is slower
        # (a slow node's ranks match their tensor-parallel peers on the same host)
        ratio = np.fmax(hist.ratio[:, recent], hist.cross[:, recent])
        cost = critical_path(hist.f_time[recent], hist.compute[:, recent], ratio,
                             hist.late[:, recent], culprit, planned=self.lopsided,
                             before=None if chronic else hist.f_time[before])  # fmt: skip
        return {
            "step_time_without_culprit_s": rounded(cost.without_s, 6),
            "culprit_excess_s": rounded(cost.excess_s, 6),
            "attributed_slowdown": rounded(cost.ratio),
        }

    def _link(
        self, info: OpenCondition, recent: np.ndarray, evidence: dict[str, Any]
    ) -> tuple[float, str]:
        comms = info.extra.get("comms", [])
        ratio = median(self.history.link_ratio[comms][:, recent]) if comms else float("nan")
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
        return subject_slowdown, reason

    def _gpu(
        self,
        info: OpenCondition,
        since: np.ndarray,
        recent: np.ndarray,
        frame: Frame,
        frame_time: float,
    ) -> tuple[float, float, str, dict[str, Any]]:
        hist = self.history
        slot = info.slots[0]
        before = hist.positions(info.onset_pos - hist.h)
        before = before[: max(0, len(before) - len(since))]
        late_s = median(hist.late[slot, recent])
        ratio_now = median(hist.ratio[slot, recent])
        comp_now = hist.compute[slot, since] if since.size else hist.compute[slot, recent]
        comp_before = hist.compute[slot, before]
        own_now, own_before = median(comp_now), median(comp_before)
        enough_before = np.isfinite(comp_before).sum() >= 3
        # the healthy level: the median before the onset, unless that is well above the rank's
        # fastest recent block (an onset dated late leaves slow frames before it, and the ratio
        # would read ~1: a 1.4x rank found 73 steps late in the lab); the floor then. The floor
        # alone would overstate (the fastest of 20 noisy block medians: +5-10% in the lab).
        floor = hist.compute_floor(slot)
        if np.isfinite(floor) and (not enough_before or not own_before <= CONTAMINATED * floor):
            own_before, enough_before = floor, True
        own_ok = np.isfinite(own_before) and own_before > 0 and np.isfinite(own_now)
        if info.extra.get("chronic") and np.isfinite(ratio_now):
            # slow since its first frame: it has no healthy level of its own to compare with
            subject, basis = ratio_now, "compute time vs role peers (slow since its first frames)"
        elif frame.has_steps and own_ok and enough_before:
            subject, basis = own_now / own_before, "own compute time now vs its healthy level"
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
        gpus = self.gpus
        suspects = int(gpus.suspect_count()[slot]) if slot < gpus.bits.size else 0
        strong_run = int(gpus.strong_run[slot]) if slot < gpus.strong_run.size else 0
        strength = (
            min(1.0, late_fraction / (2 * self.late_fraction))
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
        if self._link_alike(slot, ratio_now, info, frame):
            # late, but computing no slower than its role peers, or communicating for all but
            # its whole step (compute unknown): what a slow NIC under its host looks like as
            # well (its peers wait for its transfers, its own step stretches). Passive data
            # cannot tell these apart: say so (issue 32).
            evidence["ambiguous"] = True
            evidence["candidates"] = [
                {"kind": IncidentKind.SLOW_GPU.value, "hosts": list(info.hosts)},
                {"kind": IncidentKind.SLOW_LINK.value, "hosts": list(info.hosts)},
            ]
            confidence = min(confidence, 0.5)
            reason += "; as a slow network link of its host would (passive data cannot tell)"
        return subject, confidence, reason, evidence

    def _link_alike(self, slot: int, ratio_now: float, info: OpenCondition, frame: Frame) -> bool:
        """A slow GPU not seen computing slower than its role peers, on a networked host (not
        in a job whose compute is never observable: there ``on_slow_nic`` decides)."""
        shape, s = self.shape, self.scores
        if shape is None or s is None or s.blind or not frame.has_steps:
            return False
        if ratio_now >= DEFAULTS.compute_ratio or info.extra.get("chronic"):
            return False
        if slot >= shape.host_of_slot.size:
            return False
        host = int(shape.host_of_slot[slot])
        return host >= 0 and shape.networked(host)

    # -- hosts ---------------------------------------------------------------------------------
    def host_outliers(self, hosts: tuple[str, ...]) -> dict[str, Any]:
        """Robust (MCD) outlier distance of the incident's hosts among all hosts, last frame."""
        shape, s, links = self.shape, self.scores, self.links
        if shape is None or s is None or links is None or not hosts:
            return {}
        hist = self.history
        cross = hist.cross[:, (hist.count - 1) % hist.h].astype(np.float64)
        return host_outliers(shape, cross, s.late_fraction, links.host_slow_fraction, hosts)
