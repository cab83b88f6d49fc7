"""Queries and state changes of incidents (keyword-only; the caller owns the transaction)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from failslow.detectors.vocab import Severity
from failslow.service.ids import new_id, rfc3339
from failslow.service.incidents.models import Incident, IncidentResolution, IncidentState
from failslow.service.incidents.schemas import IncidentFilter, IncidentOut
from failslow.service.paging import Page


@dataclass(frozen=True, slots=True)
class IncidentDraft:
    """Everything needed to open or refresh an incident."""

    job: str
    kind: str
    subject: str
    ranks: list[int]
    hosts: list[str]
    slowdown: float | None
    subject_slowdown: float | None
    confidence: float
    onset_ns: int
    detected_ns: int
    onset_step: int | None
    detected_step: int | None
    summary: str
    evidence: dict[str, Any]
    severity: Severity = Severity.MAJOR


def open_incident(session: Session, *, draft: IncidentDraft, now_ns: int) -> tuple[Incident, bool]:
    """Open an incident, or return the one already open for (job, kind, subject).

    Returns ``(incident, created)``. The partial unique index makes this safe when two service
    processes race: the loser finds the winner's row.
    """
    existing = find_open(session, job=draft.job, kind=draft.kind, subject=draft.subject)
    if existing is not None:
        return existing, False
    row = Incident(
        id=new_id("inc"),
        job_id=draft.job,
        kind=draft.kind,
        subject=draft.subject,
        state=IncidentState.OPEN,
        ranks=draft.ranks,
        hosts=draft.hosts,
        slowdown=draft.slowdown,
        subject_slowdown=draft.subject_slowdown,
        confidence=draft.confidence,
        severity=draft.severity,
        onset_ns=draft.onset_ns,
        detected_ns=draft.detected_ns,
        resolved_ns=None,
        onset_step=draft.onset_step,
        detected_step=draft.detected_step,
        resolved_step=None,
        summary=draft.summary,
        evidence=draft.evidence,
        updated_ns=now_ns,
    )
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError:
        winner = find_open(session, job=draft.job, kind=draft.kind, subject=draft.subject)
        if winner is None:
            raise
        return winner, False
    return row, True


STICKY_EVIDENCE = ("probes", "flight_recorder", "nccl_ras")


def add_notes(
    summary: str, evidence: dict[str, Any], *, replacing: dict[str, Any] | None = None
) -> str:
    """``summary`` with the one-sentence note of each sticky evidence source in ``evidence``;
    the notes of ``replacing`` (that evidence's previous version) are taken out first."""
    for key in STICKY_EVIDENCE:
        old = ((replacing or {}).get(key) or {}).get("note")
        if old:
            summary = summary.replace(f" {old}", "")
        note = (evidence.get(key) or {}).get("note")
        if note and note not in summary:
            summary = f"{summary} {note}"
    return summary


def refresh_incident(
    session: Session,
    *,
    incident: Incident,
    slowdown: float | None,
    subject_slowdown: float | None,
    confidence: float,
    severity: Severity,
    summary: str,
    evidence: dict[str, Any],
    now_ns: int,
) -> None:
    incident.slowdown = slowdown
    incident.severity = severity  # the impact now: a mitigated incident becomes minor
    incident.subject_slowdown = subject_slowdown
    # confidence that the condition was real: it does not fall while the incident fades out
    incident.confidence = max(incident.confidence, confidence)
    # what other parts of the service added (active probes) outlives the detectors' updates
    kept = {k: v for k, v in (incident.evidence or {}).items() if k in STICKY_EVIDENCE}
    incident.summary = add_notes(summary, kept)
    incident.evidence = {**evidence, **kept}
    if (kept.get("probes") or {}).get("component"):
        incident.hosts = list(kept["probes"]["hosts"])
    incident.updated_ns = now_ns


def resolve_incident(
    session: Session,
    *,
    incident: Incident,
    resolved_ns: int,
    resolved_step: int | None,
    evidence: dict[str, Any] | None = None,
) -> None:
    incident.state = IncidentState.RESOLVED
    incident.resolved_ns = resolved_ns
    incident.resolved_step = resolved_step
    incident.updated_ns = resolved_ns
    if evidence:
        incident.evidence = {**incident.evidence, "resolution": evidence}


def resolve_by_hand(session: Session, *, incident: Incident, actor: str, reason: str,
                    now_ns: int) -> None:  # fmt: skip
    """An operator closes an open incident. The detectors are not told: if the condition is
    still there, no new incident opens for it until they have seen it clear and come back."""
    resolve_incident(
        session, incident=incident, resolved_ns=now_ns, resolved_step=None,
        evidence={"closed_as": IncidentResolution.MANUAL, "by": actor, "reason": reason},
    )  # fmt: skip
    incident.summary = f"{incident.summary.rstrip('.')}. Resolved by {actor}: {reason}."


def find_open(session: Session, *, job: str, kind: str, subject: str) -> Incident | None:
    return session.scalars(
        select(Incident).where(
            Incident.job_id == job,
            Incident.kind == kind,
            Incident.subject == subject,
            Incident.state == IncidentState.OPEN,
        )
    ).first()


def list_incidents(
    session: Session,
    *,
    job: str | None = None,
    state: str = IncidentFilter.ALL,
    page: Page | None = None,
) -> list[Incident]:
    """In id (creation) order. With ``page``: those active within its time range (opened
    before ``until``, not resolved before ``since``), after its cursor, ``limit + 1`` at most
    (the extra one says that another page follows)."""
    query = select(Incident)
    if job is not None:
        query = query.where(Incident.job_id == job)
    if state != IncidentFilter.ALL:
        query = query.where(Incident.state == state)
    if page is not None:
        if page.until_ns is not None:
            query = query.where(Incident.onset_ns <= page.until_ns)
        if page.since_ns is not None:
            query = query.where(
                Incident.resolved_ns.is_(None) | (Incident.resolved_ns >= page.since_ns)
            )
        if page.after is not None:
            query = query.where(Incident.id > page.after)
        query = query.limit(page.limit + 1)
    return list(session.scalars(query.order_by(Incident.id)))


def get_incident(session: Session, *, incident_id: str) -> Incident | None:
    return session.get(Incident, incident_id)


def to_out(row: Incident) -> IncidentOut:
    return IncidentOut(
        id=row.id,
        job=row.job_id,
        kind=row.kind,  # type: ignore[arg-type]
        ranks=list(row.ranks),
        hosts=list(row.hosts),
        state=row.state,  # type: ignore[arg-type]
        slowdown=row.slowdown,
        subject_slowdown=row.subject_slowdown,
        confidence=row.confidence,
        severity=row.severity,  # type: ignore[arg-type]
        onset_ns=row.onset_ns,
        detected_ns=row.detected_ns,
        resolved_ns=row.resolved_ns,
        onset_step=row.onset_step,
        detected_step=row.detected_step,
        resolved_step=row.resolved_step,
        summary=row.summary,
        evidence=dict(row.evidence),
        updated_ns=row.updated_ns,
        resolution=resolution_of(row),
        onset=rfc3339(row.onset_ns),
        detected=rfc3339(row.detected_ns),
        resolved=rfc3339(row.resolved_ns),
    )


def incident_attrs(row: Incident) -> dict[str, Any]:
    """An incident as an event's attributes (OpenTelemetry: flat, scalar or lists)."""
    return {
        "training_job": row.job_id, "incident": row.id, "kind": row.kind, "state": row.state,
        "severity": row.severity, "hosts": list(row.hosts), "ranks": list(row.ranks),
        "onset_ns": row.onset_ns, "detected_ns": row.detected_ns,
        "resolution": str(resolution_of(row) or ""), "summary": row.summary,
    }  # fmt: skip


def resolution_of(row: Incident) -> IncidentResolution | None:
    if row.state != IncidentState.RESOLVED:
        return None
    closed_as = ((row.evidence or {}).get("resolution") or {}).get("closed_as")
    return IncidentResolution(closed_as) if closed_as else IncidentResolution.RECOVERED
