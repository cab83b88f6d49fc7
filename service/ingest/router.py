"""``POST /v1/ingest``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from failslow.service.auth import allow_job
from failslow.service.bus.client import MessageKind
from failslow.service.context import CtxDep, IngestAuth
from failslow.service.ingest.admission import admit
from failslow.service.ingest.decode import read_json_bytes
from failslow.service.ingest.envelope import parse_envelope
from failslow.service.ingest.handoff import publish
from failslow.service.ingest.schemas import IngestResult, Rejection
from failslow.service.ingest.service import apply, job_state
from failslow.service.stream.state import ApplyResult, JobState

router = APIRouter(tags=["ingest"])

BODY_DOC = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Envelope"}}},
        "description": "A v1 envelope, optionally with Content-Encoding: gzip.",
    }
}


@router.post(
    "/v1/ingest",
    response_model=IngestResult,
    response_model_exclude_none=True,
    dependencies=[IngestAuth],
    openapi_extra=BODY_DOC,
    summary="Send one host's telemetry for one job",
    responses={
        400: {"description": "Not a valid envelope; nothing stored."},
        413: {"description": "Body over the size limit."},
        415: {"description": "Not application/json, or an unsupported encoding."},
        429: {"description": "Shedding load; see Retry-After."},
    },
)
async def ingest(request: Request, ctx: CtxDep) -> IngestResult:
    async def accept() -> tuple[JobState | None, ApplyResult]:
        body, raw, received, encoding = await read_json_bytes(
            request, max_bytes=ctx.settings.ingest.max_body_bytes
        )
        ctx.metrics.received(encoding, received)
        envelope = parse_envelope(body)
        allow_job(request, envelope.job)  # a token scoped to other jobs: 403
        if ctx.bus is not None:
            e = envelope
            return None, await publish(
                ctx.bus, MessageKind.V1, raw, job=e.job, host=e.host, agent=e.agent,
                batch_seq=e.batch_seq, records=len(e.collectives) + len(e.steps),
            )  # fmt: skip
        state = job_state(ctx.jobs, envelope.job)
        return state, await run_in_threadpool(apply, state, lambda s: s.apply(envelope))

    async def committed(taken: tuple[JobState | None, ApplyResult]) -> ApplyResult:
        state, result = taken
        if state is not None:
            await ctx.committer.committed(state)  # waiting for the commit holds no request slot
        return result

    result = await admit(ctx, accept, committed)
    return IngestResult(
        accepted=result.accepted,
        duplicates=result.duplicates,
        rejected=[Rejection(**r) for r in result.rejected],
        queued=True if ctx.bus is not None else None,
    )
