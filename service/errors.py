"""Domain errors and their one mapping to ``application/problem+json`` (RFC 9457)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from failslow.service.stream.registry import RegistryFull

log = logging.getLogger(__name__)
PROBLEM = "application/problem+json"
TYPE_BASE = "https://failslow.dev/problems/"


class FailslowError(Exception):
    """Base of every error the API reports on purpose."""

    status = 500
    slug = "internal"
    title = "Internal error"

    def __init__(
        self,
        detail: str,
        *,
        errors: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors
        self.headers = headers


class InvalidEnvelope(FailslowError):
    status = 400
    slug = "invalid-envelope"
    title = "Invalid envelope"


class UnsupportedMediaType(FailslowError):
    status = 415
    slug = "unsupported-media-type"
    title = "Unsupported media type"


class PayloadTooLarge(FailslowError):
    status = 413
    slug = "payload-too-large"
    title = "Payload too large"


class Overloaded(FailslowError):
    status = 429
    slug = "overloaded"
    title = "Too many requests"


class Unauthorized(FailslowError):
    status = 401
    slug = "unauthorized"
    title = "Unauthorized"


class Forbidden(FailslowError):
    status = 403
    slug = "forbidden"
    title = "Forbidden"


class NotFound(FailslowError):
    status = 404
    slug = "not-found"
    title = "Not found"


class Conflict(FailslowError):
    status = 409
    slug = "conflict"
    title = "Conflict"


class UnknownTopology(FailslowError):
    """A v2 envelope names a topology its host has not registered (or the service forgot it, e.g.
    after a restart): the agent registers again and re-sends."""

    status = 409
    slug = "unknown-topology"
    title = "Unknown topology"


class InvalidTopology(FailslowError):
    status = 422
    slug = "invalid-topology"
    title = "Invalid topology"


class InvalidRequest(FailslowError):
    """A well-formed request whose values cannot be accepted (a 422 with the reason)."""

    status = 422
    slug = "invalid-request"
    title = "Invalid request"


class NotOwner(FailslowError):
    """With a bus, a request that only the job's owning replica can serve (docs/replicas.md)."""

    status = 421
    slug = "not-owner"
    title = "Not the job's owner"


class Unavailable(FailslowError):
    status = 503
    slug = "unavailable"
    title = "Service unavailable"


def problem(
    status: int,
    slug: str,
    title: str,
    detail: str,
    *,
    instance: str | None = None,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> JSONResponse:
    body = problem_fields(status, slug, title, detail, errors=errors, extra=extra)
    if instance:
        body["instance"] = instance
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def problem_fields(
    status: int, slug: str, title: str, detail: str, *,
    errors: list[dict[str, Any]] | None = None, extra: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The fields of a problem+json body (without ``instance``)."""
    body: dict[str, Any] = {
        "type": TYPE_BASE + slug,
        "title": title,
        "status": status,
        "detail": detail,
        **(extra or {}),
    }
    if errors:
        body["errors"] = errors
    return body


def error_fields(exc: FailslowError) -> dict[str, Any]:
    """The problem fields of one of our own errors (without ``instance``)."""
    return problem_fields(exc.status, exc.slug, exc.title, exc.detail, errors=exc.errors)


def log_unexpected(what: str, exc: BaseException) -> str:
    """Log a bug with a new correlation id; the id, for the answer to carry."""
    correlation = uuid.uuid4().hex[:16]
    log.error("unhandled error on %s [correlation_id=%s]", what, correlation, exc_info=exc)
    return correlation


def unexpected_fields(correlation: str) -> dict[str, Any]:
    """The problem fields of the answer to a bug logged under ``correlation``."""
    return problem_fields(
        500, "internal", "Internal error",
        f"an unexpected error; the service log has it under correlation id {correlation}",
        extra={"correlation_id": correlation},
    )  # fmt: skip


def domain_problem(request: Request, exc: FailslowError) -> JSONResponse:
    """The problem+json answer to one of our own errors."""
    return error_problem(request.url.path, exc)


def unexpected_problem(method: str, path: str, exc: BaseException) -> JSONResponse:
    """The answer to a bug, not a client error: it carries an id that the log line carries
    too, so an operator can find the traceback from what a user reports."""
    correlation = log_unexpected(f"{method} {path}", exc)
    body = unexpected_fields(correlation) | {"instance": path}
    return JSONResponse(body, status_code=500, media_type=PROBLEM,
                        headers={"X-Correlation-Id": correlation})  # fmt: skip


def error_problem(path: str, exc: FailslowError) -> JSONResponse:
    """The problem+json answer to one of our own errors on ``path``."""
    return problem(exc.status, exc.slug, exc.title, exc.detail, instance=path,
                   errors=exc.errors, headers=exc.headers)  # fmt: skip


_STATUS_SLUGS = {
    400: ("bad-request", "Bad request"),
    401: ("unauthorized", "Unauthorized"),
    403: ("forbidden", "Forbidden"),
    404: ("not-found", "Not found"),
    405: ("method-not-allowed", "Method not allowed"),
    409: ("conflict", "Conflict"),
    413: ("payload-too-large", "Payload too large"),
    415: ("unsupported-media-type", "Unsupported media type"),
    422: ("validation-error", "Validation error"),
    429: ("overloaded", "Too many requests"),
    503: ("unavailable", "Service unavailable"),
}


def install_handlers(app: FastAPI) -> None:
    """Route every error path through :func:`problem`."""

    @app.exception_handler(FailslowError)
    async def _domain(request: Request, exc: FailslowError) -> JSONResponse:
        return domain_problem(request, exc)

    @app.exception_handler(RegistryFull)
    async def _full(request: Request, exc: RegistryFull) -> JSONResponse:
        return problem(
            429,
            "overloaded",
            "Too many requests",
            str(exc),
            instance=request.url.path,
            headers={"Retry-After": "5"},
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": ".".join(str(p) for p in err.get("loc", ())), "msg": err.get("msg", "")}
            for err in exc.errors()
        ]
        return problem(
            422,
            "validation-error",
            "Validation error",
            "the request parameters are invalid",
            instance=request.url.path,
            errors=errors,
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return unexpected_problem(request.method, request.url.path, exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        slug, title = _STATUS_SLUGS.get(exc.status_code, ("error", "Error"))
        return problem(
            exc.status_code,
            slug,
            title,
            str(exc.detail),
            instance=request.url.path,
            headers=getattr(exc, "headers", None),
        )
