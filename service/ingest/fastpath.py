"""``POST /v2/ingest`` and ``POST /v2/ingest/bundle`` answered before FastAPI.

At 10K ranks a service takes over a thousand envelopes a second, and what FastAPI and Starlette
do per request (the middleware stack, routing over every route, a Request object, dependency
solving) cost more CPU than checking and joining an envelope's records. :class:`FailslowApp`
answers those two paths itself, straight from the ASGI scope: the same token check
(:func:`failslow.service.auth.authorize`), the same bounded body reader
(:class:`~failslow.service.ingest.decode.BoundedBody`), the same handlers
(:func:`failslow.service.ingest.v2.handle_v2`, :func:`~failslow.service.ingest.bundle.
handle_bundle`) and the same problem+json answers, a correlation id on an unexpected error
included. The FastAPI routes stay: they document the paths in the OpenAPI schema and serve them
when ``ingest.fast_path`` is off (the tests run both).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from failslow.service.auth import Role, authorize
from failslow.service.context import AppContext
from failslow.service.errors import FailslowError, error_problem, unexpected_problem
from failslow.service.ingest.bundle import handle_bundle
from failslow.service.ingest.decode import BoundedBody, check_headers, media_type
from failslow.service.ingest.v2 import handle_v2
from failslow.wire import v2

Read = Callable[[], Awaitable[tuple[bytes, int, str]]]
Handler = Callable[[AppContext, Read, list[str] | None], Awaitable[bytes]]
PATH = "/v2/ingest"
BUNDLE_PATH = "/v2/ingest/bundle"
ROUTES: dict[str, tuple[tuple[str, ...], Handler]] = {
    PATH: ((v2.MEDIA_TYPE,), handle_v2),
    BUNDLE_PATH: ((v2.BUNDLE_MEDIA_TYPE,), handle_bundle),
}
_JSON = (b"content-type", b"application/json")


class Disconnected(Exception):
    """The client went away before its body was read: there is no one to answer."""


class FailslowApp(FastAPI):
    """The FastAPI application, with the ingest paths of :data:`ROUTES` served ahead of it."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in ROUTES:
            ctx: AppContext | None = getattr(self.state, "ctx", None)
            if ctx is not None and ctx.settings.ingest.fast_path:
                await serve(ctx, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


async def serve(ctx: AppContext, scope: Scope, receive: Receive, send: Send) -> None:
    """One v2 envelope or bundle, from the ASGI scope to the answer."""
    path = scope["path"]
    media_types, handler = ROUTES[path]
    content_type = encoding = authorization = ""
    length: str | None = None
    for name, value in scope["headers"]:  # ASGI header names are lower case
        if name == b"content-type":
            content_type = value.decode("latin-1")
        elif name == b"content-encoding":
            encoding = value.decode("latin-1")
        elif name == b"content-length":
            length = value.decode("latin-1")
        elif name == b"authorization":
            authorization = value.decode("latin-1")
    limit = ctx.settings.ingest.max_body_bytes

    async def read() -> tuple[bytes, int, str]:
        enc = check_headers(media_type(content_type), encoding, length, media_types=media_types,
                            max_bytes=limit)  # fmt: skip
        body = BoundedBody(enc, limit)
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Disconnected
            body.feed(message.get("body", b""))
            if not message.get("more_body", False):
                return body.finish(), body.received, enc

    try:
        job_scope = authorize(authorization, ctx.settings.auth, Role.INGEST)
        answer = await handler(ctx, read, job_scope)
    except Disconnected:
        return
    except FailslowError as exc:
        await error_problem(path, exc)(scope, receive, send)
        return
    except Exception as exc:  # noqa: BLE001 - a bug: answered as FastAPI's handler would
        await unexpected_problem("POST", path, exc)(scope, receive, send)
        return
    head: dict[str, Any] = {
        "type": "http.response.start", "status": 200,
        "headers": [_JSON, (b"content-length", str(len(answer)).encode())],
    }  # fmt: skip
    await send(head)
    await send({"type": "http.response.body", "body": answer})
