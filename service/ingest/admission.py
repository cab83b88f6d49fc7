"""What every ingest request goes through, v1 and v2 alike: the bound on requests being read and
decoded (429 with Retry-After), the bound on v2 envelopes waiting to be applied, the request
count and latency, the wait for the commit (which holds no request slot) and the record metrics."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from failslow.service.context import AppContext
from failslow.service.errors import FailslowError, Overloaded
from failslow.service.metrics import Metrics
from failslow.service.stream.state import ApplyResult

T = TypeVar("T")


async def admit(
    ctx: AppContext,
    read: Callable[[], Awaitable[T]],
    rest: Callable[[T], Awaitable[ApplyResult]],
) -> ApplyResult:
    """``read`` (read and decode one envelope; for v1 also apply it) inside the in-flight
    bound, then ``rest`` outside it (wait for the commit, or queue and wait)."""
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
            taken = await read()
        finally:
            ctx.ingest_inflight -= 1
        result = await rest(taken)
    except FailslowError as exc:
        code = exc.status
        raise
    finally:
        m.request_done(code, time.perf_counter() - started)
    record_metrics(m, result)
    return result


def check_queue(ctx: AppContext, size: int) -> None:
    """429 when a v2 envelope of ``size`` bytes would pass the bound on what waits to be
    applied (``ingest.max_queued_bytes``)."""
    queued = ctx.committer.queued_bytes
    if queued and queued + size > ctx.settings.ingest.max_queued_bytes:
        raise Overloaded(
            "too many envelopes waiting to be applied",
            headers={"Retry-After": str(ctx.settings.ingest.retry_after_s)},
        )


def record_metrics(m: Metrics, result: ApplyResult) -> None:
    """Count an applied envelope's records by kind, its rejections and its duplicates."""
    for kind, count in result.kinds.items():
        m.record_count(kind, count)
    for reason in result.reasons:
        m.rejected.labels(reason).inc()
    if result.duplicates:
        m.duplicates.inc(result.duplicates)
