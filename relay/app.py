"""The relay's ASGI application (plain ASGI: nothing per request but what a relay must do).

* ``POST /v2/ingest``: the body is read (bounded; gzip undone), checked for its media type and
  handed to the :class:`~failslow.relay.batcher.Batcher`; the agent is answered with its own
  item of the bundle's answer.
* ``GET /relayz``: what the relay did (JSON); ``GET /metrics``: the same for Prometheus.
* Anything else (topology registrations, v1 envelopes, reads): passed to the service as it came
  (method, path, query, body and the headers that matter) and its answer passed back.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from failslow.relay.batcher import (
    PROBLEM,
    Answer,
    Batcher,
    Outcome,
    RelaySettings,
    passed_on,
    problem,
)
from failslow.wire import v2
from failslow.wire.body import BodyProblem, BoundedBody, check_headers, media_type

log = logging.getLogger(__name__)

Scope = dict[str, Any]
_FORWARDED = (b"authorization", b"content-type", b"content-encoding", b"accept", b"user-agent")


async def read_body(receive: Any, reader: BoundedBody) -> bytes | None:
    """The request's body through ``reader`` (the service's own checks, failslow.wire.body):
    ``None`` when the client went away; raises :class:`~failslow.wire.body.BodyProblem`."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        reader.feed(message.get("body", b""))
        if not message.get("more_body", False):
            return reader.finish()


class Metrics:
    def __init__(self, counters: Any) -> None:
        self.registry = CollectorRegistry()
        bodies = Counter("failslow_relay_bodies", "v2 bodies answered, by outcome",
                         ["outcome"], registry=self.registry)  # fmt: skip
        self.bodies = {o: bodies.labels(o.value) for o in Outcome}
        self.bundle_bodies = Histogram(
            "failslow_relay_bundle_bodies", "Bodies per bundle sent to the service",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=self.registry,
        )  # fmt: skip
        self.bundle_seconds = Histogram(
            "failslow_relay_bundle_seconds", "Time from sending a bundle to the service's answer",
            registry=self.registry,
        )  # fmt: skip
        queued = Gauge("failslow_relay_queued_bytes", "Bodies' bytes waiting or in flight",
                       registry=self.registry)  # fmt: skip
        queued.set_function(lambda: counters.queued_bytes)

    def bundle(self, n: int, seconds: float) -> None:
        self.bundle_bodies.observe(n)
        self.bundle_seconds.observe(seconds)


class RelayApp:
    def __init__(self, settings: RelaySettings, transport: httpx.AsyncBaseTransport | None = None):
        self.settings = settings
        self._transport = transport  # tests: the service in process
        self.client: httpx.AsyncClient | None = None
        self.batcher: Batcher | None = None
        self.metrics: Metrics | None = None

    async def start(self) -> None:
        s = self.settings
        # Bundles and passed-through requests have connections of their own, so that a job's
        # start (every agent registering at once) never holds up bundles. Passed-through
        # requests queue on a semaphore for one of max_passthrough connections, as long as it
        # takes (the agent's own timeout bounds the wait): httpcore's pool rescans every waiting
        # request whenever a connection frees, which with 6,400 registrations waiting spun a
        # relay at 100% CPU for minutes. The service answers a registration once it is stored,
        # by a group commit at most every 0.1 s under load, so the connections bound how many
        # registrations a commit answers (12,800 hosts through two relays on 2 shared cores:
        # 84 s with 8 connections each, 78 s with 64; the rest is HTTP's CPU).
        timeout = httpx.Timeout(s.timeout_s, pool=None)
        self._proxy_slots = asyncio.Semaphore(s.max_passthrough)

        def client(n: int) -> httpx.AsyncClient:
            limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
            return httpx.AsyncClient(timeout=timeout, limits=limits, transport=self._transport)

        self.client = client(s.max_passthrough)
        self.batcher = Batcher(s, client(s.max_in_flight))
        self.metrics = Metrics(self.batcher.counters)
        self.batcher.on_bundle = self.metrics.bundle

    async def stop(self) -> None:
        if self.batcher is not None:
            await self.batcher.drain(self.settings.timeout_s)
            await self.batcher.client.aclose()
        if self.client is not None:
            await self.client.aclose()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if self.batcher is None:  # run without lifespan events (an ASGI server told not to)
            await self.start()
        method, path = scope["method"], scope["path"]
        if method == "POST" and path == "/v2/ingest":
            answer = await self._ingest(scope, receive)
            if answer is not None:
                self.batcher.counters.bodies[answer.outcome] += 1
                self.metrics.bodies[answer.outcome].inc()  # type: ignore[union-attr]
        elif method == "GET" and path == "/relayz":
            answer = Answer(200, orjson.dumps(self.status()))
        elif method == "GET" and path == "/metrics":
            assert self.metrics is not None
            answer = Answer(200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST)
        else:
            answer = await self._proxy(scope, receive)
        if answer is not None:
            await _respond(send, answer)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def status(self) -> dict[str, Any]:
        assert self.batcher is not None
        c = self.batcher.counters
        return {"upstream": self.settings.upstream, "bundles": c.bundles, "splits": c.splits,
                "alone": c.alone,
                "bodies": {o.value: n for o, n in c.bodies.items()},
                "queued_bytes": c.queued_bytes, "in_flight": c.in_flight}  # fmt: skip

    async def _ingest(self, scope: Scope, receive: Any) -> Answer | None:
        """An agent's v2 body, checked as the service checks it (failslow.wire.body: the same
        statuses, problem types and details), then bundled."""
        assert self.batcher is not None
        s = self.settings
        headers = dict(scope["headers"])
        try:
            encoding = check_headers(
                media_type(headers.get(b"content-type", b"").decode("latin-1")),
                headers.get(b"content-encoding", b"identity").decode("latin-1"),
                _header(headers, b"content-length"),
                media_types=(v2.MEDIA_TYPE,), max_bytes=s.max_body_bytes,
            )  # fmt: skip
            body = await read_body(receive, BoundedBody(encoding, s.max_body_bytes))
        except BodyProblem as exc:
            return problem(exc.status, exc.slug, exc.title, str(exc), None, Outcome.REFUSED)
        if body is None:
            return None
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        return await self.batcher.submit(authorization, body)

    async def _proxy(self, scope: Scope, receive: Any) -> Answer | None:
        assert self.client is not None
        s = self.settings
        try:  # passed on as it came (the service decompresses and checks it)
            body = await read_body(receive, BoundedBody("identity", s.max_body_bytes))
        except BodyProblem as exc:
            return problem(exc.status, exc.slug, exc.title, str(exc), None, Outcome.REFUSED)
        if body is None:
            return None
        url = s.upstream.rstrip("/") + scope["path"]
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
                   if k in _FORWARDED]  # fmt: skip
        try:
            async with self._proxy_slots:
                resp = await self.client.request(scope["method"], url, content=body,
                                                 headers=headers)  # fmt: skip
        except httpx.HTTPError as exc:
            return problem(503, "unavailable", "Service unavailable",
                           f"the service did not answer: {type(exc).__name__}",
                           s.retry_after_s, Outcome.UNREACHABLE)  # fmt: skip
        return passed_on(resp, "application/octet-stream", Outcome.ACCEPTED)


def _header(headers: dict[bytes, bytes], name: bytes) -> str | None:
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")


async def _respond(send: Any, answer: Answer) -> None:
    headers = [(b"content-type", answer.content_type.encode("latin-1")),
               (b"content-length", str(len(answer.body)).encode())]  # fmt: skip
    if answer.retry_after_s is not None:
        headers.append((b"retry-after", str(answer.retry_after_s).encode()))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})


__all__ = ["PROBLEM", "RelayApp", "RelaySettings", "read_body"]
