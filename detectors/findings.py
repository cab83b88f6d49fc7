"""Findings (what the pipeline reports) and the dating of a condition's onset."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from failslow.detectors.changepoint import segment_window
from failslow.detectors.defaults import DEFAULTS
from failslow.detectors.hang_input import HangFinding
from failslow.detectors.lifecycle import run_start
from failslow.detectors.robust import quiet_nan
from failslow.detectors.vocab import FindingStatus, IncidentKind, Severity, Subject


@dataclass(frozen=True, slots=True)
class Finding:
    """A change of a persistent condition, with the numbers and the reason behind it."""

    kind: IncidentKind
    status: FindingStatus
    subject: Subject  # a rank slot, a host, host pairs, or the job
    slots: tuple[int, ...]  # rank slots (culprits, or a hang's roots)
    hosts: tuple[str, ...]
    onset_index: int | None
    onset_ns: int
    detected_index: int | None
    detected_ns: int
    slowdown: float | None
    subject_slowdown: float | None
    confidence: float
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    has_steps: bool = True
    severity: Severity = Severity.MAJOR  # from the measured impact (:func:`severity_of`)


def severity_of(
    kind: IncidentKind,
    slowdown: float | None,
    subject_slowdown: float | None = None,
    *,
    major: float = DEFAULTS.major_slowdown,
    critical: float = DEFAULTS.critical_slowdown,
) -> Severity:
    """How much the condition costs the job: a hang is critical; otherwise ``slowdown``, the
    job's step time against what it would be without the condition (``impact.impact``; the
    culprit's own slowdown when the job's is unknown, as without step records) decides:
    >= ``critical`` critical, >= ``major`` major, below minor. Unknown impact counts as major
    (acting on it stays the policy's choice)."""
    if kind == IncidentKind.HANG:
        return Severity.CRITICAL
    impact = slowdown if slowdown is not None and np.isfinite(slowdown) else subject_slowdown
    if impact is None or not np.isfinite(impact):
        return Severity.MAJOR
    if impact >= critical:
        return Severity.CRITICAL
    return Severity.MAJOR if impact >= major else Severity.MINOR


def rounded(x: float | np.floating | None, nd: int = 4) -> float | None:
    if x is None or not np.isfinite(x):
        return None
    return round(float(x), nd)


def date_onset(
    values: np.ndarray,
    elevated: np.ndarray,
    suspect: np.ndarray | None = None,
    *,
    increase: bool = True,
) -> int:
    """Position (into the oldest-first ring ``values``) where the current condition began.

    Change-point dating: the last change point that ruptures finds in the series (min_size 3,
    the production penalty) in the suspicious direction, moved back over up to three contiguous
    elevated transition frames (a fault that starts mid-step half-slows its first frame). With
    too few frames after the change for ruptures, the start of the run of suspect frames (one
    elevated transition frame allowed); callers re-date once more frames exist.
    """
    start = run_start(suspect, max_gap=0) if suspect is not None else run_start(elevated)
    if start > 0 and elevated[start - 1] and suspect is not None:
        start -= 1
    v = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(v)
    if ok.sum() < 7:
        return start
    idx = np.flatnonzero(ok)
    cps = segment_window(v[ok], min_size=3, penalty=3.0)
    for cp in reversed(cps):
        before, after = v[idx[:cp]], v[idx[cp:]]
        rising = quiet_nan(np.nanmean, after) > quiet_nan(np.nanmean, before)
        pos = int(idx[cp])
        if rising == increase and abs(pos - start) <= max(3, (len(values) - start)):
            # an onset is an elevated frame: with few frames after the change, min_size can pull
            # the split onto the last normal one
            while pos < start and not elevated[pos]:
                pos += 1
            for _ in range(3):
                if pos > 0 and elevated[pos - 1]:
                    pos -= 1
            return pos
    return start


# the numbers of a report: (job slowdown, subject slowdown, confidence, reason, evidence)
Numbers = tuple[float, float, float, str, dict[str, Any]]


@dataclass(slots=True)
class OpenCondition:
    """A condition from its opening until it resolves."""

    kind: IncidentKind
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
    last: Numbers | None = None


def fading(last: Numbers | None, now: float) -> bool:
    """An update whose subject has lost more than half of its slowdown since the last report:
    the condition is fading out (recovered frames awaiting hysteresis), not a new level."""
    if last is None or not np.isfinite(last[1]) or last[1] <= 1.0:
        return False
    return not np.isfinite(now) or now - 1.0 < 0.5 * (last[1] - 1.0)


def hang_finding(
    status: FindingStatus, info: OpenCondition, found: HangFinding | None, now_ns: int,
    has_steps: bool,
) -> Finding:  # fmt: skip
    """What a hang says (``found``: the detector's finding; None: it resolved, collectives
    progress again), as of ``now_ns``."""
    reason = found.reason if found else "collectives progress again"
    evidence: dict[str, Any] = dict(found.evidence) if found else {}
    evidence.update(
        {
            "detector": "hang",
            "method": "blocked collectives past an adaptive timeout, dependency analysis",
        }
    )
    return Finding(
        kind=IncidentKind.HANG,
        status=status,
        subject=Subject.job(),
        slots=info.slots,
        hosts=info.hosts,
        onset_index=None,
        onset_ns=info.onset_ns,
        detected_index=None,
        detected_ns=info.detected_ns if status is FindingStatus.OPENED else now_ns,
        slowdown=None,
        subject_slowdown=None,
        confidence=0.99 if info.slots else 0.6,
        reason=reason,
        evidence=evidence,
        has_steps=has_steps,
        severity=severity_of(IncidentKind.HANG, None),
    )
