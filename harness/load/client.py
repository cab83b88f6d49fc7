"""A minimal HTTP/1.1 client on asyncio streams (keep-alive, one request in flight per
connection): a load generator must spend its CPU on the load, not on its client library."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit


class HttpError(RuntimeError):
    pass


class Connection:
    def __init__(self, url: str, token: str | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"an http:// URL is needed, not {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> Connection:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """One request; when the server had closed the idle connection (uvicorn does after its
        keep-alive timeout, 5 s), once more on a new one — as an agent's HTTP client does. Safe
        for ingest: a re-sent batch is recognised by its batch_seq."""
        try:
            return await self._request(method, path, body, headers)
        except (HttpError, ConnectionError):
            await self.close()
            return await self._request(method, path, body, headers)

    async def _request(
        self, method: str, path: str, body: bytes, headers: dict[str, str] | None
    ) -> tuple[int, bytes]:
        if self.writer is None or self.reader is None:
            await self.open()
        assert self.writer is not None and self.reader is not None
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Length: {len(body)}\r\n"
        ).encode()
        self.writer.write(head + self.auth + extra + b"\r\n" + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise HttpError("the connection was closed")
        status = int(status_line.split(b" ", 2)[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        payload = await self.reader.readexactly(length) if length else b""
        return status, payload

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self.writer.wait_closed()
            self.writer = self.reader = None
