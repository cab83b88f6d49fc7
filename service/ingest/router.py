"""``POST /v1/ingest``."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from failslow.service.context import CtxDep, IngestAuth
from failslow.service.errors import FailslowError, Overloaded
from failslow.service.ingest.decode import read_json
from failslow.service.ingest.envelope import parse_envelope
from failslow.service.ingest.schemas import IngestResult, Rejection
from failslow.service.ingest.service import apply, job_state

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
    started = time.perf_counter()
    m = ctx.metrics
    code = 200
    try:
        if ctx.ingest_inflight >= ctx.settings.ingest.max_concurrent_requests:
            raise Overloaded(
                "too many ingest requests in progress",
                headers={"Retry-After": str(ctx.settings.ingest.retry_after_s)},
            )
        ctx.ingest_inflight += 1
        try:
            body, received, encoding = await read_json(
                request, max_bytes=ctx.settings.ingest.max_body_bytes
            )
            m.bytes.labels(encoding).inc(received)
            envelope = parse_envelope(body)
            state = job_state(ctx.jobs, envelope.job)
            result = await run_in_threadpool(apply, state, lambda s: s.apply(envelope))
        finally:
            ctx.ingest_inflight -= 1
        await ctx.committer.committed(state)  # waiting for the commit holds no request slot
    except FailslowError as exc:
        code = exc.status
        raise
    finally:
        m.requests.labels(str(code)).inc()
        m.request_seconds.observe(time.perf_counter() - started)
    for kind, count in result.kinds.items():
        m.records.labels(kind).inc(count)
    for reason in result.reasons:
        m.rejected.labels(reason).inc()
    if result.duplicates:
        m.duplicates.inc(result.duplicates)
    return IngestResult(
        accepted=result.accepted,
        duplicates=result.duplicates,
        rejected=[Rejection(**r) for r in result.rejected],
    )
