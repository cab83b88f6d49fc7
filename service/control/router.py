"""Runtime control over REST: mute, pause, maintenance windows, per-job and fleet thresholds,
manual resolution, the effective configuration and the audit trail. Every change records its
actor from the request's token (never from the body) and a reason."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import ValidationError

from failslow.service.context import ActorDep, CtxDep, JobId, OperatorAuth, ReadAuth, SessionDep
from failslow.service.control import service as control
from failslow.service.control.config import effective, tunable_key
from failslow.service.control.models import JobControl
from failslow.service.control.schemas import (
    AuditOut,
    AuditVerb,
    Because,
    ConfigValue,
    ControlOut,
    MuteIn,
    SetIn,
    WindowIn,
    WindowOut,
)
from failslow.service.errors import Conflict, InvalidRequest, NotFound
from failslow.service.ids import rfc3339
from failslow.service.incidents import service as incidents
from failslow.service.incidents.models import IncidentState
from failslow.service.incidents.schemas import IncidentOut
from failslow.service.metrics import Event

router = APIRouter(tags=["control"])
Key = Annotated[str, Path(max_length=64, description="A tunable key: detection.<name>.")]


def control_out(job: str, row: JobControl | None, now_ns: int) -> ControlOut:
    st = control.state_of(row, now_ns)
    windows = [
        WindowOut(
            id=str(w["id"]),
            start_ns=int(w["start_ns"]),
            end_ns=int(w["end_ns"]),  # type: ignore[call-overload]
            start=rfc3339(int(w["start_ns"])) or "",
            end=rfc3339(int(w["end_ns"])) or "",  # type: ignore[call-overload]
            reason=str(w["reason"]),
            by=str(w["by"]),
            active=int(w["start_ns"]) <= now_ns < int(w["end_ns"]),
        )  # type: ignore[call-overload]
        for w in (row.windows if row is not None else []) or []
        if int(w["end_ns"]) > now_ns  # type: ignore[call-overload]
    ]
    hand = row is not None and row.muted_until_ns is not None and now_ns < row.muted_until_ns
    return ControlOut(
        job=job,
        muted=st.muted,
        muted_until=rfc3339(row.muted_until_ns)
        if hand and row.muted_until_ns < 2**63 - 1
        else None,  # type: ignore[union-attr]
        mute_reason=row.mute_reason if hand else None,  # type: ignore[union-attr]
        paused=st.paused,
        pause_reason=row.pause_reason if row is not None and row.paused else None,
        in_maintenance=st.in_maintenance,
        windows=windows,
        overrides=dict(row.overrides or {}) if row is not None else {},
        updated=rfc3339(row.updated_ns) if row is not None else None,
        updated_by=row.updated_by if row is not None else None,
    )


def _done(ctx: CtxDep, session: SessionDep, job: str) -> ControlOut:
    session.commit()
    ctx.controls.changed(job)
    now = control.now_ns()
    return control_out(job, control.get(session, job=job), now)


@router.get(
    "/v1/jobs/{job}/control",
    response_model=ControlOut,
    dependencies=[ReadAuth],
    summary="A job's runtime control: muted, paused, maintenance windows, overrides",
)
def get_control(job: JobId, session: SessionDep) -> ControlOut:
    return control_out(job, control.get(session, job=job), control.now_ns())


@router.post(
    "/v1/jobs/{job}/mute",
    response_model=ControlOut,
    dependencies=[OperatorAuth],
    summary="Mute a job: detected, but neither acted on nor notified",
)
def mute(job: JobId, body: MuteIn, ctx: CtxDep, session: SessionDep, actor: ActorDep) -> ControlOut:
    control.mute(
        session, job=job, for_s=body.for_s, reason=body.reason, actor=actor, now_ns=control.now_ns()
    )
    return _done(ctx, session, job)


@router.post(
    "/v1/jobs/{job}/unmute",
    response_model=ControlOut,
    dependencies=[OperatorAuth],
    summary="Unmute a job",
)
def unmute(
    job: JobId, body: Because, ctx: CtxDep, session: SessionDep, actor: ActorDep
) -> ControlOut:
    control.unmute(session, job=job, reason=body.reason, actor=actor, now_ns=control.now_ns())
    return _done(ctx, session, job)


@router.post(
    "/v1/jobs/{job}/pause",
    response_model=ControlOut,
    dependencies=[OperatorAuth],
    summary="Pause a job's detection (its telemetry is consumed, not analysed)",
)
def pause(
    job: JobId, body: Because, ctx: CtxDep, session: SessionDep, actor: ActorDep
) -> ControlOut:
    control.pause(
        session, job=job, paused=True, reason=body.reason, actor=actor, now_ns=control.now_ns()
    )
    return _done(ctx, session, job)


@router.post(
    "/v1/jobs/{job}/resume",
    response_model=ControlOut,
    dependencies=[OperatorAuth],
    summary="Resume a job's detection",
)
def resume(
    job: JobId, body: Because, ctx: CtxDep, session: SessionDep, actor: ActorDep
) -> ControlOut:
    control.pause(
        session, job=job, paused=False, reason=body.reason, actor=actor, now_ns=control.now_ns()
    )
    return _done(ctx, session, job)


@router.post(
    "/v1/jobs/{job}/maintenance",
    response_model=ControlOut,
    dependencies=[OperatorAuth],
    summary="A maintenance window: detection paused and nothing done within it",
)
def maintenance(
    job: JobId, body: WindowIn, ctx: CtxDep, session: SessionDep, actor: ActorDep
) -> ControlOut:
    now = control.now_ns()
    start = int(body.start.timestamp() * 1e9) if body.start is not None else now
    if body.end is not None:
        end = int(body.end.timestamp() * 1e9)
    elif body.for_s is not None:
        end = start + int(body.for_s * 1e9)
    else:
        raise InvalidRequest("a maintenance window needs an end or for_s")
    if not (0 <= start < 2**62 and end < 2**62):
        raise InvalidRequest("a maintenance window must lie between 1970 and 2116")
    if end <= max(start, now):
        raise InvalidRequest("a maintenance window must end after its start and after now")
    control.add_window(
        session, job=job, start_ns=start, end_ns=end, reason=body.reason, actor=actor, now_ns=now
    )
    return _done(ctx, session, job)


@router.delete(
    "/v1/jobs/{job}/maintenance/{window}",
    response_model=ControlOut,
    dependencies=[OperatorAuth],
    summary="End or cancel a maintenance window",
)
def end_maintenance(
    job: JobId,
    window: Annotated[str, Path(max_length=40)],
    ctx: CtxDep,
    session: SessionDep,
    actor: ActorDep,
    reason: Annotated[str, Query(min_length=1, max_length=2000)],
) -> ControlOut:
    if not control.end_window(
        session, job=job, window_id=window, reason=reason, actor=actor, now_ns=control.now_ns()
    ):
        raise NotFound(f"job {job!r} has no maintenance window {window!r}")
    return _done(ctx, session, job)


def _set(
    ctx: CtxDep,
    session: SessionDep,
    scope: str,
    key: str,
    value: float | None,
    reason: str,
    actor: str,
) -> None:
    try:
        name = tunable_key(key)
        fleet, own = control.overrides(session, job=scope)
        merged = {**fleet, **own} if scope != control.FLEET else dict(fleet)
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
        ctx.settings.detection.tuned(merged)
    except ValidationError as exc:
        msg = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise InvalidRequest(f"{key} = {value}: {msg}") from None
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    control.set_override(
        session,
        job=scope,
        key=name,
        value=value,
        reason=reason,
        actor=actor,
        now_ns=control.now_ns(),
    )
    session.commit()
    ctx.controls.changed(scope)


@router.get(
    "/v1/config",
    response_model=list[ConfigValue],
    dependencies=[ReadAuth],
    summary="The effective configuration, with where each value came from",
)
def get_config(ctx: CtxDep, session: SessionDep) -> list[ConfigValue]:
    fleet, _ = control.overrides(session, job=control.FLEET)
    return effective(ctx.settings, fleet, None)


@router.put(
    "/v1/config/{key}",
    response_model=list[ConfigValue],
    dependencies=[OperatorAuth],
    summary="Set a tunable threshold for every job, at run time",
)
def set_fleet(
    key: Key, body: SetIn, ctx: CtxDep, session: SessionDep, actor: ActorDep
) -> list[ConfigValue]:
    _set(ctx, session, control.FLEET, key, body.value, body.reason, actor)
    return get_config(ctx, session)


@router.delete(
    "/v1/config/{key}",
    response_model=list[ConfigValue],
    dependencies=[OperatorAuth],
    summary="Remove a fleet-wide run-time threshold",
)
def unset_fleet(
    key: Key,
    ctx: CtxDep,
    session: SessionDep,
    actor: ActorDep,
    reason: Annotated[str, Query(min_length=1, max_length=2000)],
) -> list[ConfigValue]:
    _set(ctx, session, control.FLEET, key, None, reason, actor)
    return get_config(ctx, session)


@router.get(
    "/v1/jobs/{job}/config",
    response_model=list[ConfigValue],
    dependencies=[ReadAuth],
    summary="A job's effective configuration, its own overrides included",
)
def get_job_config(job: JobId, ctx: CtxDep, session: SessionDep) -> list[ConfigValue]:
    fleet, own = control.overrides(session, job=job)
    return effective(ctx.settings, fleet, own)


@router.put(
    "/v1/jobs/{job}/config/{key}",
    response_model=list[ConfigValue],
    dependencies=[OperatorAuth],
    summary="Set a tunable threshold for one job",
)
def set_job(
    job: JobId, key: Key, body: SetIn, ctx: CtxDep, session: SessionDep, actor: ActorDep
) -> list[ConfigValue]:
    _set(ctx, session, job, key, body.value, body.reason, actor)
    return get_job_config(job, ctx, session)


@router.delete(
    "/v1/jobs/{job}/config/{key}",
    response_model=list[ConfigValue],
    dependencies=[OperatorAuth],
    summary="Remove a job's threshold override",
)
def unset_job(
    job: JobId,
    key: Key,
    ctx: CtxDep,
    session: SessionDep,
    actor: ActorDep,
    reason: Annotated[str, Query(min_length=1, max_length=2000)],
) -> list[ConfigValue]:
    _set(ctx, session, job, key, None, reason, actor)
    return get_job_config(job, ctx, session)


@router.post(
    "/v1/incidents/{id}/resolve",
    response_model=IncidentOut,
    dependencies=[OperatorAuth],
    summary="Resolve an open incident by hand, saying why",
)
def resolve(
    id: Annotated[str, Path(max_length=40)],
    body: Because,
    ctx: CtxDep,
    session: SessionDep,  # noqa: A002
    actor: ActorDep,
) -> IncidentOut:
    row = incidents.get_incident(session, incident_id=id)
    if row is None:
        raise NotFound(f"no incident {id!r}")
    if row.state != IncidentState.OPEN:
        raise Conflict(f"incident {id} is already resolved")
    now = control.now_ns()
    incidents.resolve_by_hand(session, incident=row, actor=actor, reason=body.reason, now_ns=now)
    control.audit(
        session,
        actor=actor,
        verb=AuditVerb.RESOLVE,
        job=row.job_id,
        target=row.id,
        reason=body.reason,
        now_ns=now,
    )
    session.commit()
    ctx.metrics.resolved.labels(row.kind).inc()
    ctx.metrics.emit(Event.INCIDENT_RESOLVED, incidents.incident_attrs(row))
    return incidents.to_out(row)


@router.get(
    "/v1/audit",
    response_model=list[AuditOut],
    dependencies=[ReadAuth],
    summary="Who changed what, newest first (cursor: ?before=<id>)",
)
def audit(
    session: SessionDep,
    job: Annotated[str | None, Query(max_length=128)] = None,
    before: Annotated[str | None, Query(max_length=40)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[AuditOut]:
    return [
        AuditOut(
            id=e.id,
            at_ns=e.at_ns,
            at=rfc3339(e.at_ns) or "",
            actor=e.actor,
            verb=e.verb,  # type: ignore[arg-type]
            job=e.job_id,
            target=e.target,
            reason=e.reason,
            detail=dict(e.detail or {}),
        )
        for e in control.events(session, job=job, after=before, limit=limit)
    ]
