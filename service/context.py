"""The application context built in ``create_app``'s lifespan and its typed dependencies."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Path, Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from failslow.service.auth import OutOfScope, Role, actor_of, check
from failslow.service.errors import Forbidden
from failslow.service.ids import IDENTIFIER
from failslow.service.lease import Lease
from failslow.service.metrics import Metrics
from failslow.service.stream.registry import JobRegistry

if TYPE_CHECKING:  # the engines are built by create_app; routers only use what they hold
    from failslow.service.actions.scheduler import Mitigation
    from failslow.service.bus.client import Bus
    from failslow.service.control.reader import Controls
    from failslow.service.detection.engine import DetectionEngine
    from failslow.service.detection.stale import StaleCloser
    from failslow.service.fleet.ledger import FleetLedger
    from failslow.service.ingest.service import Committer
    from failslow.service.probes.manager import ProbeManager
    from failslow.service.replica.ownership import Ownership
    from failslow.service.settings import Settings


@dataclass(slots=True)
class AppContext:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    metrics: Metrics
    jobs: JobRegistry
    detection: DetectionEngine
    mitigation: Mitigation
    probes: ProbeManager
    committer: Committer
    controls: Controls  # runtime control (mute, pause, overrides) as detection and policy read it
    stale: StaleCloser
    fleet: FleetLedger
    lease: Lease | None = None  # None: the single-writer check is off (lease_ttl_s = 0)
    ingest_inflight: int = 0
    bus: Bus | None = None  # set: ingest publishes to the stream (docs/replicas.md)
    ownership: Ownership | None = None  # with a bus: the partitions this replica owns


async def get_ctx(request: Request) -> AppContext:
    """Async on purpose: FastAPI runs a plain ``def`` dependency in a worker thread (a hop per
    request); this one and the token checks below do not block."""
    return request.app.state.ctx  # type: ignore[no-any-return]


def get_session(ctx: Annotated[AppContext, Depends(get_ctx)]) -> Iterator[Session]:
    session = ctx.sessions()
    try:
        yield session
    finally:
        session.close()


CtxDep = Annotated[AppContext, Depends(get_ctx)]
SessionDep = Annotated[Session, Depends(get_session)]


def require(role: Role) -> Callable[[Request, AppContext], Awaitable[None]]:
    async def dependency(request: Request, ctx: CtxDep) -> None:
        check(request, ctx.settings.auth, role)

    return dependency


def require_any(*roles: Role) -> Callable[[Request, AppContext], Awaitable[None]]:
    """A token with any one of ``roles`` (403 only when it has none of them)."""

    async def dependency(request: Request, ctx: CtxDep) -> None:
        for role in roles[:-1]:
            try:
                check(request, ctx.settings.auth, role)
                return
            except OutOfScope:
                raise
            except Forbidden:
                continue
        check(request, ctx.settings.auth, roles[-1])

    return dependency


JobId = Annotated[str, Path(pattern=IDENTIFIER)]
HostId = Annotated[str, Path(pattern=IDENTIFIER)]
ReadAuth = Depends(require(Role.READ))
IngestAuth = Depends(require(Role.INGEST))
OperatorAuth = Depends(require(Role.OPERATOR))
# what replay tools and training jobs call (flush, evaluate, declare, acknowledge)
JobClientAuth = Depends(require_any(Role.INGEST, Role.OPERATOR))
# training jobs read their plan with the agents' token; readers too
PlanReadAuth = Depends(require_any(Role.INGEST, Role.READ))


async def get_actor(request: Request, ctx: CtxDep) -> str:
    """Who makes this request's change (from its token, never from its body)."""
    client = request.client.host if request.client is not None else None
    return actor_of(request.headers.get("authorization", ""), ctx.settings.auth, client)


ActorDep = Annotated[str, Depends(get_actor)]
