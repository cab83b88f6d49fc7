"""``/v1/jobs/{job}/plan``: the execution plan training jobs poll (with ETag), and the workload
they declare so that a rebalance knows the global batch."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Request, Response
from starlette.concurrency import run_in_threadpool

from service.auth import Role, check
from service.context import AppContext, CtxDep, ReadAuth, SessionDep, get_ctx
from service.errors import Forbidden, NotFound
from service.jobs import service as jobs_db
from service.jobs import views
from service.jobs.schemas import JobSummary
from service.plans import service as plans
from service.plans.schemas import (
    PlanAck,
    PlanOut,
    PlanVersionOut,
    WorkloadIn,
    WorkloadOut,
    plan_out,
)

router = APIRouter(prefix="/v1/jobs", tags=["plans"])
JobId = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")]


def _job_client_auth(request: Request, ctx: Annotated[AppContext, Depends(get_ctx)]) -> None:
    """What training jobs call (declare, evaluate) takes an ingest or an operator token."""
    try:
        check(request, ctx.settings.auth, Role.INGEST)
    except Forbidden:
        check(request, ctx.settings.auth, Role.OPERATOR)


def _plan_reader_auth(request: Request, ctx: Annotated[AppContext, Depends(get_ctx)]) -> None:
    """Training jobs read their plan with the agents' ingest token; readers too."""
    try:
        check(request, ctx.settings.auth, Role.INGEST)
    except Forbidden:
        check(request, ctx.settings.auth, Role.READ)


def _match(header: str | None, tag: str) -> bool:
    if not header:
        return False
    if header.strip() == "*":
        return True
    return any(t.strip().removeprefix("W/") == tag for t in header.split(","))


@router.get(
    "/{job}/plan",
    response_model=PlanOut,
    dependencies=[Depends(_plan_reader_auth)],
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
    version, body, created = plans.current(session, job=job)
    tag = plans.etag(job, version)
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if _match(if_none_match, tag):
        return Response(status_code=304, headers=headers)
    response.headers.update(headers)
    row = plans.version(session, job=job, version=version) if version else None
    return plan_out(job, version, body, created, row.applied_step if row is not None else None)


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
    dependencies=[Depends(_job_client_auth)],
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
    dependencies=[Depends(_job_client_auth)],
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


@router.post(
    "/{job}/evaluate",
    response_model=JobSummary,
    dependencies=[Depends(_job_client_auth)],
    summary="Run detection and the mitigation policy for the job now (replay tools, tests)",
)
async def evaluate(job: JobId, ctx: CtxDep) -> JobSummary:
    def _run() -> JobSummary:
        with ctx.sessions() as session:
            if jobs_db.get_job(session, job=job) is None:
                raise NotFound(f"no job {job!r}")
        state = ctx.jobs.get_or_load(job)
        ctx.detection.run_job(state)
        ctx.mitigation.run_job(job)
        with ctx.sessions() as session:
            row = jobs_db.get_job(session, job=job)
            assert row is not None
            return views.summary(
                row,
                jobs=ctx.jobs,
                engine=ctx.detection,
                kinds=views.open_counts(session, job=job).get(job, {}),
            )

    return await run_in_threadpool(_run)
