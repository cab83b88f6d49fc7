"""Writing a detection pass: findings become incidents, the job's progress and its downsampled
history are stored, all in the pass's one transaction."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from failslow.detectors.findings import Finding
from failslow.detectors.vocab import FindingStatus, IncidentKind, Severity, Subject
from failslow.service.detection.text import summary_for
from failslow.service.incidents import service as incidents
from failslow.service.incidents.models import Incident, IncidentState
from failslow.service.incidents.service import incident_attrs
from failslow.service.jobs import history as job_history
from failslow.service.jobs.models import JobHistory, RankHistoryBucket
from failslow.service.metrics import Event, Metrics

log = logging.getLogger(__name__)

# What a resolved incident's summary says was done about it: the kinds of the actions that
# succeeded on it, given by the caller (actions live above detection).
ClearedBy = Callable[[Session, str], list[str]]


@dataclass(frozen=True, slots=True)
class PassSnapshot:
    """What a pass copies out of the job state under its lock."""

    slot_rank: list[int]
    info: dict[int, tuple[str | None, int | None]]  # rank -> (host, gpu)
    now_ns: int


def stored_subject(f: Finding, ranks: list[int]) -> Subject:
    """How an incident names its subject: a slow GPU by its global rank(s), not its slot."""
    if f.kind == IncidentKind.SLOW_GPU:
        return Subject.ranks(ranks)
    return f.subject


class IncidentWriter:
    """Applies one job's findings to its incidents (``open`` maps each open condition to its
    incident id)."""

    def __init__(self, *, metrics: Metrics, cleared_by: ClearedBy) -> None:
        self.metrics = metrics
        self.cleared_by = cleared_by

    def _mark_mitigated(self, s: Session, row: Incident) -> None:
        """An open incident that an action mitigated stays open, marked so (the culprit is
        still slow per unit of work; it resolves when the hardware recovers: issue 16)."""
        fixed = list(dict.fromkeys(self.cleared_by(s, row.id)))
        if fixed:
            row.evidence = {**row.evidence, "mitigated_by": fixed}
            cost = "little" if row.severity == Severity.MINOR else "less"
            row.summary = (
                f"{row.summary.rstrip('.')}. Mitigated by {' + '.join(fixed)}: it costs the job "
                f"{cost} now; open until the hardware recovers."
            )

    def apply(
        self,
        s: Session,
        *,
        job: str,
        open_ids: dict[tuple[IncidentKind, Subject], str],
        f: Finding,
        snap: PassSnapshot,
    ) -> None:
        ranks = sorted(snap.slot_rank[i] for i in f.slots if i < len(snap.slot_rank))
        if f.kind == IncidentKind.SLOW_LINK:
            ranks = []
        hosts = list(f.hosts) or sorted({h for r in ranks if (h := snap.info[r][0]) is not None})
        subject = str(stored_subject(f, ranks))
        key = (f.kind, f.subject)
        now_ns = snap.now_ns
        summary = summary_for(f, ranks, hosts, snap.info)
        evidence = {**f.evidence, "reason": f.reason}
        if f.status == FindingStatus.OPENED:
            draft = incidents.IncidentDraft(
                job=job,
                kind=f.kind,
                subject=subject,
                ranks=ranks,
                hosts=hosts,
                slowdown=f.slowdown,
                subject_slowdown=f.subject_slowdown,
                confidence=f.confidence,
                severity=f.severity,
                onset_ns=f.onset_ns,
                detected_ns=f.detected_ns,
                onset_step=f.onset_index,
                detected_step=f.detected_index,
                summary=summary,
                evidence=evidence,
            )
            row, created = incidents.open_incident(s, draft=draft, now_ns=now_ns)
            open_ids[key] = row.id
            if created:
                self.metrics.opened.labels(f.kind).inc()
                self.metrics.emit(Event.INCIDENT_OPENED, incident_attrs(row))
                self.metrics.delay.labels(f.kind).observe(
                    max(0.0, (f.detected_ns - f.onset_ns) / 1e9)
                )
                log.info("incident %s opened: %s", row.id, summary)
            return
        inc_id = open_ids.get(key)
        row = incidents.get_incident(s, incident_id=inc_id) if inc_id else None
        if row is None:
            row = incidents.find_open(s, job=job, kind=f.kind, subject=subject)
        if row is None or row.state != IncidentState.OPEN:
            open_ids.pop(key, None)
            return
        if f.status == FindingStatus.UPDATED:
            if f.kind == IncidentKind.HANG:
                row.ranks, row.hosts = ranks, hosts
            row.onset_ns, row.onset_step = f.onset_ns, f.onset_index  # re-dated with more data
            incidents.refresh_incident(
                s,
                incident=row,
                slowdown=f.slowdown,
                subject_slowdown=f.subject_slowdown,
                confidence=f.confidence,
                severity=f.severity,
                summary=summary,
                evidence=evidence,
                now_ns=now_ns,
            )
            if f.kind != IncidentKind.JOB_SLOWDOWN:
                self._mark_mitigated(s, row)
        elif f.status == FindingStatus.RESOLVED:
            incidents.resolve_incident(
                s,
                incident=row,
                resolved_ns=f.detected_ns or now_ns,
                resolved_step=f.detected_index,
                evidence={"reason": f.reason},
            )
            fixed = list(dict.fromkeys(self.cleared_by(s, row.id)))
            verb = f"Cleared after {' + '.join(fixed)}" if fixed else "Recovered"
            at = (
                f" {verb} by step {f.detected_index}."
                if f.detected_index is not None
                else f" {verb}."
            )
            if fixed:
                row.evidence = {**row.evidence, "cleared_after": fixed}
            row.summary = row.summary.rstrip(".") + "." + at
            open_ids.pop(key, None)
            self.metrics.resolved.labels(f.kind).inc()
            self.metrics.emit(Event.INCIDENT_RESOLVED, incident_attrs(row))
            log.info("incident %s resolved", row.id)


def write_history(
    s: Session,
    job_rows: list[dict[str, Any]],
    rank_rows: list[dict[str, Any]],
    *,
    keep: int | None = None,
) -> None:
    """Downsampled history rows; a bucket already written (a flush, or a restart mid-bucket) is
    merged row by row. ``keep``: per-rank buckets kept per job (None: all)."""
    if not job_rows and not rank_rows:
        return
    try:
        with s.begin_nested():
            job_history.add_history(s, job_rows=job_rows, rank_rows=rank_rows)
    except IntegrityError:
        for row in job_rows:
            s.merge(JobHistory(**row))
        for row in rank_rows:
            s.merge(RankHistoryBucket(**row))
    if keep is not None:
        for job in {r["job_id"] for r in rank_rows}:
            job_history.prune(s, job=job, keep=keep)
