"""``/v1/actions`` and ``/v1/jobs/{job}/actions``: what the policy decided, and operators' say."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Body, Path, Query

from failslow.service.actions import service as actions
from failslow.service.actions.schemas import (
    ActionEventOut,
    ActionOut,
    ActionState,
    Decision,
    event_out,
    to_out,
)
from failslow.service.context import CtxDep, JobId, OperatorAuth, ReadAuth, SessionDep
from failslow.service.errors import NotFound
from failslow.service.jobs import service as jobs_db

router = APIRouter(tags=["actions"])
ActionId = Annotated[str, Path(max_length=40)]


@router.get(
    "/v1/jobs/{job}/actions",
    response_model=list[ActionOut],
    dependencies=[ReadAuth],
    summary="Actions of a job",
)
def job_actions(
    job: JobId, session: SessionDep, state: Annotated[ActionState | None, Query()] = None
) -> list[ActionOut]:
    if jobs_db.get_job(session, job=job) is None:
        raise NotFound(f"no job {job!r}")
    return [to_out(r) for r in actions.list_actions(session, job=job, state=state)]


@router.get(
    "/v1/actions", response_model=list[ActionOut], dependencies=[ReadAuth], summary="All actions"
)
def all_actions(
    session: SessionDep, state: Annotated[ActionState | None, Query()] = None
) -> list[ActionOut]:
    return [to_out(r) for r in actions.list_actions(session, state=state)]


@router.get(
    "/v1/actions/{id}", response_model=ActionOut, dependencies=[ReadAuth], summary="One action"
)
def get_action(id: ActionId, session: SessionDep) -> ActionOut:  # noqa: A002
    row = actions.get_action(session, action_id=id)
    if row is None:
        raise NotFound(f"no action {id!r}")
    return to_out(row)


@router.get(
    "/v1/actions/{id}/events",
    response_model=list[ActionEventOut],
    dependencies=[ReadAuth],
    summary="Audit trail of one action",
)
def get_events(id: ActionId, session: SessionDep) -> list[ActionEventOut]:  # noqa: A002
    if actions.get_action(session, action_id=id) is None:
        raise NotFound(f"no action {id!r}")
    return [event_out(e) for e in actions.events(session, action_id=id)]


def _decide(
    ctx: CtxDep, session: SessionDep, action_id: str, approve: bool, body: Decision | None
) -> ActionOut:
    body = body or Decision()
    actor = body.actor or "operator"
    note = body.reason or ("approved" if approve else "rejected (no reason given)")
    row = actions.decide_manually(
        session,
        action_id=action_id,
        approve=approve,
        actor=actor,
        note=note,
        now_ns=time.time_ns(),
    )
    if row is None:
        raise NotFound(f"no action {action_id!r}")
    session.commit()
    ctx.metrics.actions.labels(row.kind, row.state).inc()
    return to_out(row)


@router.post(
    "/v1/actions/{id}/approve",
    response_model=ActionOut,
    dependencies=[OperatorAuth],
    summary="Approve a proposed action (it is executed right after)",
)
def approve(
    id: ActionId,  # noqa: A002
    ctx: CtxDep,
    session: SessionDep,
    tasks: BackgroundTasks,
    body: Annotated[Decision | None, Body()] = None,
) -> ActionOut:
    out = _decide(ctx, session, id, True, body)
    tasks.add_task(ctx.mitigation.execute_when_ready, out.job)
    return out


@router.post(
    "/v1/actions/{id}/reject",
    response_model=ActionOut,
    dependencies=[OperatorAuth],
    summary="Reject a proposed action, saying why",
)
def reject(
    id: ActionId,  # noqa: A002
    ctx: CtxDep,
    session: SessionDep,
    body: Annotated[Decision | None, Body()] = None,
) -> ActionOut:
    return _decide(ctx, session, id, False, body)
