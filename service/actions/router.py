"""``/v1/actions`` and ``/v1/jobs/{job}/actions``: what the policy decided, and operators' say."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Body, Path, Query, Request, Response

from failslow.service.actions import service as actions
from failslow.service.actions.schemas import (
    ActionEventOut,
    ActionOut,
    ActionState,
    Decision,
    event_out,
    to_out,
)
from failslow.service.context import ActorDep, CtxDep, JobId, OperatorAuth, ReadAuth, SessionDep
from failslow.service.control import service as control
from failslow.service.control.schemas import AuditVerb
from failslow.service.errors import InvalidRequest, NotFound
from failslow.service.jobs import service as jobs_db
from failslow.service.paging import Page, PageDep, one_page

router = APIRouter(tags=["actions"])
ActionId = Annotated[str, Path(max_length=40)]


@router.get(
    "/v1/jobs/{job}/actions",
    response_model=list[ActionOut],
    dependencies=[ReadAuth],
    summary="Actions of a job",
)
def job_actions(
    job: JobId,
    session: SessionDep,
    page: PageDep,
    request: Request,
    response: Response,
    state: Annotated[ActionState | None, Query()] = None,
) -> list[ActionOut]:
    if jobs_db.get_job(session, job=job) is None:
        raise NotFound(f"no job {job!r}")
    return _page(session, page, request, response, job=job, state=state)


def _page(session: SessionDep, page: Page, request: Request, response: Response,
          **where: str | None) -> list[ActionOut]:  # fmt: skip
    try:
        rows = actions.list_actions(session, page=page, **where)  # type: ignore[arg-type]
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    return [to_out(r) for r in one_page(rows, page, actions.cursor, request, response)]


@router.get(
    "/v1/actions", response_model=list[ActionOut], dependencies=[ReadAuth], summary="All actions"
)
def all_actions(
    session: SessionDep,
    page: PageDep,
    request: Request,
    response: Response,
    state: Annotated[ActionState | None, Query()] = None,
) -> list[ActionOut]:
    return _page(session, page, request, response, state=state)


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
    ctx: CtxDep,
    session: SessionDep,
    action_id: str,
    approve: bool,
    body: Decision | None,
    actor: str,
) -> ActionOut:
    body = body or Decision()
    note = body.reason or ("approved" if approve else "rejected (no reason given)")
    now = time.time_ns()
    row = actions.decide_manually(
        session, action_id=action_id, approve=approve, actor=actor, note=note, now_ns=now
    )
    if row is None:
        raise NotFound(f"no action {action_id!r}")
    verb = AuditVerb.APPROVE if approve else AuditVerb.REJECT
    control.audit(session, actor=actor, verb=verb, job=row.job_id, target=row.id, reason=note,
                  detail={"kind": row.kind, "state": row.state}, now_ns=now)  # fmt: skip
    session.commit()
    ctx.metrics.action(row.kind, row.state, training_job=row.job_id, action=row.id,
                       incident=row.incident_id or "", target=row.target, actor=actor)  # fmt: skip
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
    actor: ActorDep,
    body: Annotated[Decision | None, Body()] = None,
) -> ActionOut:
    out = _decide(ctx, session, id, True, body, actor)
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
    actor: ActorDep,
    body: Annotated[Decision | None, Body()] = None,
) -> ActionOut:
    return _decide(ctx, session, id, False, body, actor)
