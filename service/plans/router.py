"""``/v1/jobs/{job}/plan``: the execution plan training jobs poll (with ETag) and acknowledge,
and the workload they declare so that a rebalance knows the global batch."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Header, Response

from failslow.service.context import (
    CtxDep,
    JobClientAuth,
    JobId,
    PlanReadAuth,
    ReadAuth,
    SessionDep,
)
from failslow.service.errors import NotFound
from failslow.service.jobs import service as jobs_db
from failslow.service.plans import service as plans
from failslow.service.plans.schemas import (
    PlanAck,
    PlanOut,
    PlanVersionOut,
    WorkloadIn,
    WorkloadOut,
    plan_out,
)

router = APIRouter(prefix="/v1/jobs", tags=["plans"])


def _match(header: str | None, tag: str) -> bool:
    if not header:
        return False
    if header.strip() == "*":
        return True
    return any(t.strip().removeprefix("W/") == tag for t in header.split(","))


@router.get(
    "/{job}/plan",
    response_model=PlanOut,
    dependencies=[PlanReadAuth],
    summary="The job's current plan (conditional GET with If-None-Match -> 304)",
    responses={304: {"description": "Not modified: the ETag still matches"}},
)
def get_plan(
    job: JobId,
    session: SessionDep,
    response: Response,
    if_none_match: Annotated[str | None, Header()] = None,
) -> PlanOut | Response:
    if jobs_db.get_job(session, job=job) is None:
        raise NotFound(f"no job {job!r}")
    row = plans.newest(session, job=job)
    version = row.version if row is not None else 0
    tag = plans.etag(job, version)
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if _match(if_none_match, tag):
        return Response(status_code=304, headers=headers)
    response.headers.update(headers)
    if row is None:
        return plan_out(job, 0, dict(plans.EMPTY), 0)
    return plan_out(job, version, {**plans.EMPTY, **row.body}, row.created_ns, row.applied_step)


@router.get(
    "/{job}/plan/history",
    response_model=list[PlanVersionOut],
    dependencies=[ReadAuth],
    summary="Every published version of the job's plan",
)
def plan_history(job: JobId, session: SessionDep) -> list[PlanVersionOut]:
    if jobs_db.get_job(session, job=job) is None:
        raise NotFound(f"no job {job!r}")
    out = []
    for row in plans.history(session, job=job):
        base = plan_out(
            job, row.version, {**plans.EMPTY, **row.body}, row.created_ns, row.applied_step
        )
        out.append(PlanVersionOut(**base.model_dump(), action=row.action_id))
    return out


@router.post(
    "/{job}/plan/ack",
    response_model=PlanVersionOut,
    dependencies=[JobClientAuth],
    summary="The training job says from which step it runs a plan version",
)
def ack_plan(job: JobId, body: PlanAck, ctx: CtxDep, session: SessionDep) -> PlanVersionOut:
    row = plans.acknowledge(
        session, job=job, version=body.version, step=body.step, now_ns=time.time_ns()
    )
    if row is None:
        raise NotFound(f"no plan version {body.version} for job {job!r}")
    session.commit()
    ctx.mitigation.acknowledged(job, body.version, body.step)
    base = plan_out(job, row.version, {**plans.EMPTY, **row.body}, row.created_ns, row.applied_step)
    return PlanVersionOut(**base.model_dump(), action=row.action_id)


@router.put(
    "/{job}/workload",
    response_model=WorkloadOut,
    dependencies=[JobClientAuth],
    summary="Declare the job's global batch (what micro-batch shares must sum to)",
)
def put_workload(job: JobId, body: WorkloadIn, session: SessionDep) -> WorkloadOut:
    if jobs_db.get_job(session, job=job) is None:
        raise NotFound(f"no job {job!r}: the job's agents must send telemetry first")
    row = plans.declare_workload(
        session, job=job, global_batch=body.global_batch, unit=body.unit, now_ns=time.time_ns()
    )
    session.commit()
    return WorkloadOut(
        job=job, global_batch=row.global_batch, unit=body.unit, updated_ns=row.updated_ns
    )
