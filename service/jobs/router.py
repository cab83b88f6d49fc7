"""``/v1/jobs``: summaries, detail, ranks, incidents of a job; flush and evaluate."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from failslow.detectors.vocab import IncidentKind
from failslow.service.context import AppContext, CtxDep, JobClientAuth, JobId, ReadAuth, SessionDep
from failslow.service.errors import NotFound, NotOwner
from failslow.service.incidents import service as incidents
from failslow.service.incidents.schemas import IncidentFilter, IncidentOut
from failslow.service.jobs import history as job_history
from failslow.service.jobs import service as jobs_db
from failslow.service.jobs import views
from failslow.service.jobs.schemas import JobDetail, JobSummary, RankOut
from failslow.service.paging import DEFAULT_LIMIT, MAX_LIMIT, Page, PageDep, one_page
from failslow.service.stream.reading import RankState

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.get("", response_model=list[JobSummary], dependencies=[ReadAuth], summary="List jobs")
def list_jobs(
    ctx: CtxDep,
    session: SessionDep,
    request: Request,
    response: Response,
    after: Annotated[
        str | None, Query(max_length=128, description="The previous page's cursor")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Jobs per page")] = DEFAULT_LIMIT,
) -> list[JobSummary]:
    counts = views.open_counts(session)
    rows = [r for r in jobs_db.list_jobs(session) if after is None or r.id > after][: limit + 1]
    page = Page(after=after, limit=limit)
    return [
        views.summary(
            row,
            jobs=ctx.jobs,
            detection=ctx.detection,
            kinds=counts.get(row.id, {}),
        )
        for row in one_page(rows, page, lambda r: r.id, request, response)
    ]


@router.get("/{job}", response_model=JobDetail, dependencies=[ReadAuth], summary="One job")
def get_job(job: JobId, ctx: CtxDep, session: SessionDep) -> JobDetail:
    row = jobs_db.get_job(session, job=job)
    if row is None:
        raise NotFound(f"no job {job!r}")
    return views.detail(
        session,
        row,
        jobs=ctx.jobs,
        detection=ctx.detection,
        kinds=views.open_counts(session, job=job).get(job, {}),
    )


@router.get("/{job}/ranks", response_model=list[RankOut], dependencies=[ReadAuth], summary="Ranks")
def get_ranks(
    job: JobId,
    ctx: CtxDep,
    session: SessionDep,
    request: Request,
    response: Response,
    state: Annotated[
        list[RankState] | None,
        Query(
            description="Only ranks in these states (repeat it for several): at 100K ranks "
            "the whole list is ~9 MB"
        ),
    ] = None,
    after: Annotated[int | None, Query(ge=-1, description="The previous page's cursor")] = None,
    limit: Annotated[
        int | None, Query(ge=1, le=MAX_LIMIT * 10, description="Ranks per page (default: all)")
    ] = None,
) -> list[RankOut]:
    if jobs_db.get_job(session, job=job) is None:
        raise NotFound(f"no job {job!r}")
    job_state = ctx.jobs.get_or_load(job)
    incident_ranks: dict[int, str] = {}
    for inc in incidents.list_incidents(session, job=job, state=IncidentFilter.OPEN):
        for r in inc.ranks:
            if incident_ranks.get(r) != IncidentKind.HANG:
                incident_ranks[r] = inc.kind
    out = views.ranks(
        job_state,
        detection=ctx.detection,
        incident_ranks=incident_ranks,
        states=frozenset(state) if state else None,
    )
    if after is None and limit is None:
        return out
    out = sorted((r for r in out if after is None or r.rank > after), key=lambda r: r.rank)
    if limit is None:
        return out
    page = Page(limit=limit)
    return one_page(out[: limit + 1], page, lambda r: str(r.rank), request, response)


@router.get(
    "/{job}/incidents",
    response_model=list[IncidentOut],
    dependencies=[ReadAuth],
    summary="Incidents of a job",
)
def job_incidents(
    job: JobId,
    session: SessionDep,
    page: PageDep,
    request: Request,
    response: Response,
    state: Annotated[IncidentFilter, Query()] = IncidentFilter.ALL,
) -> list[IncidentOut]:
    if jobs_db.get_job(session, job=job) is None:
        raise NotFound(f"no job {job!r}")
    rows = incidents.list_incidents(session, job=job, state=state, page=page)
    rows = one_page(rows, page, lambda r: r.id, request, response)
    return [incidents.to_out(r) for r in rows]


def _run_and_summarise(ctx: AppContext, job: str, *, flush: bool, mitigate: bool) -> JobSummary:
    with ctx.sessions() as session:
        if jobs_db.get_job(session, job=job) is None:
            raise NotFound(f"no job {job!r}")
    if ctx.ownership is not None and not ctx.ownership.owns(job):
        raise NotOwner(f"job {job!r} is owned by another replica; GET /v1/replica on each "
                       "replica names the partitions it owns")  # fmt: skip
    state = ctx.jobs.get_or_load(job)
    ctx.detection.run_job(state, flush=flush)
    if mitigate:
        ctx.mitigation.run_job(job)
    with ctx.sessions() as session:
        row = jobs_db.get_job(session, job=job)
        assert row is not None
        return views.summary(
            row,
            jobs=ctx.jobs,
            detection=ctx.detection,
            kinds=views.open_counts(session, job=job).get(job, {}),
        )


@router.post(
    "/{job}/flush",
    response_model=JobSummary,
    dependencies=[JobClientAuth],
    summary="Run detection over everything received for the job",
)
async def flush(job: JobId, ctx: CtxDep) -> JobSummary:
    return await run_in_threadpool(_run_and_summarise, ctx, job, flush=True, mitigate=False)


@router.post(
    "/{job}/evaluate",
    response_model=JobSummary,
    dependencies=[JobClientAuth],
    summary="Run detection and the mitigation policy for the job now (replay tools, tests)",
)
async def evaluate(job: JobId, ctx: CtxDep) -> JobSummary:
    return await run_in_threadpool(_run_and_summarise, ctx, job, flush=False, mitigate=True)


@router.get(
    "/{job}/history",
    dependencies=[ReadAuth],
    summary="Downsampled history: job step time and each rank's speed per bucket of steps",
    response_class=Response,
    responses={
        200: {
            "content": {"application/json": {}},
            "description": "``buckets``: the job's step time per bucket; ``ranks``: at most "
            "``max_ranks`` ranks (the slowest) with their score per bucket; ``ranks_total``: "
            "ranks with history. An ``ETag`` that changes when the history does.",
        },
        304: {"description": "Unchanged since the ``If-None-Match`` ETag."},
    },
)
def get_history(
    job: JobId,
    request: Request,
    session: SessionDep,
    buckets: Annotated[int, Query(ge=1, le=2000)] = 120,
    max_ranks: Annotated[
        int, Query(ge=1, le=1_000_000, description="At most this many ranks: the slowest.")
    ] = 1024,
) -> Response:
    if jobs_db.get_job(session, job=job) is None:
        raise NotFound(f"no job {job!r}")
    # The status page asks every 2 s; the history changes once per bucket of steps. At 100K
    # ranks the answer costs seconds of CPU: answered 304 while unchanged.
    version = job_history.version(session, job=job) or ()
    tag = '"' + ".".join(str(v) for v in (*version, buckets, max_ranks)) + '"'
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if request.headers.get("if-none-match") == tag:
        return Response(status_code=304, headers=headers)
    body = job_history.history(session, job=job, buckets=buckets, max_ranks=max_ranks)
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)
