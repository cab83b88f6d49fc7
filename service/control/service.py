"""Queries and changes of runtime control, each recorded in the audit trail (keyword-only; the
caller owns the transaction).

A job is *muted* (detected, neither acted on nor notified) by hand until a time or until
unmuted, or while a maintenance window is open; *paused* (detection consumes its frames
without analysing them) by hand or while a maintenance window is open. Threshold overrides
hold for one job, or for every job (the fleet row, ``FLEET``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from failslow.service.control.models import AuditEvent, JobControl
from failslow.service.control.schemas import AuditVerb
from failslow.service.ids import new_id

FLEET = "*"  # the row of overrides for every job (not an identifier: no job can be called so)


@dataclass(frozen=True, slots=True)
class ControlState:
    """A job's control now: muted, paused, and why."""

    muted: bool = False
    paused: bool = False
    in_maintenance: bool = False
    why: str = ""


def get(session: Session, *, job: str) -> JobControl | None:
    return session.get(JobControl, job)


def _row(session: Session, job: str, actor: str, now_ns: int) -> JobControl:
    row = session.get(JobControl, job)
    if row is None:
        row = JobControl(
            job_id=job, paused=False, windows=[], overrides={}, updated_ns=now_ns, updated_by=actor
        )
        session.add(row)
    row.updated_ns, row.updated_by = now_ns, actor
    return row


def audit(
    session: Session,
    *,
    actor: str,
    verb: AuditVerb,
    job: str | None,
    target: str | None,
    reason: str,
    detail: dict[str, Any] | None = None,
    now_ns: int,
) -> AuditEvent:
    event = AuditEvent(
        id=new_id("aud"),
        at_ns=now_ns,
        actor=actor,
        verb=verb,
        job_id=job,
        target=target,
        reason=reason,
        detail=detail or {},
    )
    session.add(event)
    return event


def state_of(row: JobControl | None, now_ns: int) -> ControlState:
    if row is None:
        return ControlState()
    windows = [w for w in row.windows or [] if int(w["start_ns"]) <= now_ns < int(w["end_ns"])]  # type: ignore[call-overload]
    muted_by_hand = row.muted_until_ns is not None and now_ns < row.muted_until_ns
    why = []
    if windows:
        why.append(f"maintenance window: {windows[0]['reason']}")
    if muted_by_hand:
        why.append(f"muted: {row.mute_reason}")
    if row.paused:
        why.append(f"paused: {row.pause_reason}")
    return ControlState(
        muted=muted_by_hand or bool(windows),
        paused=row.paused or bool(windows),
        in_maintenance=bool(windows),
        why="; ".join(why),
    )


def mute(
    session: Session, *, job: str, for_s: float | None, reason: str, actor: str, now_ns: int
) -> JobControl:
    row = _row(session, job, actor, now_ns)
    row.muted_until_ns = now_ns + int(for_s * 1e9) if for_s else 2**63 - 1
    row.mute_reason = reason
    detail = {"until_ns": row.muted_until_ns if for_s else None}
    audit(
        session,
        actor=actor,
        verb=AuditVerb.MUTE,
        job=job,
        target=None,
        reason=reason,
        detail=detail,
        now_ns=now_ns,
    )
    return row


def unmute(session: Session, *, job: str, reason: str, actor: str, now_ns: int) -> JobControl:
    row = _row(session, job, actor, now_ns)
    row.muted_until_ns, row.mute_reason = None, None
    audit(
        session,
        actor=actor,
        verb=AuditVerb.UNMUTE,
        job=job,
        target=None,
        reason=reason,
        now_ns=now_ns,
    )
    return row


def pause(
    session: Session, *, job: str, paused: bool, reason: str, actor: str, now_ns: int
) -> JobControl:
    row = _row(session, job, actor, now_ns)
    row.paused, row.pause_reason = paused, (reason if paused else None)
    verb = AuditVerb.PAUSE if paused else AuditVerb.RESUME
    audit(session, actor=actor, verb=verb, job=job, target=None, reason=reason, now_ns=now_ns)
    return row


def add_window(
    session: Session,
    *,
    job: str,
    start_ns: int,
    end_ns: int,
    reason: str,
    actor: str,
    now_ns: int,
) -> dict[str, object]:
    row = _row(session, job, actor, now_ns)
    window = {
        "id": new_id("mw"),
        "start_ns": start_ns,
        "end_ns": end_ns,
        "reason": reason,
        "by": actor,
    }
    # a new list: the JSON column is saved only when it is assigned
    row.windows = [w for w in row.windows or [] if int(w["end_ns"]) > now_ns] + [window]  # type: ignore[call-overload]
    audit(
        session,
        actor=actor,
        verb=AuditVerb.MAINTENANCE,
        job=job,
        target=str(window["id"]),
        reason=reason,
        detail={"start_ns": start_ns, "end_ns": end_ns},
        now_ns=now_ns,
    )
    return window


def end_window(
    session: Session, *, job: str, window_id: str, reason: str, actor: str, now_ns: int
) -> bool:
    row = get(session, job=job)
    if row is None or not any(w["id"] == window_id for w in row.windows or []):
        return False
    row.windows = [w for w in row.windows if w["id"] != window_id]
    row.updated_ns, row.updated_by = now_ns, actor
    audit(
        session,
        actor=actor,
        verb=AuditVerb.END_MAINTENANCE,
        job=job,
        target=window_id,
        reason=reason,
        now_ns=now_ns,
    )
    return True


def set_override(
    session: Session,
    *,
    job: str,
    key: str,
    value: float | None,
    reason: str,
    actor: str,
    now_ns: int,
) -> JobControl:
    """Set (``value``) or remove (None) one override; the caller has validated it."""
    row = _row(session, job, actor, now_ns)
    overrides = dict(row.overrides or {})
    before = overrides.get(key)
    if value is None:
        overrides.pop(key, None)
    else:
        overrides[key] = value
    row.overrides = overrides
    verb = AuditVerb.UNSET if value is None else AuditVerb.SET
    audit(
        session,
        actor=actor,
        verb=verb,
        job=None if job == FLEET else job,
        target=key,
        reason=reason,
        detail={"before": before, "after": value, "scope": job},
        now_ns=now_ns,
    )
    return row


def overrides(session: Session, *, job: str) -> tuple[dict[str, float], dict[str, float]]:
    """(the fleet's overrides, the job's own)."""
    fleet, own = get(session, job=FLEET), get(session, job=job)
    return dict(fleet.overrides or {}) if fleet else {}, dict(own.overrides or {}) if own else {}


def events(session: Session, *, job: str | None, after: str | None, limit: int) -> list[AuditEvent]:
    q = select(AuditEvent)
    if job is not None:
        q = q.where(AuditEvent.job_id == job)
    if after is not None:
        q = q.where(AuditEvent.id < after)
    return list(session.scalars(q.order_by(AuditEvent.id.desc()).limit(limit)))


def now_ns() -> int:
    return time.time_ns()
