"""Reading an ingest request's body: the one contract of the service and the relay.

Both take an agent's body through these checks in this order, with these limits and these
words (docs/hardening.md, issue 31): the media type and the encoding from the headers, a
declared length over the limit, then the body chunk by chunk — at most ``max_bytes`` on the
wire and after decompression (incremental, so a gzip bomb costs at most ``max_bytes``), a gzip
stream that is bad, truncated or followed by anything. The relay once stored gzip followed by
garbage that the service refused (400); running the same cases through both is
tests/relay/test_contract.py. Each problem carries the HTTP status, problem type and title that
both answer with.
"""

from __future__ import annotations

import zlib


class BodyProblem(ValueError):
    """A body refused whole; ``status``, ``slug`` and ``title`` as the problem answer says."""

    status = 400
    slug = "invalid-envelope"
    title = "Invalid envelope"


class BadBody(BodyProblem):
    pass


class TooLarge(BodyProblem):
    status = 413
    slug = "payload-too-large"
    title = "Payload too large"


class BadMediaType(BodyProblem):
    status = 415
    slug = "unsupported-media-type"
    title = "Unsupported media type"


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def check_headers(
    media: str, encoding: str, declared: str | None, *, media_types: tuple[str, ...],
    max_bytes: int,
) -> str:  # fmt: skip
    """The body's encoding (``identity`` or ``gzip``) from its headers; raises
    :class:`BadMediaType` for a media type not in ``media_types`` or another encoding,
    :class:`TooLarge` for a declared length over the limit."""
    if media not in media_types:
        wanted = " or ".join(media_types)
        raise BadMediaType(f"expected {wanted}, got {media or 'no content type'!r}")
    encoding = encoding.strip().lower() or "identity"
    if encoding not in ("identity", "gzip"):
        raise BadMediaType(f"unsupported content-encoding {encoding!r} (use gzip or none)")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise TooLarge(f"body of {declared} bytes exceeds the limit of {max_bytes}")
    return encoding


class BoundedBody:
    """A body read chunk by chunk (:meth:`feed`, then :meth:`finish`), within ``max_bytes`` on
    the wire and after decompression."""

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
            raise TooLarge(f"body exceeds the limit of {max_bytes} bytes")
        inflater = self.inflater
        if inflater is None:
            out += chunk
            return
        try:
            out += inflater.decompress(chunk, max_bytes + 1 - len(out))
            while inflater.unconsumed_tail and len(out) <= max_bytes:
                out += inflater.decompress(inflater.unconsumed_tail, max_bytes + 1 - len(out))
        except zlib.error as exc:
            raise BadBody(f"bad gzip data: {exc}") from None
        if len(out) > max_bytes or inflater.unconsumed_tail:
            raise TooLarge(f"decompressed body exceeds the limit of {max_bytes} bytes")

    def finish(self) -> bytes:
        inflater, out = self.inflater, self.out
        if inflater is not None:
            try:
                out += inflater.flush()
            except zlib.error as exc:
                raise BadBody(f"bad gzip data: {exc}") from None
            if not inflater.eof:
                raise BadBody("bad gzip data: truncated stream")
            if inflater.unused_data:  # garbage, or a second gzip member: never ignored in silence
                raise BadBody(
                    f"bad gzip data: {len(inflater.unused_data)} bytes after the end of the gzip "
                    "stream (send one gzip member per body)"
                )
            if len(out) > self.max_bytes:
                raise TooLarge(f"decompressed body exceeds the limit of {self.max_bytes} bytes")
        return bytes(out)
