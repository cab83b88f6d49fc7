"""What every ingest request goes through, v1 and v2 alike: the bound on requests in progress
(429 with Retry-After), the request count and latency, the wait for the commit (which holds no
request slot) and the record metrics."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from failslow.service.context import AppContext
from failslow.service.errors import FailslowError, Overloaded
from failslow.service.metrics import Metrics
from failslow.service.stream.state import ApplyResult, JobState


async def admit(
    ctx: AppContext, accept: Callable[[], Awaitable[tuple[JobState | None, ApplyResult]]]
) -> ApplyResult:
    """Run ``accept`` (read, decode and apply one envelope) inside the in-flight bound, then
    wait until what it applied is committed. ``accept`` gives no state when it published the
    envelope to the bus instead (the stream holds it; its owner counts its records)."""
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
            state, result = await accept()
        finally:
            ctx.ingest_inflight -= 1
        if state is not None:
            await ctx.committer.committed(state)  # waiting for the commit holds no request slot
    except FailslowError as exc:
        code = exc.status
        raise
    finally:
        m.requests.labels(str(code)).inc()
        m.request_seconds.observe(time.perf_counter() - started)
    record_metrics(m, result)
    return result


def record_metrics(m: Metrics, result: ApplyResult) -> None:
    """Count an applied envelope's records by kind, its rejections and its duplicates."""
    for kind, count in result.kinds.items():
        m.records.labels(kind).inc(count)
    for reason in result.reasons:
        m.rejected.labels(reason).inc()
    if result.duplicates:
        m.duplicates.inc(result.duplicates)
