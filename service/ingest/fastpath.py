"""``POST /v2/ingest`` served ahead of FastAPI's router.

At 10K ranks a service takes over a thousand envelopes a second, and FastAPI's per-request work
(route matching over every route, dependency solving, response validation) cost as much CPU as
checking and joining an envelope's records. This ASGI middleware answers that one path itself:
the same token check (:func:`failslow.service.auth.check`), the same handler
(:func:`failslow.service.ingest.v2.handle_v2`) and the same problem+json errors
(:func:`failslow.service.errors.domain_problem`). The FastAPI route stays: it documents the path
in the OpenAPI schema and serves it when ``ingest.fast_path`` is off (the tests run both).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from failslow.service.auth import Role, check
from failslow.service.errors import FailslowError, domain_problem
from failslow.service.ingest.v2 import handle_v2

PATH = "/v2/ingest"


class V2FastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        ctx = getattr(scope["app"].state, "ctx", None)
        if ctx is None or not ctx.settings.ingest.fast_path:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            check(request, ctx.settings.auth, Role.INGEST)
            response = await handle_v2(request, ctx)
        except FailslowError as exc:
            response = domain_problem(request, exc)
        await response(scope, receive, send)
