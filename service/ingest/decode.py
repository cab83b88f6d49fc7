"""Reading an ingest body safely: content type, size limit, bounded gzip, JSON."""

from __future__ import annotations

import zlib
from typing import Any

import orjson
from starlette.requests import Request

from failslow.service.errors import InvalidEnvelope, PayloadTooLarge, UnsupportedMediaType

CHUNK = 64 * 1024


def _media_type(request: Request) -> str:
    return media_type(request.headers.get("content-type", ""))


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def check_headers(
    media: str, encoding: str, declared: str | None, *, media_types: tuple[str, ...],
    max_bytes: int,
) -> str:  # fmt: skip
    """The body's encoding (``identity`` or ``gzip``) from its headers; raise 4xx problems for
    a media type not in ``media_types``, another encoding, or a declared length over the
    limit."""
    if media not in media_types:
        wanted = " or ".join(media_types)
        raise UnsupportedMediaType(f"expected {wanted}, got {media or 'no content type'!r}")
    encoding = encoding.strip().lower() or "identity"
    if encoding not in ("identity", "gzip"):
        raise UnsupportedMediaType(f"unsupported content-encoding {encoding!r} (use gzip or none)")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"body of {declared} bytes exceeds the limit of {max_bytes}")
    return encoding


class BoundedBody:
    """A body read chunk by chunk, within ``max_bytes`` on the wire and after decompression:
    decompression is incremental and stops as soon as the output would pass the limit, so a
    gzip bomb costs at most ``max_bytes`` of memory."""

    def __init__(self, encoding: str, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        gzip = encoding == "gzip"
        self.inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS) if gzip else None
        self.out = bytearray()
        self.received = 0

    def feed(self, chunk: bytes) -> None:
        max_bytes, out = self.max_bytes, self.out
        self.received += len(chunk)
        if self.received > max_bytes:
            raise PayloadTooLarge(f"body exceeds the limit of {max_bytes} bytes")
        inflater = self.inflater
        if inflater is None:
            out += chunk
            return
        try:
            out += inflater.decompress(chunk, max_bytes + 1 - len(out))
            while inflater.unconsumed_tail and len(out) <= max_bytes:
                out += inflater.decompress(inflater.unconsumed_tail, max_bytes + 1 - len(out))
        except zlib.error as exc:
            raise InvalidEnvelope(f"bad gzip data: {exc}") from None
        if len(out) > max_bytes or inflater.unconsumed_tail:
            raise PayloadTooLarge(f"decompressed body exceeds the limit of {max_bytes} bytes")

    def finish(self) -> bytes:
        inflater, out = self.inflater, self.out
        if inflater is not None:
            try:
                out += inflater.flush()
            except zlib.error as exc:
                raise InvalidEnvelope(f"bad gzip data: {exc}") from None
            if not inflater.eof:
                raise InvalidEnvelope("bad gzip data: truncated stream")
            if inflater.unused_data:  # garbage, or a second gzip member: never ignored in silence
                raise InvalidEnvelope(
                    f"bad gzip data: {len(inflater.unused_data)} bytes after the end of the gzip "
                    "stream (send one gzip member per body)"
                )
            if len(out) > self.max_bytes:
                raise PayloadTooLarge(
                    f"decompressed body exceeds the limit of {self.max_bytes} bytes"
                )
        return bytes(out)


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
