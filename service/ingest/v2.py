"""Ingest v2 (docs/ingest-v2.md): ``PUT /v2/jobs/{job}/topology/{host}`` registers a host's ranks
and communicators once; ``POST /v2/ingest`` takes its records as binary columns that name them by
digest and position. Same partial acceptance and problem+json rules as v1."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from failslow.service.auth import allow, job_scope
from failslow.service.context import AppContext, CtxDep, IngestAuth, JobId
from failslow.service.errors import (
    InvalidEnvelope,
    InvalidTopology,
    UnknownTopology,
)
from failslow.service.ids import IDENTIFIER, is_identifier
from failslow.service.ingest.admission import admit, check_queue
from failslow.service.ingest.decode import read_body, read_json_bytes
from failslow.service.ingest.envelope import completeness
from failslow.service.ingest.handoff import publish_registration, publish_v2
from failslow.service.ingest.schemas import CommIn, IngestResult, RankIn
from failslow.service.ingest.service import apply, existing_job, job_state
from failslow.service.stream import columnar
from failslow.service.stream.parse import INT64_MAX, is_int
from failslow.service.stream.state import ApplyResult, JobState
from failslow.wire import v2

router = APIRouter(tags=["ingest"])
HostId = Annotated[str, Path(pattern=IDENTIFIER)]


class TopologyIn(BaseModel):
    """A host's ranks and the communicators its records name (position = code)."""

    sent_ns: int = Field(ge=0, description="The host's clock when it registered.")
    ranks: list[RankIn] = Field(description="The ranks on this host.")
    comms: list[CommIn] = Field(
        description="Every communicator the host's records name; its position in this list is "
        "its code in the host's v2 envelopes."
    )


class TopologyOut(BaseModel):
    digest: str = Field(description="What the host's v2 envelopes name in header.topology.")
    ranks: int
    comms: int


V2_BODY = {
    "requestBody": {
        "required": True,
        "content": {v2.MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
        "description": "A v2 envelope (docs/ingest-v2.md), optionally with Content-Encoding: "
        "gzip.",
    }
}


def _check_header(header: dict[str, Any]) -> None:
    """The header's own rules. ``agent`` and ``batch_seq`` go together and are required when the
    envelope carries records (only a heartbeat may go without: re-sends are whole batches)."""
    errors = []
    for name in ("job", "host"):
        if not is_identifier(header.get(name)):
            errors.append({"loc": f"header.{name}", "msg": f"must match {IDENTIFIER}"})
    sent = header.get("sent_ns")
    if not is_int(sent) or not 0 <= sent <= INT64_MAX:
        errors.append({"loc": "header.sent_ns", "msg": "must be a non-negative integer"})
    agent, seq = header.get("agent"), header.get("batch_seq")
    records = header.get("collectives", 0) + header.get("steps", 0)
    if (agent is None) != (seq is None) or (records and agent is None):
        errors.append({"loc": "header.batch_seq", "msg": "agent and batch_seq are required"})
    if agent is not None and not is_identifier(agent):
        errors.append({"loc": "header.agent", "msg": f"must match {IDENTIFIER}"})
    if seq is not None and (not is_int(seq) or not 0 <= seq <= INT64_MAX):
        errors.append({"loc": "header.batch_seq", "msg": "must be a non-negative integer"})
    completeness(header, sent, errors, "header.")
    if not isinstance(header.get("topology"), str):
        errors.append({"loc": "header.topology", "msg": "the digest of a registered topology"})
    if errors:
        raise InvalidEnvelope("the envelope is not valid; nothing was stored", errors=errors)


@router.put(
    "/v2/jobs/{job}/topology/{host}",
    response_model=TopologyOut,
    dependencies=[IngestAuth],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/TopologyIn"}}
            },
        }
    },
    summary="Register a host's ranks and communicators for v2 envelopes",
    responses={422: {"description": "A rank or comm breaks a rule; nothing was registered."}},
)
async def register_topology(
    job: JobId, host: HostId, request: Request, ctx: CtxDep
) -> TopologyOut:
    body, raw, _, _ = await read_json_bytes(
        request, max_bytes=ctx.settings.ingest.max_body_bytes
    )
    if not isinstance(body, dict) or not isinstance(body.get("ranks", []), list):
        raise InvalidTopology("the body must be an object with ranks and comms lists")
    sent_ns, ranks, comms = body.get("sent_ns"), body.get("ranks", []), body.get("comms", [])
    if not is_int(sent_ns) or not 0 <= sent_ns <= INT64_MAX or not isinstance(comms, list):
        raise InvalidTopology("sent_ns (ns since epoch) and a comms list are required")

    def register(state: Any) -> columnar.HostTopology:
        state.topology.touch_host(host, sent_ns, time.monotonic())
        return columnar.register_topology(state, host, ranks, comms)

    def check(state: Any) -> None:
        columnar.check_for(state, ranks, comms)

    bus = ctx.bus
    try:
        # with a bus, checked on its own here (a scratch job) and applied by the job's owner;
        # without, a new job is made only for a registration that holds (checked on a scratch
        # job first): a refused request makes nothing (issue 31)
        if bus is not None:
            state = JobState(job, ctx.settings.state)
        elif (state := existing_job(ctx.jobs, job)) is None:
            await run_in_threadpool(apply, JobState(job, ctx.settings.state), check)
            state = job_state(ctx.jobs, job)
        ht = await run_in_threadpool(apply, state, register)
    except columnar.RegistrationError as exc:
        raise InvalidTopology("the topology is not valid; nothing was registered",
                              errors=exc.errors) from None  # fmt: skip
    if bus is None:
        await ctx.committer.committed(state)
    else:
        await publish_registration(bus, raw, job=job, host=host, digest=ht.digest)
    return TopologyOut(digest=ht.digest, ranks=int(ht.ranks.size), comms=int(ht.comm_index.size))


@router.post(
    "/v2/ingest",
    response_model=IngestResult,
    response_model_exclude_none=True,
    dependencies=[IngestAuth],
    openapi_extra=V2_BODY,
    summary="Send one host's telemetry for one job as binary columns",
    responses={
        400: {"description": "Not a valid v2 envelope; nothing stored."},
        409: {"description": "The topology digest is unknown: register it, then re-send."},
        413: {"description": "Body over the size limit."},
        415: {"description": "Not application/vnd.failslow.v2, or an unsupported encoding."},
        429: {"description": "Shedding load; see Retry-After."},
    },
)
async def ingest_v2(request: Request, ctx: CtxDep) -> Response:
    # served by fastpath.serve unless ingest.fast_path is off; documented and tested here
    async def read() -> tuple[bytes, int, str]:
        return await read_body(
            request, media_types=(v2.MEDIA_TYPE,), max_bytes=ctx.settings.ingest.max_body_bytes
        )

    answer = await handle_v2(ctx, read, job_scope(request))
    return Response(answer, media_type="application/json")


async def handle_v2(
    ctx: AppContext, read: Callable[[], Awaitable[tuple[bytes, int, str]]],
    scope: list[str] | None,
) -> bytes:  # fmt: skip
    """Accept one v2 envelope (the token was checked; ``scope``: its job patterns) whose body
    ``read`` gives as ``(body, bytes on the wire, encoding)``; the JSON answer."""

    async def rest(taken: tuple[bytes, int, str]) -> ApplyResult:
        body, received, encoding = taken
        ctx.metrics.received(encoding, received)
        return await accept_v2(ctx, body, scope)

    result = await admit(ctx, read, rest)
    return orjson.dumps(answer_of(ctx, result))


async def accept_v2(ctx: AppContext, body: bytes, scope: list[str] | None) -> ApplyResult:
    """One decompressed v2 body, from its header to its result (raises the FailslowError it
    is answered with); ``POST /v2/ingest``."""
    return await settle_v2(submit_v2(ctx, body, scope))


def submit_v2(ctx: AppContext, body: bytes, scope: list[str] | None) -> Awaitable[ApplyResult]:
    """Check one decompressed v2 body and hand it on without waiting: queued for the next
    group commit (a future), or with a bus the publication still to be awaited. Raises the
    FailslowError of a body refused at once. Bodies submitted one after another are applied
    in that order."""
    try:
        header, layout = v2.decode_header(body)
    except v2.FormatError as exc:
        raise InvalidEnvelope(str(exc)) from None
    _check_header(header)
    allow(scope, header["job"])  # a token scoped to other jobs: 403
    if ctx.bus is not None:
        return publish_v2(ctx.bus, header, body)
    # a job nobody registered has no digest to know: 409 without making the job (a tenant's
    # heartbeats naming 1,100 unknown jobs once filled max_jobs and evicted another's; issue 31)
    state = existing_job(ctx.jobs, header["job"])
    if state is None:
        raise _unknown(columnar.UnknownTopology(header["host"], header["topology"]))
    check_queue(ctx, len(body))
    return ctx.committer.queue_v2(state, header, body, layout)


async def settle_v2(pending: Awaitable[ApplyResult]) -> ApplyResult:
    """The result of a submitted body (raises the FailslowError it is answered with)."""
    try:
        return await pending
    except columnar.UnknownTopology as exc:
        raise _unknown(exc) from None


def _unknown(exc: columnar.UnknownTopology) -> UnknownTopology:
    return UnknownTopology(str(exc), errors=[{"loc": "header.topology", "msg": exc.digest}])


def answer_of(ctx: AppContext, result: ApplyResult) -> dict[str, Any]:
    """The JSON answer to an accepted v2 body (IngestResult)."""
    answer: dict[str, Any] = {"accepted": result.accepted, "duplicates": result.duplicates,
                              "rejected": result.rejected}  # fmt: skip
    if ctx.bus is not None:
        answer["queued"] = True
    return answer


__all__ = ["CommIn", "RankIn", "TopologyIn", "router"]
