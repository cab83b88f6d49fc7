"""``/healthz``, ``/readyz``, ``/metrics``, ``/v1/replica``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from failslow.service.auth import Role, check
from failslow.service.context import CtxDep, ReadAuth
from failslow.service.db import check_ready
from failslow.service.errors import Unavailable

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Process alive")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Storage reachable and migrations applied")
async def readyz(ctx: CtxDep) -> dict[str, str]:
    if ctx.lease is not None and ctx.lease.lost:
        raise Unavailable(ctx.lease.lost)
    if ctx.bus is not None and (ctx.bus.nc is None or not ctx.bus.nc.is_connected):
        raise Unavailable("not connected to NATS")
    ok, reason = await run_in_threadpool(check_ready, ctx.engine)
    if not ok:
        raise Unavailable(reason)
    return {"status": "ready"}


@router.get("/metrics", summary="Prometheus text exposition", response_class=Response)
async def metrics(request: Request, ctx: CtxDep) -> Response:
    if not ctx.settings.auth.metrics_public:
        check(request, ctx.settings.auth, Role.READ)
    body = await run_in_threadpool(generate_latest, ctx.metrics.registry)
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/replica", dependencies=[ReadAuth], summary="This replica and what it owns")
async def replica(ctx: CtxDep) -> dict[str, object]:
    """Without a bus: ``{"bus": false}``. With one: this replica's name and, per partition it
    owns, the claim's epoch, the committed stream position and the jobs held (docs/replicas.md)."""
    if ctx.ownership is None:
        return {"bus": False}
    out = {"bus": True, **ctx.ownership.describe()}
    if ctx.bus is not None:  # lag: the partition's newest message vs what is applied here
        for p, part in out["owned"].items():  # type: ignore[attr-defined]
            last = await ctx.bus.last_seq(int(p))
            part["stream_last_seq"] = last
            part["behind"] = 0 if last is None else max(0, last - int(part["applied_through"]))
    return out
