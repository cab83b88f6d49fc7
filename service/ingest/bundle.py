"""``POST /v2/ingest/bundle``: many v2 bodies in one request (docs/ingest-v2.md, section 2b).

What one request costs the service whatever it carries (HTTP, the request's Python, gzip, the
wait for the group commit) is several times what applying a host's 240 records costs, so a
sender that holds several hosts' envelopes — a relay in front of a rack, a replay tool — sends
them together. Each body is checked, applied and answered exactly as if it had come alone
(:func:`failslow.service.ingest.v2.submit_v2` and ``settle_v2``, which ``accept_v2`` is): the
answer lists, in bundle order, either its IngestResult or the problem it would have been
answered with. Only a bundle whose framing, media type, size or token is wrong is refused whole.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from failslow.service.auth import job_scope
from failslow.service.context import AppContext, CtxDep, IngestAuth
from failslow.service.errors import (
    FailslowError,
    InvalidEnvelope,
    error_fields,
    log_unexpected,
    unexpected_fields,
)
from failslow.service.ingest.admission import admit, record_metrics
from failslow.service.ingest.decode import read_body
from failslow.service.ingest.schemas import Rejection
from failslow.service.ingest.v2 import answer_of, settle_v2, submit_v2
from failslow.service.stream.state import ApplyResult
from failslow.wire import v2

router = APIRouter(tags=["ingest"])


class BundleItem(BaseModel):
    """One body's answer: its IngestResult, or the problem it was refused with."""

    accepted: int | None = Field(default=None, description="As in IngestResult.")
    duplicates: int | None = Field(default=None, description="As in IngestResult.")
    rejected: list[Rejection] | None = Field(default=None, description="As in IngestResult.")
    queued: bool | None = Field(default=None, description="As in IngestResult.")
    status: int | None = Field(
        default=None, description="Set when the body was refused: the HTTP status it would "
        "have been answered with alone (400, 403, 409, 429, 503, ...).",
    )  # fmt: skip
    type: str | None = None
    title: str | None = None
    detail: str | None = None
    errors: list[dict[str, Any]] | None = None
    correlation_id: str | None = Field(
        default=None, description="With 500: the id of the service log's line about it."
    )
    retry_after_s: int | None = Field(
        default=None, description="With 429 and 503: when to send this body again."
    )


class BundleResult(BaseModel):
    items: list[BundleItem] = Field(description="One answer per body, in bundle order.")


BUNDLE_BODY = {
    "requestBody": {
        "required": True,
        "content": {v2.BUNDLE_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
        "description": "b'FSLB', uint32 LE count, then per body its uint32 LE length and the "
        "v2 body (docs/ingest-v2.md); optionally with Content-Encoding: gzip over the whole.",
    }
}


def _refused(exc: FailslowError) -> dict[str, Any]:
    """A refused body's answer: its problem's fields, and when to retry (429, 503)."""
    item = error_fields(exc)
    retry = (exc.headers or {}).get("Retry-After")
    if retry is not None and retry.isdigit():
        item["retry_after_s"] = int(retry)
    return item


def _bug(exc: BaseException) -> dict[str, Any]:
    """A body that failed by a bug, not by the client: answered as a 500 whose correlation id
    the log line carries too (as :func:`~failslow.service.errors.unexpected_problem`)."""
    return unexpected_fields(log_unexpected("a body of POST /v2/ingest/bundle", exc))


async def accept_bundle(
    ctx: AppContext, bodies: list[bytes], scope: list[str] | None
) -> list[dict[str, Any]]:
    """Every body of a bundle, answered in order. Without a bus every body is checked and
    queued for the next group commit first, in bundle order, then the answers are gathered (no
    task per body); with a bus each is published before the next is looked at. Either way one
    agent's batches in one bundle are applied in the order they were put in."""
    pending: list[Awaitable[ApplyResult] | BaseException] = []
    for body in bodies:
        try:
            p = submit_v2(ctx, body, scope)
            pending.append(p if ctx.bus is None else await _settled(p))
        except Exception as exc:  # noqa: BLE001 - answered per body below
            pending.append(exc)
    items = []
    for p in pending:
        out = p if isinstance(p, BaseException | ApplyResult) else await _settled(p)
        if isinstance(out, ApplyResult):
            record_metrics(ctx.metrics, out)
            items.append(answer_of(ctx, out))
        elif isinstance(out, FailslowError):
            items.append(_refused(out))
        else:
            items.append(_bug(out))
    return items


async def _settled(pending: Awaitable[ApplyResult]) -> ApplyResult | BaseException:
    try:
        return await settle_v2(pending)
    except Exception as exc:  # noqa: BLE001 - answered per body
        return exc


@router.post(
    "/v2/ingest/bundle",
    response_model=BundleResult,
    response_model_exclude_none=True,
    dependencies=[IngestAuth],
    openapi_extra=BUNDLE_BODY,
    summary="Send several v2 envelopes (any hosts, any jobs) in one request",
    responses={
        400: {"description": "Not a bundle (framing); nothing stored."},
        413: {"description": "Body over the size limit."},
        415: {"description": "Not application/vnd.failslow.v2-bundle, or another encoding."},
        429: {"description": "Shedding load; see Retry-After."},
    },
)
async def ingest_bundle(request: Request, ctx: CtxDep) -> Response:
    # served by fastpath.serve unless ingest.fast_path is off; documented and tested here
    async def read() -> tuple[bytes, int, str]:
        return await read_body(request, media_types=(v2.BUNDLE_MEDIA_TYPE,),
                               max_bytes=ctx.settings.ingest.max_body_bytes)  # fmt: skip

    answer = await handle_bundle(ctx, read, job_scope(request))
    return Response(answer, media_type="application/json")


async def handle_bundle(
    ctx: AppContext, read: Callable[[], Awaitable[tuple[bytes, int, str]]],
    scope: list[str] | None,
) -> bytes:  # fmt: skip
    """Accept one bundle (the token was checked; ``scope``: its job patterns) whose body
    ``read`` gives as ``(body, bytes on the wire, encoding)``; the JSON answer."""
    items: list[dict[str, Any]] = []

    async def rest(taken: tuple[bytes, int, str]) -> ApplyResult:
        body, received, encoding = taken
        ctx.metrics.received(encoding, received)
        try:
            bodies = v2.decode_bundle(body)
        except v2.FormatError as exc:
            raise InvalidEnvelope(str(exc)) from None
        items.extend(await accept_bundle(ctx, bodies, scope))
        return ApplyResult()  # each body's records were counted with it

    await admit(ctx, read, rest)
    return orjson.dumps({"items": items})
