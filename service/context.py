"""The application context built in ``create_app``'s lifespan and its typed dependencies."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.actions.engine import Mitigation
from service.auth import Role, check
from service.detection.engine import DetectionEngine
from service.jobs.registry import JobRegistry
from service.metrics import Metrics
from service.settings import Settings


@dataclass(slots=True)
class AppContext:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    metrics: Metrics
    jobs: JobRegistry
    detection: DetectionEngine
    mitigation: Mitigation
    ingest_inflight: int = 0


def get_ctx(request: Request) -> AppContext:
    return request.app.state.ctx  # type: ignore[no-any-return]


def get_session(ctx: Annotated[AppContext, Depends(get_ctx)]) -> Iterator[Session]:
    session = ctx.sessions()
    try:
        yield session
    finally:
        session.close()


CtxDep = Annotated[AppContext, Depends(get_ctx)]
SessionDep = Annotated[Session, Depends(get_session)]


def require(role: Role) -> Callable[[Request, AppContext], None]:
    def dependency(request: Request, ctx: CtxDep) -> None:
        check(request, ctx.settings.auth, role)

    return dependency


ReadAuth = Depends(require(Role.READ))
IngestAuth = Depends(require(Role.INGEST))
OperatorAuth = Depends(require(Role.OPERATOR))
