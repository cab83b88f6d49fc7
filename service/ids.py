"""Identifiers: the pattern every external id matches (``job``, ``host``, ``comm``, ``agent``),
and the sortable unique ids failslow makes (ULID: 48-bit milliseconds + 80 random bits,
Crockford base32)."""

from __future__ import annotations

import os
import re
import time
from datetime import UTC, datetime

# The spec's identifier (api-v1.md): no ``/``, since ids appear in URL paths.
IDENTIFIER = r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$"
_IDENTIFIER = re.compile(IDENTIFIER.removeprefix("^").removesuffix("$"))


def is_identifier(value: object) -> bool:
    """Whether ``value`` is an identifier, the whole of it (a trailing newline is not)."""
    return isinstance(value, str) and _IDENTIFIER.fullmatch(value) is not None


_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid(now_ms: int | None = None) -> str:
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    value = (ms << 80) | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_id(prefix: str) -> str:
    return f"{prefix}_{ulid()}"


def rfc3339(ns: int | None) -> str | None:
    """A wall-clock time in nanoseconds as RFC 3339 UTC with milliseconds (None stays None)."""
    if ns is None:
        return None
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )
