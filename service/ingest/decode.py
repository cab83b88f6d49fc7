"""Reading an ingest body safely: content type, size limit, bounded gzip, JSON."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from starlette.requests import Request

from failslow.service.errors import (
    FailslowError,
    InvalidEnvelope,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from failslow.wire import body as wire_body
from failslow.wire.body import media_type

__all__ = ["BoundedBody", "check_headers", "media_type", "read_body", "read_json"]

CHUNK = 64 * 1024


def _media_type(request: Request) -> str:
    return media_type(request.headers.get("content-type", ""))


# the body's checks are the wire's, shared with the relay (failslow.wire.body); here their
# refusals become the service's problems (the same status, type, title and detail)
_PROBLEMS: dict[type[wire_body.BodyProblem], type[FailslowError]] = {
    wire_body.BadBody: InvalidEnvelope,
    wire_body.TooLarge: PayloadTooLarge,
    wire_body.BadMediaType: UnsupportedMediaType,
}


@contextmanager
def _as_problems() -> Iterator[None]:
    try:
        yield
    except wire_body.BodyProblem as exc:
        raise _PROBLEMS[type(exc)](str(exc)) from None


def check_headers(
    media: str, encoding: str, declared: str | None, *, media_types: tuple[str, ...],
    max_bytes: int,
) -> str:  # fmt: skip
    """:func:`failslow.wire.body.check_headers`, raising the service's problems."""
    with _as_problems():
        return wire_body.check_headers(media, encoding, declared, media_types=media_types,
                                  max_bytes=max_bytes)  # fmt: skip


class BoundedBody(wire_body.BoundedBody):
    """:class:`failslow.wire.body.BoundedBody`, raising the service's problems."""

    def feed(self, chunk: bytes) -> None:
        with _as_problems():
            super().feed(chunk)

    def finish(self) -> bytes:
        with _as_problems():
            return super().finish()


async def read_body(
    request: Request, *, media_types: tuple[str, ...], max_bytes: int
) -> tuple[bytes, int, str]:
    """Return ``(body, bytes on the wire, encoding)``; raise 4xx problems otherwise."""
    h = request.headers
    encoding = check_headers(
        _media_type(request), h.get("content-encoding", "identity"), h.get("content-length"),
        media_types=media_types, max_bytes=max_bytes,
    )  # fmt: skip
    body = BoundedBody(encoding, max_bytes)
    async for chunk in request.stream():
        body.feed(chunk)
    return body.finish(), body.received, encoding


def _is_json(media: str) -> bool:
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


async def read_json(request: Request, *, max_bytes: int) -> tuple[Any, int, str]:
    """Return ``(parsed JSON, bytes on the wire, encoding)``; raise 4xx problems otherwise."""
    parsed, _, received, encoding = await read_json_bytes(request, max_bytes=max_bytes)
    return parsed, received, encoding


async def read_json_bytes(request: Request, *, max_bytes: int) -> tuple[Any, bytes, int, str]:
    """Return ``(parsed JSON, the body decompressed, bytes on the wire, encoding)``."""
    media = _media_type(request)
    accepted = (media if _is_json(media) else "application/json",)
    body, received, encoding = await read_body(
        request, media_types=accepted, max_bytes=max_bytes
    )
    try:
        return orjson.loads(body), body, received, encoding
    except orjson.JSONDecodeError as exc:
        raise InvalidEnvelope(f"body is not valid JSON: {exc}") from None
